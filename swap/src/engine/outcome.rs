//! What resolving one fault message did (shared by every layer of the
//! fault path, so none of them imports another for it).

use super::stats::FaultSource;

/// Outcome of handling one fault message.
pub(crate) enum Outcome {
    /// The faulting thread was woken; `Some` names what served the fault,
    /// `None` means nothing had to be restored (a message for a unit
    /// already resident, or an address outside guest RAM).
    Woken(Option<FaultSource>),
    /// The faulting thread stays blocked (fatal store error, or shutdown).
    Blocked,
}

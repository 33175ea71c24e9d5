//! Changing a running VM from outside: the control socket
//! (`hugevmm run --api-socket PATH`) and its client (`hugevmm ctl`).
//!
//! - [`command`]: the line protocol's commands and their parser.
//! - [`context`]: carrying a command out against the VM, JSON replies.
//! - [`server`]: the socket and the thread that serves it.
//! - [`client`]: `hugevmm ctl`.
//! - [`watch`]: `hugevmm ctl --watch` lines of rates.

pub mod client;
pub mod command;
pub mod context;
pub mod server;
pub mod watch;

pub use context::ControlContext;
pub use server::ControlSocket;

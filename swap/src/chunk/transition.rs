//! The transition table of the module docs, as code: every change the
//! engine makes to a unit's state word names one of these, and the table
//! says from which states (and flags) it may be taken and what it leads
//! to. Checked on every change in debug builds (the tests run them), and
//! walked whole by the tests below.
//!
//! # Split chunks
//!
//! A chunk is either *huge* (one state for all 2 MiB) or *split* (`Split`:
//! 512 pages with states of their own in [`super::PageTable`], whose
//! transitions are [`super::PageTransition`]). The chunk word changes mode
//! only through its owner: a fault thread that took the chunk to `Loading`
//! splits it (`FinishSplit`); a thread that merges a split chunk back takes
//! it to `Loading` (`BeginMerge`, after which it locks every page) and
//! publishes it huge (`FinishCollapse`), absent (`FinishMergeAbsent`), or
//! split again (`AbortMerge`). A split chunk's word keeps its store slot
//! (pages live at their offsets in it), given by the first page write
//! (`AssignSplitSlot`).

use super::state::{Tag, UnitState};

/// One named change of a unit's state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Absent → Loading: a fault thread zero-fills the unit.
    BeginZeroFill,
    /// Stored → Loading: a fault thread reads it from the store.
    BeginRead,
    /// Staged → Loading: a fault thread hands the parked content back
    /// (moved, or copied while its store write is in flight).
    BeginHandBack,
    /// Resident → Loading: a fault thread serves a fault on a resident
    /// unit (first write after a restore, or a stale message), owning it so
    /// that no evictor moves it meanwhile.
    BeginResidentFault,
    /// Loading → Resident: the owning fault thread installed the content.
    FinishRestore,
    /// Loading → Resident: the owning fault thread finished a fault on a
    /// resident unit (unprotected on a first write).
    EndResidentFault,
    /// Resident → Evicting: an evictor (or discard) takes the unit.
    BeginEvict,
    /// Evicting → Resident: the take-away did not happen (pinned pages,
    /// no parking slot while shutting down, a failed discard).
    AbortEvict,
    /// Evicting → Absent: the content was all zero.
    SettleZero,
    /// Evicting → Stored: clean, the store slot still holds it.
    SettleClean,
    /// Evicting → Staged: dirty, parked for writing.
    SettleDirty,
    /// Evicting → Absent: discarded (the guest freed it, balloon).
    SettleDiscarded,
    /// Staged → Staged+WRITING: its store write is submitted.
    BeginWrite,
    /// Staged+WRITING → Stored: the write completed.
    FinishWrite,
    /// Staged+WRITING → Staged: the write failed (fatal; content kept).
    FailWrite,
    /// Stored → Absent: discarded, the slot freed.
    DiscardStored,
    /// Absent/Resident/Stored → the same with PINNED: never evicted.
    Pin,
    /// Resident → Resident with the CLOCK bit changed.
    Reference,
    /// Loading/Evicting → the same with WAITERS: someone sleeps on it.
    AddWaiter,
    /// Loading → Split: the owner split the chunk into pages.
    FinishSplit,
    /// Split → Split with CLEAN: the chunk got the store slot its pages
    /// are written into.
    AssignSplitSlot,
    /// Split → Loading: a thread takes the chunk to merge it back.
    BeginMerge,
    /// Loading → Split: the merge was given up; pages as they were.
    AbortMerge,
    /// Loading → Resident: the pages were collapsed into one mapping.
    FinishCollapse,
    /// Loading → Absent: every page was absent (discarded or zero).
    FinishMergeAbsent,
}

/// A flag the from-state must have, or must not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Any,
    Writing,
    NotWriting,
    Clean,
    NotClean,
    NotPinned,
    Merging,
    NotMerging,
}

impl Need {
    fn holds(self, s: UnitState) -> bool {
        match self {
            Need::Any => true,
            Need::Writing => s.writing(),
            Need::NotWriting => !s.writing(),
            Need::Clean => s.clean(),
            Need::NotClean => !s.clean(),
            Need::NotPinned => !s.pinned(),
            Need::Merging => s.merging(),
            Need::NotMerging => !s.merging(),
        }
    }
}

/// `None` as the to-tag: the tag does not change.
struct Rule {
    from: &'static [Tag],
    need: Need,
    to: Option<Tag>,
}

/// A change of state word that the table does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal chunk state transition {transition:?}: {from:?} -> {to:?}")]
pub struct IllegalTransition {
    /// The transition named.
    pub transition: Transition,
    /// The state it was taken from.
    pub from: UnitState,
    /// The state it led to.
    pub to: UnitState,
}

impl Transition {
    /// Every transition, for the tests that walk the table.
    pub const ALL: [Transition; 25] = [
        Transition::BeginZeroFill,
        Transition::BeginRead,
        Transition::BeginHandBack,
        Transition::BeginResidentFault,
        Transition::FinishRestore,
        Transition::EndResidentFault,
        Transition::BeginEvict,
        Transition::AbortEvict,
        Transition::SettleZero,
        Transition::SettleClean,
        Transition::SettleDirty,
        Transition::SettleDiscarded,
        Transition::BeginWrite,
        Transition::FinishWrite,
        Transition::FailWrite,
        Transition::DiscardStored,
        Transition::Pin,
        Transition::Reference,
        Transition::AddWaiter,
        Transition::FinishSplit,
        Transition::AssignSplitSlot,
        Transition::BeginMerge,
        Transition::AbortMerge,
        Transition::FinishCollapse,
        Transition::FinishMergeAbsent,
    ];

    fn rule(self) -> Rule {
        use Tag::*;
        let rule = |from: &'static [Tag], need, to| Rule { from, need, to };
        match self {
            Transition::BeginZeroFill => rule(&[Absent], Need::Any, Some(Loading)),
            Transition::BeginRead => rule(&[Stored], Need::Any, Some(Loading)),
            Transition::BeginHandBack => rule(&[Staged], Need::Any, Some(Loading)),
            Transition::BeginResidentFault => rule(&[Resident], Need::Any, Some(Loading)),
            Transition::FinishRestore => rule(&[Loading], Need::NotMerging, Some(Resident)),
            Transition::EndResidentFault => rule(&[Loading], Need::NotMerging, Some(Resident)),
            Transition::BeginEvict => rule(&[Resident], Need::NotPinned, Some(Evicting)),
            Transition::AbortEvict => rule(&[Evicting], Need::Any, Some(Resident)),
            Transition::SettleZero => rule(&[Evicting], Need::Any, Some(Absent)),
            Transition::SettleClean => rule(&[Evicting], Need::Clean, Some(Stored)),
            Transition::SettleDirty => rule(&[Evicting], Need::Any, Some(Staged)),
            Transition::SettleDiscarded => rule(&[Evicting], Need::Any, Some(Absent)),
            Transition::BeginWrite => rule(&[Staged], Need::NotWriting, None),
            Transition::FinishWrite => rule(&[Staged], Need::Writing, Some(Stored)),
            Transition::FailWrite => rule(&[Staged], Need::Writing, None),
            Transition::DiscardStored => rule(&[Stored], Need::Any, Some(Absent)),
            Transition::Pin => rule(&[Absent, Resident, Stored], Need::Any, None),
            Transition::Reference => rule(&[Resident], Need::Any, None),
            Transition::AddWaiter => rule(&[Loading, Evicting], Need::Any, None),
            Transition::FinishSplit => rule(&[Loading], Need::NotMerging, Some(Split)),
            Transition::AssignSplitSlot => rule(&[Split], Need::NotClean, None),
            Transition::BeginMerge => rule(&[Split], Need::Any, Some(Loading)),
            Transition::AbortMerge => rule(&[Loading], Need::Merging, Some(Split)),
            Transition::FinishCollapse => rule(&[Loading], Need::Merging, Some(Resident)),
            Transition::FinishMergeAbsent => rule(&[Loading], Need::Merging, Some(Absent)),
        }
    }

    /// Whether this transition may be taken from `from`.
    pub fn allowed_from(self, from: UnitState) -> bool {
        let rule = self.rule();
        rule.from.contains(&from.tag()) && rule.need.holds(from)
    }

    /// The tag it leads to from `from`.
    pub fn to_tag(self, from: UnitState) -> Tag {
        self.rule().to.unwrap_or(from.tag())
    }

    /// Checks `from -> to` against the table (tag and flags that must
    /// change: WRITING for the write transitions, PINNED, WAITERS,
    /// MERGING for the merge's).
    pub fn check(self, from: UnitState, to: UnitState) -> Result<(), IllegalTransition> {
        let flags_ok = match self {
            Transition::BeginWrite => to.writing(),
            Transition::FailWrite => !to.writing(),
            Transition::Pin => to.pinned(),
            Transition::AddWaiter => to.waiters(),
            Transition::SettleClean => !to.writing(),
            Transition::AssignSplitSlot => to.clean(),
            Transition::BeginMerge => to.merging(),
            Transition::AbortMerge | Transition::FinishCollapse | Transition::FinishMergeAbsent => {
                !to.merging()
            }
            _ => true,
        };
        if self.allowed_from(from) && to.tag() == self.to_tag(from) && flags_ok {
            Ok(())
        } else {
            Err(IllegalTransition {
                transition: self,
                from,
                to,
            })
        }
    }

    /// The transition that takes a unit in `from` into `Loading` for a
    /// fault, or None if a fault must wait (in flight) instead or serve a
    /// page of a split chunk.
    pub fn for_fault(from: UnitState) -> Option<Transition> {
        match from.tag() {
            Tag::Absent => Some(Transition::BeginZeroFill),
            Tag::Stored => Some(Transition::BeginRead),
            Tag::Staged => Some(Transition::BeginHandBack),
            Tag::Resident => Some(Transition::BeginResidentFault),
            Tag::Loading | Tag::Evicting | Tag::Split => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGS: [Tag; 7] = [
        Tag::Absent,
        Tag::Resident,
        Tag::Staged,
        Tag::Stored,
        Tag::Loading,
        Tag::Evicting,
        Tag::Split,
    ];

    /// The module docs' table, written out independently of `rule()`:
    /// (transition, from tag, extra condition on the from-state, to tag).
    fn expected(t: Transition, from: UnitState) -> Option<Tag> {
        use Tag::*;
        let tag = from.tag();
        match (t, tag) {
            (Transition::BeginZeroFill, Absent) => Some(Loading),
            (Transition::BeginRead, Stored) => Some(Loading),
            (Transition::BeginHandBack, Staged) => Some(Loading),
            (Transition::BeginResidentFault, Resident) => Some(Loading),
            (Transition::FinishRestore | Transition::EndResidentFault, Loading)
                if !from.merging() =>
            {
                Some(Resident)
            }
            (Transition::BeginEvict, Resident) if !from.pinned() => Some(Evicting),
            (Transition::AbortEvict, Evicting) => Some(Resident),
            (Transition::SettleZero | Transition::SettleDiscarded, Evicting) => Some(Absent),
            (Transition::SettleClean, Evicting) if from.clean() => Some(Stored),
            (Transition::SettleDirty, Evicting) => Some(Staged),
            (Transition::BeginWrite, Staged) if !from.writing() => Some(Staged),
            (Transition::FinishWrite, Staged) if from.writing() => Some(Stored),
            (Transition::FailWrite, Staged) if from.writing() => Some(Staged),
            (Transition::DiscardStored, Stored) => Some(Absent),
            (Transition::Pin, Absent | Resident | Stored) => Some(tag),
            (Transition::Reference, Resident) => Some(Resident),
            (Transition::AddWaiter, Loading | Evicting) => Some(tag),
            (Transition::FinishSplit, Loading) if !from.merging() => Some(Split),
            (Transition::AssignSplitSlot, Split) if !from.clean() => Some(Split),
            (Transition::BeginMerge, Split) => Some(Loading),
            (Transition::AbortMerge, Loading) if from.merging() => Some(Split),
            (Transition::FinishCollapse, Loading) if from.merging() => Some(Resident),
            (Transition::FinishMergeAbsent, Loading) if from.merging() => Some(Absent),
            _ => None,
        }
    }

    /// Every tag with every combination of the flags the rules look at.
    fn all_states() -> Vec<UnitState> {
        let mut states = Vec::new();
        for tag in TAGS {
            for bits in 0..16u32 {
                states.push(
                    UnitState::ABSENT
                        .to(tag, 3)
                        .with_writing(bits & 1 != 0)
                        .with_clean(bits & 2 != 0)
                        .with_pinned(bits & 4 != 0)
                        .with_merging(bits & 8 != 0),
                );
            }
        }
        states
    }

    #[test]
    fn the_table_allows_exactly_the_documented_transitions() {
        let mut legal = 0;
        let mut illegal = 0;
        for t in Transition::ALL {
            for from in all_states() {
                let want = expected(t, from);
                assert_eq!(
                    t.allowed_from(from).then(|| t.to_tag(from)),
                    want,
                    "{t:?} from {from:?}"
                );
                for to_tag in TAGS {
                    let to = from
                        .to(to_tag, 9)
                        .with_writing(t == Transition::BeginWrite)
                        .with_pinned(from.pinned() || t == Transition::Pin)
                        .with_waiters(t == Transition::AddWaiter)
                        .with_clean(from.clean() || t == Transition::AssignSplitSlot)
                        .with_merging(match t {
                            Transition::BeginMerge => true,
                            Transition::AbortMerge
                            | Transition::FinishCollapse
                            | Transition::FinishMergeAbsent => false,
                            _ => from.merging(),
                        });
                    let ok = t.check(from, to).is_ok();
                    assert_eq!(ok, want == Some(to_tag), "{t:?}: {from:?} -> {to:?}");
                    if ok {
                        legal += 1;
                    } else {
                        illegal += 1;
                    }
                }
            }
        }
        // Each transition is legal from some state and illegal from most.
        assert!(legal > Transition::ALL.len(), "{legal}");
        assert!(illegal > 10 * legal, "{illegal} vs {legal}");
    }

    #[test]
    fn every_fault_starts_from_its_own_transition_and_in_flight_units_wait() {
        for from in all_states() {
            match Transition::for_fault(from) {
                Some(t) => assert_eq!(t.to_tag(from), Tag::Loading, "{from:?}"),
                None => assert!(
                    from.tag().in_flight() || from.tag() == Tag::Split,
                    "{from:?}"
                ),
            }
        }
    }

    #[test]
    fn a_write_transition_must_change_the_writing_flag() {
        let staged = UnitState::ABSENT.to(Tag::Staged, 1);
        assert!(Transition::BeginWrite.check(staged, staged).is_err());
        assert!(Transition::BeginWrite
            .check(staged, staged.with_writing(true))
            .is_ok());
        let writing = staged.with_writing(true);
        assert!(Transition::FailWrite.check(writing, writing).is_err());
        assert!(Transition::FailWrite.check(writing, staged).is_ok());
    }
}

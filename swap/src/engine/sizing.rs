//! `--mem-limit auto`: a controller that sizes the memory limit from the
//! guest's own stall ([`super::stall`]), in the manner of Meta's Senpai
//! (which drives cgroup limits from PSI): lower the limit while the
//! guest stalls less than a target share of the time, faster while the
//! cuts take only memory nobody wants back, and raise it fast when the
//! guest stalls more.
//!
//! The control law, applied once per period (half a second in the VMM):
//! - `s` is the share of the period the guest stalled on memory a higher
//!   limit would have kept (the VMM passes the waits on refaults, from
//!   the store, the parking area, pages of split chunks, and on units in
//!   flight, per vCPU: the share of vCPU time; a first touch's zero fill
//!   stalls whatever the limit, so it is left out), `p` the target share;
//! - `s > p`: the limit grows by a factor `1 + min(s/p - 1, 1)`, so a
//!   stall of twice the target or more doubles it within one period, and
//!   a stall just over the target adds a little (at least one unit); but
//!   only while the limit binds (what is resident is within an eighth of
//!   it, or four units: the background evictor keeps some headroom
//!   below the limit): below that the engine evicts nothing, and the
//!   stall is pages evicted earlier coming back, which a higher limit
//!   would not spare (measured on the phases payload: without this the
//!   limit went on to 512 MiB while 221 MiB were resident);
//! - where the period before cut the limit, a stall over `p` only undoes
//!   that cut: the limit goes back to where it stood before it. The cut
//!   evicted what the guest wanted; doubling would be the answer to a set
//!   that grew. Measured on the key-value payload, whose set is all of its
//!   heap: every probe below the set doubled the limit to the whole of
//!   guest RAM and held it there (7 raises in 26 s, a mean limit of
//!   394 MiB for a 262 MiB set, 2.7 % stall against a 2 % target). The
//!   period right after an undo raises nothing for its stall (unless the
//!   guest is growing): what the cut evicted is still faulting back in,
//!   into the room the undo gave it (without this, that stall doubled the
//!   limit a period after each undo);
//! - each undo in a row doubles the hold after it (`MAX_PROBE_BACKOFF`:
//!   3 periods, 6, 12, 24, at most 48), so probing a set that stays put
//!   costs less and less (with the undo alone key-value still stalled
//!   2.6 % against 2 %: a probe every 2.5 s). A quiet binding period at or
//!   below the limit the last undone cut went down to, or a raise no cut
//!   caused, ends the backoff: the guest's set changed;
//! - `s < p/2`: the limit shrinks by `LOWER_SHARE * (1 - 2s/p)` of itself
//!   (at least one unit): 4 % a period at no stall at all; and it comes
//!   down at once to the highest limit that binds with what is resident
//!   (what is resident and an eighth of the limit above it), if it stood
//!   higher: a limit over that evicts nothing, so it saves nothing and
//!   probing down to it would waste periods (it came down to a quarter
//!   above what is resident until the measurement below; from there the
//!   first cuts evicted nothing and the follow took two periods more);
//! - the cut speeds up while it finds only cold memory: a binding limit
//!   whose period stalled under `p/8` (`QUIET_SHARE`) took nothing the
//!   guest wanted back, and each such period in a row doubles the next
//!   cut, up to `MAX_CUT_DOUBLINGS` (4, 8, 16, 32 %); any stall above
//!   `p/8`, or a raise, starts again at 4 %. Why: a set that shrank
//!   leaves cold memory resident that nothing else can tell apart (no
//!   accessed bits), and at 4 % a period the limit took over 20 periods
//!   to let go of three quarters of it (measured on the phases payload:
//!   a 64 MiB set followed by a 16 MiB one, the limit 104 MiB six seconds
//!   into the smaller phase where 43 MiB would do). A cut that overshoots
//!   costs stall in the next period, which stops the speed-up and, above
//!   `p`, undoes the cut (above);
//! - for `HOLD_AFTER_RAISE` periods (1.5 s) after a raise it does not
//!   shrink at all: the working set the raise made room for faults back
//!   in over the next periods, and until then the guest holds less than
//!   it needs (measured on the phases payload: without the hold the limit
//!   alternated 70 / 140 MiB every second). 1.5 s rather than the 5 s it
//!   was with one-second periods: a set of 64 MiB faults back within a
//!   few hundred ms here, and with 2.5 s the phases payload's shrink was
//!   followed in 5.6 s in one run of three and not within its 7 s phase
//!   in the others. Ending the hold early, at a quiet period in which
//!   what is resident stayed put, was tried: the limit probed below the
//!   set every 7 s instead of every 12, and the run's stall went from 1.8
//!   to 3.5 % against a 2 % target;
//! - otherwise it holds: the band between `p/2` and `p` keeps the
//!   controller from probing for ever around the target.
//!
//! Growth: a guest that touches memory for the first time (zero fills,
//! which the stall leaves out) is growing, and what it holds says nothing
//! about what it is about to need. The run loop checks for growth ten
//! times a period ([`LimitController::on_growth`]): when the guest
//! first-touched at least [`growth_bytes`]'s worth since the last check
//! and the limit binds, the limit grows by what was first-touched, at
//! once, and holds as after any raise: each of those touches evicts
//! something to make room, which comes back as stall a period later, when
//! the stall's own raise would be too late. In a period with growth the
//! limit does not shrink, nor come down to what is resident. Why: measured
//! on the phases payload (`hugevmm bench self-sizing`), the guest held
//! 22 MiB for its first second, the limit came down from 512 MiB to
//! 28 MiB, and the payload then loaded its 256 MiB heap against that
//! limit within a period: the raises, doubling once per period with a
//! hold after each, took seven periods to catch up, and the run was 25 %
//! (7.6 to 42 %) slower than without a limit.
//!
//! The limit stays within `[min, max]`, in whole units. A lower limit
//! makes the engine evict in the background; that is how the controller
//! finds the working set: it lowers until the guest's faults cost stall,
//! then backs off. The asymmetry is the point: a limit that is too low
//! costs the guest time at once, one that is too high only memory.

/// The share of a period by which the limit shrinks when nothing stalls.
pub const LOWER_SHARE: f64 = 0.04;

/// Periods after a raise in which the limit does not shrink (more after
/// cuts undone in a row: [`MAX_PROBE_BACKOFF`]).
pub const HOLD_AFTER_RAISE: u32 = 3;

/// The stall share, as a part of the target, under which a period took
/// nothing the guest wanted back: an eighth.
pub const QUIET_SHARE: f64 = 0.125;

/// Undone cuts in a row after which the hold after an undo stops
/// doubling: 3 periods after the first, then 6, 12, 24, and at most 48
/// (24 s).
pub const MAX_PROBE_BACKOFF: u32 = 4;

/// Quiet binding periods in a row after which the cut stops doubling:
/// 4 % becomes at most 32 % a period.
pub const MAX_CUT_DOUBLINGS: u32 = 3;

/// First touches in one period from which the guest is growing: a
/// thirty-second of the limit (a guest that grows more slowly takes many
/// periods to fill the headroom the binding test allows, an eighth) or
/// one unit, whichever is more.
pub fn growth_bytes(limit_bytes: u64, unit_bytes: u64) -> u64 {
    (limit_bytes / 32).max(unit_bytes)
}

/// Whether `limit_bytes` binds: what is resident is within an eighth of
/// it, or four units (the background evictor keeps some headroom below
/// the limit, so a binding limit never has all of it resident).
fn binds(limit_bytes: u64, resident_bytes: u64, unit_bytes: u64) -> bool {
    resident_bytes.saturating_add((limit_bytes / 8).max(4 * unit_bytes)) >= limit_bytes
}

/// The highest limit that binds with `resident_bytes` resident, in whole
/// units: what is resident plus the headroom [`binds`] allows, an
/// seventh of what is resident (an eighth of the limit) or four units.
fn binding_edge(resident_bytes: u64, unit_bytes: u64) -> u64 {
    (resident_bytes.saturating_mul(8) / 7).max(resident_bytes.saturating_add(4 * unit_bytes))
        / unit_bytes
        * unit_bytes
}

/// The controller's bounds and target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizingTarget {
    /// The stall share aimed for, in (0, 1): 0.02 is 2 % of the time.
    pub stall_share: f64,
    /// The smallest limit, bytes (whole units).
    pub min_bytes: u64,
    /// The largest limit, bytes (whole units).
    pub max_bytes: u64,
    /// The swap unit, bytes.
    pub unit_bytes: u64,
}

/// What one period decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// Keep the limit.
    Hold,
    /// A higher limit, bytes.
    Raise(u64),
    /// A lower limit, bytes.
    Lower(u64),
}

/// The controller's state between periods.
#[derive(Debug, Clone)]
pub struct LimitController {
    target: SizingTarget,
    /// The "some" stall and the clock, µs, and the first-touched bytes
    /// so far, at the last period's end.
    last: Option<(u64, u64, u64)>,
    /// The first-touched bytes at the last growth check.
    touched_at_check: Option<u64>,
    /// Periods left in which the limit may not shrink.
    hold_periods: u32,
    /// Quiet periods in a row at a binding limit: the doublings of the
    /// next cut (at most [`MAX_CUT_DOUBLINGS`]).
    quiet_cuts: u32,
    /// The limit before the last period's cut, if the last period cut it.
    cut_from_bytes: Option<u64>,
    /// Cuts undone in a row (see [`MAX_PROBE_BACKOFF`]).
    undos: u32,
    /// The limit the last undone cut went down to: a quiet period at or
    /// below it says the set has shrunk since, and ends the backoff.
    failed_at_bytes: Option<u64>,
    /// The last period undid a cut: this period's stall is what that cut
    /// evicted coming back, which the undo already made room for.
    after_undo: bool,
    raises: u64,
    lowers: u64,
}

impl LimitController {
    /// A controller for `target` (its bounds in whole units, `min <= max`).
    pub fn new(target: SizingTarget) -> LimitController {
        LimitController {
            target,
            last: None,
            touched_at_check: None,
            hold_periods: 0,
            quiet_cuts: 0,
            cut_from_bytes: None,
            undos: 0,
            failed_at_bytes: None,
            after_undo: false,
            raises: 0,
            lowers: 0,
        }
    }

    /// The target it was made with.
    pub fn target(&self) -> SizingTarget {
        self.target
    }

    /// Periods that raised and lowered the limit.
    pub fn moves(&self) -> (u64, u64) {
        (self.raises, self.lowers)
    }

    /// One period: the stall so far and the clock, both µs (any origin,
    /// monotonic), the limit now, the guest memory resident now, and the
    /// guest memory first touched so far (zero fills, bytes, monotonic);
    /// the first call only starts the period.
    pub fn decide(
        &mut self,
        some_us: u64,
        now_us: u64,
        limit_bytes: u64,
        resident_bytes: u64,
        first_touched_bytes: u64,
    ) -> Sizing {
        let Some((last_some_us, last_now_us, last_touched_bytes)) =
            self.last.replace((some_us, now_us, first_touched_bytes))
        else {
            return Sizing::Hold;
        };
        let period_us = now_us.saturating_sub(last_now_us);
        if period_us == 0 {
            return Sizing::Hold;
        }
        let share = (some_us.saturating_sub(last_some_us) as f64 / period_us as f64).min(1.0);
        let t = self.target;
        let unit = t.unit_bytes.max(1);
        let limit = limit_bytes.clamp(t.min_bytes, t.max_bytes);
        let binding = binds(limit, resident_bytes, unit);
        let grown_bytes = first_touched_bytes.saturating_sub(last_touched_bytes);
        let growing = grown_bytes >= growth_bytes(limit, unit);
        let quiet = share < t.stall_share * QUIET_SHARE;
        if !quiet {
            self.quiet_cuts = 0;
        } else if binding && self.failed_at_bytes.is_some_and(|f| limit <= f) {
            self.end_backoff();
        }
        let cut_from_bytes = self.cut_from_bytes.take();
        let after_undo = std::mem::take(&mut self.after_undo);
        let wanted = if share > t.stall_share && binding && after_undo && !growing {
            limit
        } else if share > t.stall_share && binding {
            let raised = match cut_from_bytes {
                // The stall came right after a cut: the cut's doing.
                Some(before) => before.max(limit + unit),
                None => {
                    let factor = 1.0 + (share / t.stall_share - 1.0).min(1.0);
                    ((limit as f64 * factor) as u64).max(limit + unit)
                }
            };
            if growing {
                raised.saturating_add(grown_bytes.next_multiple_of(unit))
            } else {
                raised
            }
        } else if share > t.stall_share || growing {
            limit
        } else if share < t.stall_share / 2.0 && self.hold_periods == 0 {
            let speed_up = if quiet && binding {
                let doublings = self.quiet_cuts;
                self.quiet_cuts = (self.quiet_cuts + 1).min(MAX_CUT_DOUBLINGS);
                f64::from(1u32 << doublings)
            } else {
                1.0
            };
            let cut = LOWER_SHARE * speed_up * (1.0 - 2.0 * share / t.stall_share);
            let cut_bytes = ((limit as f64 * cut) as u64).max(unit);
            limit
                .saturating_sub(cut_bytes)
                .min(binding_edge(resident_bytes, unit))
        } else {
            limit
        };
        self.hold_periods = self.hold_periods.saturating_sub(1);
        let sizing = self.settle(wanted, limit_bytes);
        match sizing {
            Sizing::Raise(_) if cut_from_bytes.is_some() => {
                self.after_undo = true;
                self.hold_periods = HOLD_AFTER_RAISE << self.undos;
                self.undos = (self.undos + 1).min(MAX_PROBE_BACKOFF);
                self.failed_at_bytes = Some(limit);
            }
            Sizing::Raise(_) => self.end_backoff(),
            Sizing::Lower(_) => self.cut_from_bytes = Some(limit_bytes),
            Sizing::Hold => {}
        }
        sizing
    }

    /// Ends the probe backoff: on a raise for stall or growth that no cut
    /// caused (the guest's set changed, and what the undone cuts said of
    /// it no longer holds), or on a quiet binding period at or below the
    /// level a cut failed at (the set shrank below it).
    fn end_backoff(&mut self) {
        self.undos = 0;
        self.failed_at_bytes = None;
    }

    /// A check for growth between periods: the limit now, the guest
    /// memory resident now, and the guest memory first touched so far
    /// (as [`LimitController::decide`] takes them). Raises a binding limit
    /// by what was first-touched since the last check, if that was at
    /// least [`growth_bytes`]; the first call only starts counting.
    pub fn on_growth(
        &mut self,
        limit_bytes: u64,
        resident_bytes: u64,
        first_touched_bytes: u64,
    ) -> Sizing {
        let Some(last_touched_bytes) = self.touched_at_check.replace(first_touched_bytes) else {
            return Sizing::Hold;
        };
        let t = self.target;
        let unit = t.unit_bytes.max(1);
        let limit = limit_bytes.clamp(t.min_bytes, t.max_bytes);
        let grown_bytes = first_touched_bytes.saturating_sub(last_touched_bytes);
        let binding = binds(limit, resident_bytes, unit);
        if grown_bytes < growth_bytes(limit, unit) || !binding {
            return Sizing::Hold;
        }
        let sizing = self.settle(
            limit.saturating_add(grown_bytes.next_multiple_of(unit)),
            limit_bytes,
        );
        if matches!(sizing, Sizing::Raise(_)) {
            self.end_backoff();
        }
        sizing
    }

    /// `wanted` in whole units within the bounds, against the limit now.
    fn settle(&mut self, wanted: u64, limit_bytes: u64) -> Sizing {
        let t = self.target;
        let unit = t.unit_bytes.max(1);
        let wanted = (wanted / unit * unit).clamp(t.min_bytes, t.max_bytes);
        if wanted > limit_bytes {
            self.hold_periods = HOLD_AFTER_RAISE;
            self.quiet_cuts = 0;
            self.raises += 1;
            Sizing::Raise(wanted)
        } else if wanted < limit_bytes {
            self.lowers += 1;
            Sizing::Lower(wanted)
        } else {
            Sizing::Hold
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn controller() -> LimitController {
        LimitController::new(SizingTarget {
            stall_share: 0.02,
            min_bytes: 32 * MIB,
            max_bytes: 1024 * MIB,
            unit_bytes: 2 * MIB,
        })
    }

    /// Drives `periods` one-second periods of `share` stall from `limit`.
    fn run(c: &mut LimitController, limit: &mut u64, share: f64, periods: u64, clock: &mut u64) {
        let mut some = c.last.map_or(0, |(s, _, _)| s);
        if c.last.is_none() {
            c.decide(some, *clock, *limit, u64::MAX, 0);
        }
        for _ in 0..periods {
            *clock += 1_000_000;
            some += (share * 1e6) as u64;
            match c.decide(some, *clock, *limit, u64::MAX, 0) {
                Sizing::Raise(l) | Sizing::Lower(l) => *limit = l,
                Sizing::Hold => {}
            }
        }
    }

    #[test]
    fn no_stall_lowers_the_limit_faster_each_quiet_period_down_to_the_minimum() {
        let (mut c, mut limit, mut clock) = (controller(), 1024 * MIB, 0);
        let mut cuts = Vec::new();
        for _ in 0..5 {
            let before = limit;
            run(&mut c, &mut limit, 0.0, 1, &mut clock);
            cuts.push((before - limit) * 100 / before);
        }
        assert_eq!(
            cuts,
            [4, 8, 16, 32, 32],
            "4 % of the limit, doubled per quiet period up to 32 %"
        );
        run(&mut c, &mut limit, 0.0, 200, &mut clock);
        assert_eq!(limit, 32 * MIB, "held at the minimum");
        assert_eq!(
            c.decide(u64::MAX / 2, clock + 1_000_000, limit, u64::MAX, 0),
            Sizing::Raise(64 * MIB),
            "a stall at once doubles it"
        );
    }

    #[test]
    fn a_limit_above_what_is_resident_comes_down_to_it_at_once() {
        let mut c = controller();
        assert_eq!(
            c.decide(0, 0, 1024 * MIB, 0, 0),
            Sizing::Hold,
            "starts the period"
        );
        assert_eq!(
            c.decide(0, 1_000_000, 1024 * MIB, 99 * MIB, 0),
            Sizing::Lower(112 * MIB),
            "down to the binding edge: an eighth of the limit above resident, in whole units"
        );
        assert_eq!(
            c.decide(0, 2_000_000, 1024 * MIB, 0, 0),
            Sizing::Lower(32 * MIB),
            "not below the minimum"
        );
        assert_eq!(
            c.decide(15_000, 3_000_000, 112 * MIB, 99 * MIB, 0),
            Sizing::Hold,
            "in the band: held, however much is resident"
        );
        assert_eq!(
            c.decide(515_000, 4_000_000, 112 * MIB, 90 * MIB, 0),
            Sizing::Hold,
            "stall, but a limit that does not bind: a raise would spare nothing"
        );
        assert_eq!(
            c.decide(1_015_000, 5_000_000, 112 * MIB, 99 * MIB, 0),
            Sizing::Raise(224 * MIB),
            "within an eighth of the limit: it binds"
        );
    }

    #[test]
    fn a_growing_guest_gets_room_for_its_growth_at_once_and_no_cut() {
        let mut c = controller();
        c.decide(0, 0, 512 * MIB, 50 * MIB, 0);
        assert_eq!(
            c.decide(0, 1_000_000, 512 * MIB, 50 * MIB, 180 * MIB),
            Sizing::Hold,
            "growing: neither the cut nor the fall to what is resident"
        );
        assert_eq!(
            c.decide(0, 2_000_000, 512 * MIB, 50 * MIB, 180 * MIB),
            Sizing::Lower(58 * MIB),
            "a period without growth: down to the binding edge"
        );
        assert_eq!(
            c.on_growth(58 * MIB, 56 * MIB, 180 * MIB),
            Sizing::Hold,
            "the first check starts counting"
        );
        assert_eq!(
            c.on_growth(58 * MIB, 56 * MIB, 181 * MIB),
            Sizing::Hold,
            "less than a unit is no growth"
        );
        assert_eq!(
            c.on_growth(58 * MIB, 56 * MIB, 261 * MIB),
            Sizing::Raise(138 * MIB),
            "growing against a binding limit: room for what was first-touched, at once"
        );
        assert_eq!(
            c.on_growth(138 * MIB, 40 * MIB, 301 * MIB),
            Sizing::Hold,
            "growing, but the limit does not bind"
        );
        assert_eq!(
            c.decide(0, 3_000_000, 138 * MIB, 40 * MIB, 301 * MIB),
            Sizing::Hold,
            "no cut in the periods after a raise"
        );
        assert_eq!(c.moves(), (1, 1));
        let mut c = controller();
        c.decide(0, 0, 64 * MIB, 62 * MIB, 0);
        assert_eq!(
            c.decide(100_000, 1_000_000, 64 * MIB, 62 * MIB, 30 * MIB),
            Sizing::Raise(158 * MIB),
            "stall and growth in one period: doubled, and the growth on top"
        );
        let mut c = controller();
        c.decide(0, 0, 256 * MIB, 100 * MIB, 0);
        assert_eq!(
            c.decide(0, 1_000_000, 256 * MIB, 240 * MIB, 6 * MIB),
            Sizing::Lower(244 * MIB),
            "less than a thirty-second of the limit is no growth"
        );
        assert_eq!(growth_bytes(256 * MIB, 2 * MIB), 8 * MIB);
        assert_eq!(growth_bytes(32 * MIB, 2 * MIB), 2 * MIB);
    }

    #[test]
    fn stall_over_the_target_raises_fast_and_the_band_holds() {
        let (mut c, mut limit, mut clock) = (controller(), 64 * MIB, 0);
        run(&mut c, &mut limit, 0.10, 1, &mut clock);
        assert_eq!(limit, 128 * MIB, "five times the target: doubled");
        run(&mut c, &mut limit, 0.03, 1, &mut clock);
        assert_eq!(limit, 192 * MIB, "1.5 times the target: half again");
        run(&mut c, &mut limit, 0.0201, 1, &mut clock);
        assert_eq!(limit, 194 * MIB, "just over: one unit");
        run(&mut c, &mut limit, 0.015, 10, &mut clock);
        assert_eq!(
            limit,
            194 * MIB,
            "between half the target and the target: held"
        );
        run(&mut c, &mut limit, 1.0, 10, &mut clock);
        assert_eq!(limit, 1024 * MIB, "held at the maximum");
        assert_eq!(c.moves(), (6, 0));
    }

    #[test]
    fn a_stall_over_an_eighth_of_the_target_ends_the_speed_up() {
        let (mut c, mut limit, mut clock) = (controller(), 1000 * MIB, 0);
        run(&mut c, &mut limit, 0.0, 3, &mut clock);
        assert_eq!(limit, 740 * MIB, "4, 8 and 16 %, in whole units");
        run(&mut c, &mut limit, 0.005, 1, &mut clock);
        assert_eq!(
            limit,
            724 * MIB,
            "a quarter of the target: (1 - 2/4) of 4 %"
        );
        run(&mut c, &mut limit, 0.0, 1, &mut clock);
        assert_eq!(limit, 694 * MIB, "quiet again: 4 %, not 32");
        let mut c = controller();
        c.decide(0, 0, 1000 * MIB, 10 * MIB, 0);
        assert_eq!(
            c.decide(0, 1_000_000, 1000 * MIB, 800 * MIB, 0),
            Sizing::Lower(914 * MIB),
            "a limit that does not bind: down to the edge"
        );
        assert_eq!(
            c.decide(0, 2_000_000, 914 * MIB, 850 * MIB, 0),
            Sizing::Lower(876 * MIB),
            "it evicted nothing, so its quiet told nothing: the first binding cut is 4 %"
        );
    }

    #[test]
    fn the_binding_edge_is_an_eighth_of_the_limit_or_four_units_above_resident() {
        for resident_mib in [0, 10, 50, 82, 99, 500] {
            let edge = binding_edge(resident_mib * MIB, 2 * MIB);
            assert!(
                binds(edge, resident_mib * MIB, 2 * MIB),
                "{resident_mib} MiB: the edge binds"
            );
            assert!(
                !binds(edge + 2 * MIB, resident_mib * MIB, 2 * MIB),
                "{resident_mib} MiB: a unit above it does not"
            );
        }
        assert_eq!(binding_edge(82 * MIB, 2 * MIB), 92 * MIB);
        assert_eq!(binding_edge(10 * MIB, 2 * MIB), 18 * MIB);
    }

    #[test]
    fn a_stall_right_after_a_cut_undoes_the_cut() {
        let mut c = controller();
        c.decide(0, 0, 288 * MIB, 262 * MIB, 0);
        assert_eq!(
            c.decide(0, 1_000_000, 288 * MIB, 262 * MIB, 0),
            Sizing::Lower(276 * MIB),
            "4 %"
        );
        assert_eq!(
            c.decide(0, 2_000_000, 276 * MIB, 262 * MIB, 0),
            Sizing::Lower(252 * MIB),
            "8 %"
        );
        assert_eq!(
            c.decide(200_000, 3_000_000, 252 * MIB, 250 * MIB, 0),
            Sizing::Raise(276 * MIB),
            "a stall of ten times the target right after the cut: back to 276, not 504"
        );
        assert_eq!(
            c.decide(300_000, 4_000_000, 276 * MIB, 262 * MIB, 0),
            Sizing::Hold,
            "the period after the undo: its stall is the cut's pages coming back, no raise"
        );
        for period in 5..4 + u64::from(HOLD_AFTER_RAISE) {
            assert_eq!(
                c.decide(300_000, period * 1_000_000, 276 * MIB, 262 * MIB, 0),
                Sizing::Hold,
                "held after the raise"
            );
        }
        assert_eq!(
            c.decide(300_000, 7_000_000, 276 * MIB, 262 * MIB, 0),
            Sizing::Lower(264 * MIB),
            "probing again"
        );
        assert_eq!(
            c.decide(400_000, 8_000_000, 264 * MIB, 262 * MIB, 0),
            Sizing::Raise(276 * MIB),
            "undone again"
        );
        for period in 9..9 + 2 * u64::from(HOLD_AFTER_RAISE) {
            assert_eq!(
                c.decide(400_000, period * 1_000_000, 276 * MIB, 262 * MIB, 0),
                Sizing::Hold,
                "a second undo in a row: held twice as long"
            );
        }
        let clock = (9 + 2 * u64::from(HOLD_AFTER_RAISE)) * 1_000_000;
        assert_eq!(
            c.decide(800_000, clock, 276 * MIB, 262 * MIB, 0),
            Sizing::Raise(552 * MIB),
            "a stall with no cut before it: doubled, and the backoff ends"
        );
        for period in 1..=u64::from(HOLD_AFTER_RAISE) {
            c.decide(800_000, clock + period * 1_000_000, 552 * MIB, 540 * MIB, 0);
        }
        assert_eq!(c.undos, 0);
    }

    #[test]
    fn after_a_raise_the_limit_holds_before_it_shrinks_again() {
        let (mut c, mut limit, mut clock) = (controller(), 64 * MIB, 0);
        run(&mut c, &mut limit, 0.10, 1, &mut clock);
        assert_eq!(limit, 128 * MIB);
        run(
            &mut c,
            &mut limit,
            0.0,
            u64::from(HOLD_AFTER_RAISE),
            &mut clock,
        );
        assert_eq!(limit, 128 * MIB, "no stall, but held");
        run(&mut c, &mut limit, 0.0, 1, &mut clock);
        assert_eq!(limit, 122 * MIB, "then 4 % a period");
    }
}

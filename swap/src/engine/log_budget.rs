//! Debug lines for decisions the engine takes thousands of times a second
//! (splits, collapses): the first [`FIRST_LINES`] of a kind are logged
//! one by one, then at most one line per [`SUMMARY_EVERY`], which says how
//! many went unlogged since the line before. So `HUGEVMM_LOG=debug` shows
//! what the policy does without a million lines per run, and costs one
//! relaxed load per decision when debug logging is off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Decisions of a kind logged one by one before lines are summarized.
pub(crate) const FIRST_LINES: u64 = 20;

/// Past the first lines, at most one line this often per kind.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(1);

/// The budget of one kind of debug line.
pub(crate) struct LogBudget {
    /// Events seen (logged or not).
    seen: AtomicU64,
    /// Events not logged since the last line.
    unlogged: AtomicU64,
    /// When the last summarized line was logged, in ms since [`epoch`] + 1
    /// (0: none yet).
    last_line_ms: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl LogBudget {
    /// An unused budget.
    pub(crate) const fn new() -> Self {
        Self {
            seen: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
            last_line_ms: AtomicU64::new(0),
        }
    }

    /// Logs `line()` at debug level if the budget allows; a summarized
    /// line ends with how many were left out before it.
    pub(crate) fn debug(&self, line: impl FnOnce() -> String) {
        if !log::log_enabled!(log::Level::Debug) {
            return;
        }
        if let Some(text) = self.admit(epoch().elapsed(), line) {
            log::debug!("{text}");
        }
    }

    /// The line to log at `now` (since the epoch), or None.
    fn admit(&self, now: Duration, line: impl FnOnce() -> String) -> Option<String> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if n < FIRST_LINES {
            return Some(line());
        }
        let now_ms = now.as_millis() as u64 + 1;
        let last = self.last_line_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms >= last + SUMMARY_EVERY.as_millis() as u64;
        if !due
            || self
                .last_line_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        Some(format!(
            "{} ({unlogged} more since the last such line; at most one a second after the first {FIRST_LINES})",
            line()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_lines_then_one_a_second_with_the_count_left_out() {
        let budget = LogBudget::new();
        let at = |ms| Duration::from_millis(ms);
        for i in 0..FIRST_LINES {
            assert_eq!(
                budget.admit(at(0), || format!("split {i}")),
                Some(format!("split {i}"))
            );
        }
        // The first past the budget is a summary line (none left out yet).
        let line = budget.admit(at(10), || "split a".into()).unwrap();
        assert!(line.starts_with("split a (0 more since"), "{line}");
        for _ in 0..1000 {
            assert_eq!(budget.admit(at(500), || unreachable!()), None);
        }
        let line = budget.admit(at(1011), || "split b".into()).unwrap();
        assert!(line.starts_with("split b (1000 more since"), "{line}");
        assert_eq!(budget.admit(at(1012), || unreachable!()), None);
    }
}

//! The status line of a long run: every few seconds, on a terminal, one
//! line on stderr with what the run is doing (resident memory, faults and
//! store I/O, with their rates since the previous line), so that a run of
//! a minute does not look hung. Off with `--quiet`, when stderr is not a
//! terminal (scripts, CI logs, the bench), and when a Linux guest's
//! console is on the terminal (the lines would land in its session).
//!
//! The run loop prints it (`vm::wait_for_the_end`), from the counters it
//! reads for `--stats-timeline` anyway: no thread of its own, so nothing
//! new under the seccomp filters.

use guestmem::{format_size, StageTwoPages};
use std::io::IsTerminal;
use std::time::{Duration, Instant};
use swap::engine::SwapStats;

/// How often the line is printed.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// Whether this run shows the status line: not with `--quiet`, only on a
/// terminal, and not over a Linux guest's console on that terminal.
pub fn wanted(quiet: bool, console_on_stdout: bool) -> bool {
    let stderr = std::io::stderr().is_terminal();
    let console_on_terminal = console_on_stdout && std::io::stdout().is_terminal();
    !quiet && stderr && !console_on_terminal
}

/// The figures of the previous line, for rates.
#[derive(Debug, Clone, Copy)]
struct Previous {
    elapsed: Duration,
    faults: u64,
    bytes_read: u64,
    bytes_written: u64,
}

/// The status line's schedule and what it last showed.
#[derive(Debug)]
pub struct Progress {
    interval: Duration,
    next_at: Instant,
    previous: Option<Previous>,
}

impl Progress {
    /// A line every `interval`, the first one `interval` after `started`.
    pub fn new(started: Instant, interval: Duration) -> Self {
        Self {
            interval,
            next_at: started + interval,
            previous: None,
        }
    }

    /// When the next line is due.
    pub fn next_at(&self) -> Instant {
        self.next_at
    }

    /// The line, if one is due at `now` (then the next is scheduled).
    pub fn due(
        &mut self,
        now: Instant,
        elapsed: Duration,
        swap: Option<&SwapStats>,
        stage2: Option<&StageTwoPages>,
    ) -> Option<String> {
        if now < self.next_at {
            return None;
        }
        // After a stall (a suspended process) the schedule restarts
        // instead of printing the missed lines at once.
        while self.next_at <= now {
            self.next_at += self.interval;
        }
        Some(self.line(elapsed, swap, stage2))
    }

    /// The status line for these figures (and the rates since the last).
    fn line(
        &mut self,
        elapsed: Duration,
        swap: Option<&SwapStats>,
        stage2: Option<&StageTwoPages>,
    ) -> String {
        let secs = elapsed.as_secs_f64();
        let Some(swap) = swap else {
            let maps = stage2.map_or_else(String::new, |s| {
                format!(
                    "; KVM stage-2 mappings: {} x 4K, {} x 2M, {} x 1G",
                    s.pages_4k, s.pages_2m, s.pages_1g
                )
            });
            return format!("hugevmm: {secs:.0} s: running{maps}");
        };
        let now = Previous {
            elapsed,
            faults: swap.faults.total,
            bytes_read: swap.bytes_read,
            bytes_written: swap.bytes_written,
        };
        let since = self.previous.replace(now).unwrap_or(Previous {
            elapsed: Duration::ZERO,
            faults: 0,
            bytes_read: 0,
            bytes_written: 0,
        });
        let span = (elapsed.saturating_sub(since.elapsed)).as_secs_f64();
        let per_s = |now: u64, then: u64| {
            if span > 0.0 {
                now.saturating_sub(then) as f64 / span
            } else {
                0.0
            }
        };
        let limit = swap.mem_limit_bytes.map_or_else(
            || " (no limit)".to_string(),
            |l| format!(" of {}", format_size(l)),
        );
        format!(
            "hugevmm: {secs:.0} s: resident {}{limit}, {} faults ({:.0}/s), store read {} ({}/s), written {} ({}/s)",
            format_size(swap.resident_bytes),
            swap.faults.total,
            per_s(now.faults, since.faults),
            format_size(swap.bytes_read),
            format_size(per_s(now.bytes_read, since.bytes_read) as u64),
            format_size(swap.bytes_written),
            format_size(per_s(now.bytes_written, since.bytes_written) as u64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn swap(faults: u64, read: u64, written: u64) -> SwapStats {
        let mut s = SwapStats::default();
        s.faults.total = faults;
        s.bytes_read = read;
        s.bytes_written = written;
        s.resident_bytes = 200 * MIB;
        s.mem_limit_bytes = Some(256 * MIB);
        s
    }

    #[test]
    fn a_line_every_interval_with_rates_since_the_last() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, INTERVAL);
        let s1 = swap(1000, 100 * MIB, 50 * MIB);
        assert_eq!(p.due(t0, Duration::ZERO, Some(&s1), None), None);
        assert_eq!(p.next_at(), t0 + INTERVAL);
        let line = p
            .due(t0 + INTERVAL, INTERVAL, Some(&s1), None)
            .expect("due after one interval");
        assert_eq!(
            line,
            "hugevmm: 5 s: resident 200 MiB of 256 MiB, 1000 faults (200/s), store read 100 MiB (20 MiB/s), written 50 MiB (10 MiB/s)"
        );
        assert_eq!(p.next_at(), t0 + 2 * INTERVAL);
        // Not again before the next interval.
        assert_eq!(p.due(t0 + INTERVAL, INTERVAL, Some(&s1), None), None);
        let s2 = swap(1500, 150 * MIB, 50 * MIB);
        let line = p
            .due(t0 + 2 * INTERVAL, 2 * INTERVAL, Some(&s2), None)
            .unwrap();
        assert!(
            line.contains("1500 faults (100/s)") && line.contains("read 150 MiB (10 MiB/s)"),
            "{line}"
        );
        assert!(line.contains("written 50 MiB (0 B/s)"), "{line}");
    }

    #[test]
    fn a_stall_does_not_print_the_missed_lines() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, INTERVAL);
        let late = t0 + 10 * INTERVAL;
        assert!(p.due(late, 10 * INTERVAL, None, None).is_some());
        assert!(p.due(late, 10 * INTERVAL, None, None).is_none());
        assert_eq!(p.next_at(), t0 + 11 * INTERVAL);
    }

    #[test]
    fn without_the_engine_the_mappings_are_shown() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0, INTERVAL);
        let stage2 = StageTwoPages {
            pages_4k: 5,
            pages_2m: 123,
            pages_1g: 0,
        };
        assert_eq!(
            p.due(t0 + INTERVAL, INTERVAL, None, Some(&stage2)).unwrap(),
            "hugevmm: 5 s: running; KVM stage-2 mappings: 5 x 4K, 123 x 2M, 0 x 1G"
        );
        let mut s = swap(0, 0, 0);
        s.mem_limit_bytes = None;
        let line = p
            .due(t0 + 2 * INTERVAL, 2 * INTERVAL, Some(&s), None)
            .unwrap();
        assert!(line.contains("resident 200 MiB (no limit)"), "{line}");
    }
}

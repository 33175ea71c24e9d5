//! Rate limits for messages a guest can trigger.
//!
//! A guest decides how often it touches an unknown port or breaks a virtio
//! device, so a message printed for each such event lets it fill the
//! host's log (20,000 random port accesses printed about 17,000 lines when
//! they were logged once per address, and a set of seen addresses grew
//! without bound). Each message kind gets a token bucket: [`BURST`]
//! messages at once, then one per [`REFILL`]; what the bucket refuses is
//! counted, and the run ends with one line of the counts ([`summary`]).
//!
//! The library crates mark a guest-triggered record by its log target:
//! `log::warn!(target: "guest::KIND", ...)` (see `logger.rs`); the VMM's
//! own guest-triggered messages call [`GuestLog::allow`] directly.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Messages of one kind printed back to back before the limit applies.
pub const BURST: u32 = 10;
/// Time that earns one more message of a kind.
pub const REFILL: Duration = Duration::from_secs(1);

/// One kind's bucket and what it refused.
#[derive(Debug)]
struct Bucket {
    tokens: u32,
    refilled: Instant,
    suppressed: u64,
}

/// Token buckets, one per message kind, and the counts of what they
/// refused.
#[derive(Debug, Default)]
pub struct GuestLog {
    kinds: Mutex<BTreeMap<&'static str, Bucket>>,
}

impl GuestLog {
    /// Whether a message of `kind` may be printed now; if not, it is
    /// counted as suppressed.
    pub fn allow(&self, kind: &'static str) -> bool {
        self.allow_at(kind, Instant::now())
    }

    fn allow_at(&self, kind: &'static str, now: Instant) -> bool {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = kinds.entry(kind).or_insert(Bucket {
            tokens: BURST,
            refilled: now,
            suppressed: 0,
        });
        let earned = now.saturating_duration_since(bucket.refilled).as_nanos() / REFILL.as_nanos();
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            bucket.tokens = bucket.tokens.saturating_add(earned).min(BURST);
            bucket.refilled = now;
        }
        if bucket.tokens > 0 {
            bucket.tokens -= 1;
            true
        } else {
            bucket.suppressed += 1;
            false
        }
    }

    /// Suppressed messages per kind, kinds in name order; kinds that lost
    /// nothing are left out.
    pub fn suppressed(&self) -> Vec<(&'static str, u64)> {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        kinds
            .iter()
            .filter(|(_, b)| b.suppressed > 0)
            .map(|(&k, b)| (k, b.suppressed))
            .collect()
    }
}

/// The process's limiter: the logger and the vCPU threads share it.
pub fn global() -> &'static GuestLog {
    static LOG: OnceLock<GuestLog> = OnceLock::new();
    LOG.get_or_init(GuestLog::default)
}

/// The end-of-run line, e.g. `hugevmm: guest-triggered messages
/// suppressed (at most 10 at once, then 1 per second per kind): unknown
/// I/O port 16990, virtio 3`; `None` when nothing was suppressed.
pub fn summary(log: &GuestLog) -> Option<String> {
    let counts = log.suppressed();
    if counts.is_empty() {
        return None;
    }
    let list: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    Some(format!(
        "hugevmm: guest-triggered messages suppressed (at most {BURST} at once, then 1 per {} s per kind): {}",
        REFILL.as_secs(),
        list.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_one_per_refill() {
        let log = GuestLog::default();
        let t0 = Instant::now();
        let passed = (0..1000).filter(|_| log.allow_at("port", t0)).count();
        assert_eq!(passed, BURST as usize);
        assert_eq!(log.suppressed(), [("port", 1000 - u64::from(BURST))]);
        // Half a period earns nothing, a whole one earns one message.
        assert!(!log.allow_at("port", t0 + REFILL / 2));
        assert!(log.allow_at("port", t0 + REFILL));
        assert!(!log.allow_at("port", t0 + REFILL));
        // A long quiet spell refills the burst, no more.
        let later = t0 + REFILL * 1000;
        let passed = (0..100).filter(|_| log.allow_at("port", later)).count();
        assert_eq!(passed, BURST as usize);
    }

    #[test]
    fn kinds_have_their_own_buckets() {
        let log = GuestLog::default();
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert!(log.allow_at("a", t0));
        }
        assert!(!log.allow_at("a", t0));
        assert!(log.allow_at("b", t0));
        assert_eq!(log.suppressed(), [("a", 1)]);
    }

    #[test]
    fn the_summary_names_each_kind_and_count() {
        let log = GuestLog::default();
        assert_eq!(summary(&log), None);
        let t0 = Instant::now();
        for _ in 0..BURST + 3 {
            log.allow_at("virtio", t0);
            log.allow_at("unknown I/O port", t0);
        }
        let line = summary(&log).unwrap();
        assert!(line.ends_with(": unknown I/O port 3, virtio 3"), "{line}");
    }
}

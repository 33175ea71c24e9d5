//! Latency histograms as the engine exports them (`[low_us, high_us, count]`
//! buckets), merged across runs, and small statistics over samples.

use serde_json::{json, Value};

/// A latency histogram read back from a run's stats: non-empty buckets
/// `(low_us, high_us_exclusive, count)` sorted by `low_us`, and the maximum.
#[derive(Debug, Clone, Default)]
pub struct Hist {
    /// Non-empty buckets, sorted.
    pub buckets: Vec<(u64, u64, u64)>,
    /// Largest value seen, µs.
    pub max_us: u64,
}

impl Hist {
    /// Parses `{count, ..., max, buckets: [[lo, hi, n], ...]}`.
    pub fn from_json(v: &Value) -> Hist {
        let mut buckets: Vec<(u64, u64, u64)> = v["buckets"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|b| Some((b[0].as_u64()?, b[1].as_u64()?, b[2].as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        buckets.sort_unstable();
        Hist {
            buckets,
            max_us: v["max"].as_u64().unwrap_or(0),
        }
    }

    /// Adds another histogram's counts (same bucket layout: the engine's).
    pub fn merge(&mut self, other: &Hist) {
        for &(lo, hi, n) in &other.buckets {
            match self.buckets.binary_search_by_key(&lo, |b| b.0) {
                Ok(i) => self.buckets[i].2 += n,
                Err(i) => self.buckets.insert(i, (lo, hi, n)),
            }
        }
        self.max_us = self.max_us.max(other.max_us);
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.2).sum()
    }

    /// The `q` quantile in µs, computed as the engine does: the upper edge
    /// of the bucket holding the rank, capped at the maximum. So a merged
    /// histogram gives the same answer as one run holding all the values.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(_, hi, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return hi.saturating_sub(1).min(self.max_us);
            }
        }
        self.max_us
    }

    /// The summary the tables and results.json use.
    pub fn summary_json(&self) -> Value {
        json!({
            "count": self.count(),
            "p50_us": self.quantile_us(0.5),
            "p90_us": self.quantile_us(0.9),
            "p99_us": self.quantile_us(0.99),
            "p999_us": self.quantile_us(0.999),
            "max_us": self.max_us,
            "buckets": self.buckets.iter().map(|b| json!([b.0, b.1, b.2])).collect::<Vec<_>>(),
        })
    }
}

/// Median of a sample (the mean of the middle two for an even count);
/// `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The `q` quantile of a sample (nearest rank); 0 when empty.
pub fn sample_quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// p50/p90/p99/max of a sample of µs values, as JSON.
pub fn sample_summary_json(values_us: &[f64]) -> Value {
    json!({
        "count": values_us.len(),
        "p50_us": sample_quantile(values_us, 0.5),
        "p90_us": sample_quantile(values_us, 0.9),
        "p99_us": sample_quantile(values_us, 0.99),
        "max_us": sample_quantile(values_us, 1.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_counts_and_quantiles_follow() {
        let mut a = Hist {
            buckets: vec![(10, 11, 5), (100, 112, 5)],
            max_us: 105,
        };
        let b = Hist {
            buckets: vec![(10, 11, 5), (1000, 1024, 1)],
            max_us: 1010,
        };
        a.merge(&b);
        assert_eq!(a.count(), 16);
        assert_eq!(
            a.buckets,
            vec![(10, 11, 10), (100, 112, 5), (1000, 1024, 1)]
        );
        assert_eq!(a.quantile_us(0.5), 10);
        assert_eq!(a.quantile_us(0.9), 111);
        assert_eq!(a.quantile_us(1.0), 1010);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(sample_quantile(&[1.0, 2.0, 3.0, 4.0], 0.99), 4.0);
    }

    #[test]
    fn parses_engine_json() {
        let v = json!({"count": 3, "max": 90, "buckets": [[64, 72, 2], [88, 96, 1]]});
        let h = Hist::from_json(&v);
        assert_eq!(h.count(), 3);
        assert_eq!(h.quantile_us(0.99), 90);
    }
}

//! `hugevmm ctl --watch SECONDS stats`: the `stats` replies turned into one
//! line of rates per interval, for watching an overcommitted guest live.

use serde_json::Value;

/// Column titles, aligned with [`line`].
pub const HEADER: &str = "   time_s  resident_MiB  limit_MiB  faults/s   store/s    zero/s   evict/s  read_MiB/s  write_MiB/s  p99_ms  max_ms  2M_maps";

const MIB: f64 = (1u64 << 20) as f64;

/// The line for `current`, with rates over the time since `previous` (or
/// since the VM started).
pub fn line(previous: Option<&Value>, current: &Value) -> String {
    let at = |v: &Value, path: &str| v.pointer(path).and_then(Value::as_f64);
    let now_s = at(current, "/elapsed_s").unwrap_or(0.0);
    let then_s = previous.and_then(|p| at(p, "/elapsed_s")).unwrap_or(0.0);
    let span_s = (now_s - then_s).max(1e-9);
    // A counter's rate over the interval; "-" without the swap engine.
    let rate = |path: &str, scale: f64| -> String {
        match at(current, path) {
            Some(now) => {
                let then = previous.and_then(|p| at(p, path)).unwrap_or(0.0);
                format!("{:.0}", (now - then).max(0.0) / scale / span_s)
            }
            None => "-".into(),
        }
    };
    let mib = |path: &str| at(current, path).map_or("-".into(), |b| format!("{:.0}", b / MIB));
    let ms = |path: &str| at(current, path).map_or("-".into(), |us| format!("{:.2}", us / 1e3));
    let limit = match current.pointer("/swap/mem_limit_bytes") {
        Some(Value::Null) => "none".into(),
        _ => mib("/swap/mem_limit_bytes"),
    };
    format!(
        "{now_s:>9.1} {:>13} {:>10} {:>9} {:>9} {:>9} {:>9} {:>11} {:>12} {:>7} {:>7} {:>8}",
        mib("/swap/resident_bytes"),
        limit,
        rate("/swap/faults/total", 1.0),
        rate("/swap/faults/store", 1.0),
        rate("/swap/faults/zero", 1.0),
        rate("/swap/evictions", 1.0),
        rate("/swap/bytes_read", MIB),
        rate("/swap/bytes_written", MIB),
        ms("/swap/fault_latency_us/p99"),
        ms("/swap/fault_latency_us/max"),
        at(current, "/kvm/pages_2m").map_or("-".into(), |n| format!("{n:.0}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(t_s: f64, faults: u64, read_bytes: u64) -> Value {
        json!({
            "elapsed_s": t_s,
            "kvm": { "pages_2m": 100 },
            "swap": {
                "resident_bytes": 64u64 << 20,
                "mem_limit_bytes": 64u64 << 20,
                "faults": { "total": faults, "store": faults / 2, "zero": 0 },
                "evictions": faults,
                "bytes_read": read_bytes,
                "bytes_written": 0,
                "fault_latency_us": { "p99": 2500, "max": 9000 },
            },
        })
    }

    #[test]
    fn rates_are_over_the_interval() {
        let first = sample(1.0, 100, 0);
        let second = sample(3.0, 500, 400 << 20);
        let cols: Vec<String> = line(Some(&first), &second)
            .split_whitespace()
            .map(String::from)
            .collect();
        let titles: Vec<&str> = HEADER.split_whitespace().collect();
        assert_eq!(cols.len(), titles.len());
        let col = |title: &str| cols[titles.iter().position(|t| *t == title).unwrap()].clone();
        assert_eq!(col("time_s"), "3.0");
        assert_eq!(col("resident_MiB"), "64");
        assert_eq!(col("faults/s"), "200");
        assert_eq!(col("store/s"), "100");
        assert_eq!(col("read_MiB/s"), "200");
        assert_eq!(col("p99_ms"), "2.50");
        assert_eq!(col("2M_maps"), "100");
    }

    #[test]
    fn without_the_swap_engine_swap_columns_are_dashes() {
        let cols = line(None, &json!({ "elapsed_s": 2.0 }));
        assert_eq!(cols.split_whitespace().filter(|c| *c == "-").count(), 11);
    }
}

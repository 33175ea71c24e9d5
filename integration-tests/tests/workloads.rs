//! The workload payloads (`kv`, `phases`) under the swap engine: small
//! heaps held well below their size on a file store, under each swap unit,
//! with every object and page checked by the payload.

use integration_tests::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);
const UNITS: [&str; 3] = ["auto", "2m", "4k"];

/// Runs `payload` with `args` on 2 vCPUs in a 128 MiB guest held to 24 MiB
/// (the least 2 vCPUs take) under `unit`, on a file store of its own.
fn overcommitted(payload: &str, args: &str, unit: &str) -> Run {
    let store = temp_path(&format!("{payload}-{unit}-store.img"));
    let spec = format!("file:{}", store.display());
    let run = hugevmm(
        &[
            "run",
            "--payload",
            payload,
            "--payload-args",
            args,
            "--vcpus",
            "2",
            "--mem",
            "128M",
            "--mem-limit",
            "24M",
            "--swap-unit",
            unit,
            "--swap-store",
            &spec,
        ],
        LIMIT,
    );
    let _ = std::fs::remove_file(&store);
    run
}

/// Faults served from the store: whole units and split chunks' pages.
fn store_faults(run: &Run) -> u64 {
    run.stat("/swap/faults/store") + run.stat("/swap/split/page_faults/store")
}

fn report(what: &str, unit: &str, run: &Run) {
    eprintln!(
        "{what} {unit}: elapsed={:.2}s store_faults={} page_store_faults={} evictions={} splits={} collapses={} flips={}",
        run.stats.as_ref().unwrap()["elapsed_s"].as_f64().unwrap_or(0.0),
        run.stat("/swap/faults/store"),
        run.stat("/swap/split/page_faults/store"),
        run.stat("/swap/evictions"),
        run.stat("/swap/split/splits"),
        run.stat("/swap/split/collapses_verified"),
        run.stat("/swap/split/flips"),
    );
}

/// A 64 MiB heap of objects in 24 MiB: the load and the final check go
/// through the store, and every read and the final check pass.
#[test]
fn kv_under_each_unit_reads_back_every_object() {
    if skip_without_kvm("kv_under_each_unit_reads_back_every_object") {
        return;
    }
    for unit in UNITS {
        let run = overcommitted("kv", "heap=64M ops=4000", unit);
        run.expect_status(0);
        report("kv", unit, &run);
        let lines: Vec<_> = run
            .stdout
            .lines()
            .filter(|l| l.starts_with("kv vcpu=") && l.ends_with(" ok"))
            .collect();
        assert_eq!(lines.len(), 2, "{unit}: {}", run.stdout);
        assert!(store_faults(&run) > 0, "{unit}: the store was not read");
        assert!(
            run.stat("/swap/resident_bytes_max") <= 24 << 20,
            "{unit}: limit exceeded"
        );
    }
}

/// Hot sets of 6 and 24 MiB and a scattered one in a 96 MiB heap held to
/// 24 MiB: pages leave and come back between phases, and every touch and
/// every phase's sweep pass.
#[test]
fn phases_under_each_unit_checks_every_phase() {
    if skip_without_kvm("phases_under_each_unit_checks_every_phase") {
        return;
    }
    for unit in UNITS {
        let run = overcommitted("phases", "heap=96M ops=2000", unit);
        run.expect_status(0);
        report("phases", unit, &run);
        for vcpu in 0..2 {
            let prefix = format!("phases vcpu={vcpu} ");
            let phases = run
                .stdout
                .lines()
                .filter(|l| l.starts_with(&format!("{prefix}phase=")))
                .count();
            assert_eq!(phases, 6, "{unit}: {}", run.stdout);
            assert!(
                run.stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("{prefix}phases=6 ")) && l.ends_with(" ok")),
                "{unit}: {}",
                run.stdout
            );
        }
        assert!(store_faults(&run) > 0, "{unit}: the store was not read");
    }
}

/// The checks can fail under the engine too: an update vCPU 0 loses on
/// purpose (`lose=1`) is reported with the version the table expects and
/// the older one the object still holds, and the run exits 1.
#[test]
fn kv_reports_a_lost_update_while_swapping() {
    if skip_without_kvm("kv_reports_a_lost_update_while_swapping") {
        return;
    }
    let run = overcommitted("kv", "heap=64M ops=20000 lose=1", "auto");
    run.expect_status(1);
    let mismatch = run
        .stdout
        .lines()
        .find(|l| l.starts_with("kv: MISMATCH vcpu=0 "))
        .unwrap_or_else(|| panic!("no mismatch reported: {}", run.stdout));
    let field = |key: &str| -> u64 {
        mismatch
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key}= in {mismatch}"))
    };
    assert_eq!(
        field("expected_version"),
        field("found_version") + 1,
        "{mismatch}"
    );
    assert_eq!(run.stats.as_ref().unwrap()["exit_kind"], "payload");
}

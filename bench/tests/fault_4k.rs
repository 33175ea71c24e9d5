//! The `fault-4k` suite end to end in its tiny plan (one round, one-second
//! windows): every row of the breakdown is there with a positive median
//! and a p99 no smaller, the per-fault table has its figures for the
//! 1-vCPU run, and the kernel part leaves no swap file and no cgroup
//! behind. It asserts no times. It needs KVM, a userfaultfd and the
//! `hugevmm` beside the test's `hugevmm-bench` (`cargo build -p vmm`, or
//! a binary named in HUGEVMM_BIN).

use std::path::Path;
use std::process::Command;
use test_resources::{skip, skip_without_kvm, Resource};

mod common;

const TEST: &str = "fault_4k_tiny_rows_are_present_and_positive";

/// Rows whose median must be positive: the guest-observed cost, the
/// engine's service and the rest for each VM variant, the bare round
/// trips and their steps, and the parts of the service and eviction.
const ROWS: [&str; 34] = [
    "guest_file_1v",
    "service_file_1v",
    "service_mean_file_1v",
    "remainder_file_1v",
    "guest_file_2v",
    "guest_wall_file_2v",
    "service_file_2v",
    "guest_file_2v_2t",
    "guest_wall_file_2v_2t",
    "service_file_2v_2t",
    "guest_lz4_1v",
    "service_lz4_1v",
    "remainder_lz4_1v",
    "guest_zero_1v",
    "service_zero_1v",
    "remainder_zero_1v",
    "rt_zeropage",
    "rt_copy",
    "rt_move",
    "rt_notify",
    "rt_read",
    "rt_install",
    "rt_wake",
    "read_file",
    "read_lz4",
    "copy",
    "move",
    "refill",
    "zeropage",
    "wake",
    "move_out",
    "write_1",
    "write_64_separate",
    "write_64_one",
];

#[test]
fn fault_4k_tiny_rows_are_present_and_positive() {
    if skip_without_kvm(TEST) {
        return;
    }
    if !Path::new("/dev/userfaultfd").exists() {
        skip(TEST, Resource::Kvm, "no /dev/userfaultfd");
        return;
    }
    let Some(bin) = common::hugevmm_or_skip(TEST) else {
        return;
    };
    let out = std::env::temp_dir().join(format!("hugevmm-bench-f4k-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let child = Command::new(env!("CARGO_BIN_EXE_hugevmm-bench"))
        .args(["fault-4k", "--quick", "--out"])
        .arg(&out)
        .args(["--store-dir", "/var/tmp"])
        .env("HUGEVMM_BIN", &bin)
        .env("HUGEVMM_BENCH_FAULT_4K_PLAN", "tiny")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run hugevmm-bench");
    let bench_pid = child.id();
    let result = child.wait_with_output().expect("wait for hugevmm-bench");
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        result.status.success(),
        "fault-4k failed: {}\n{stderr}\n{stdout}",
        result.status
    );
    assert!(
        stdout.contains("fault-4k: where a 4 KiB store fault's time goes (us)")
            && stdout.contains("fault-4k: what one fault costs the hugevmm process"),
        "no tables on stdout:\n{stdout}"
    );
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json"),
    )
    .expect("results.json parses");
    let suite = &json["fault_4k"];
    assert_eq!(suite["plan"], "tiny", "{suite}");
    let rows = suite["rows"].as_array().expect("fault_4k.rows");
    let row = |key: &str| rows.iter().find(|r| r["key"] == key);
    for key in ROWS {
        let r = row(key).unwrap_or_else(|| panic!("no `{key}` row: {rows:?}"));
        let median = r["median_us"].as_f64().unwrap_or(f64::NAN);
        let p99 = r["p99_us"].as_f64().unwrap_or(f64::NAN);
        assert!(median > 0.0, "`{key}` median is not positive: {r}");
        assert!(p99 >= median, "`{key}` p99 below its median: {r}");
        assert!(
            r["n"].as_u64().unwrap_or(0) > 0,
            "`{key}` has no samples: {r}"
        );
    }
    // The guest waits at least as long as the engine serves.
    let median = |key: &str| {
        row(key)
            .and_then(|r| r["median_us"].as_f64())
            .unwrap_or(0.0)
    };
    assert!(median("guest_zero_1v") > median("service_zero_1v"));
    let skipped = json["skipped"].to_string();
    if !skipped.contains("kernel swap-in") {
        let r = row("kernel_swap_in").expect("a kernel_swap_in row when it was not skipped");
        assert!(r["median_us"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }

    let per_fault = suite["per_fault"].as_array().expect("fault_4k.per_fault");
    let one = per_fault
        .iter()
        .find(|v| v["variant"] == "file-1v")
        .expect("per-fault figures of file-1v");
    for metric in [
        "guest_wall_us",
        "cpu_us",
        "on_cpu_vcpu_us",
        "on_cpu_fault_us",
        "vcsw",
        "units_written",
    ] {
        let v = one["metrics"][metric]["median"].as_f64().unwrap_or(0.0);
        assert!(v > 0.0, "file-1v {metric} is not positive: {one}");
    }
    // The tables the docs publish are rendered from the file alone, and
    // say what the run printed.
    let rendered = bench::render::block(&json, "fault-4k").expect("the fault-4k block renders");
    for title in [
        "fault-4k: where a 4 KiB store fault's time goes (us)",
        "fault-4k: what one fault costs the hugevmm process",
    ] {
        assert!(rendered.contains(title), "no {title:?} in\n{rendered}");
    }
    let part = rows[0]["part"].as_str().expect("a part");
    assert!(
        stdout.contains(part) && rendered.contains(part),
        "the first row, {part:?}, is in the printed and the rendered tables"
    );
    let runs = suite["runs"].as_array().expect("fault_4k.runs");
    assert_eq!(runs.len(), 5, "one run per VM variant: {runs:?}");
    for run in runs {
        assert!(
            run["faults"]["served"].as_f64().unwrap_or(0.0) > 0.0,
            "{run}"
        );
    }

    let swap_file = Path::new("/var/tmp").join(format!("hugevmm-bench-swap-{bench_pid}.img"));
    assert!(!swap_file.exists(), "{} left behind", swap_file.display());
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    assert!(
        !swaps.contains(&format!("hugevmm-bench-swap-{bench_pid}")),
        "the bench's swap file is still on:\n{swaps}"
    );
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/memory"] {
        let cg = Path::new(root).join(format!("hugevmm-bench-f4k-{bench_pid}"));
        assert!(!cg.exists(), "cgroup {} left behind", cg.display());
    }
    let _ = std::fs::remove_dir_all(&out);
}

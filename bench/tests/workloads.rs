//! The `workloads` suite end to end on a tiny workload (one round of a
//! 64 MiB seqwrite): it prints a row per variant and the aims row, gives
//! the kernel runs auto's footprint (and more only after an OOM kill, up
//! the ladder of limits), and leaves no swap file
//! and no cgroup behind. It asserts no times. It needs root, KVM, a
//! memory cgroup controller, mkswap/swapon and the release `hugevmm`
//! beside the test's `hugevmm-bench` (`cargo build --release -p vmm`; a
//! debug binary works too, named in HUGEVMM_BIN).

use std::path::{Path, PathBuf};
use std::process::Command;
use test_resources::{skip, skip_without_kvm, Resource};

mod common;

const TEST: &str = "workloads_tiny_rows_and_cleanup";

/// Every cgroup directory of the suite under the memory controller.
fn suite_cgroups() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/memory"] {
        if let Ok(entries) = std::fs::read_dir(root) {
            for e in entries.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with("hugevmm-bench-")
                {
                    found.push(e.path());
                }
            }
        }
    }
    found
}

fn swapon_show() -> String {
    let out = Command::new("swapon")
        .args(["--show", "--noheadings"])
        .output()
        .expect("run swapon --show");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The bench's swap files among `swapon --show`'s lines.
fn bench_swap_files(show: &str) -> Vec<String> {
    show.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|f| f.contains("hugevmm-bench-swap-"))
        .map(str::to_string)
        .collect()
}

/// The bench's swap files in the store directory.
fn swap_files_in_store() -> Vec<PathBuf> {
    std::fs::read_dir("/var/tmp")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("hugevmm-bench-swap-")
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Why the host cannot run the suite, if it cannot.
fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (cgroups, swapon)".into());
    }
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"));
    let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    if !v1 && !v2 {
        return Some("no memory cgroup controller (v1 or v2)".into());
    }
    if !test_resources::have_program("swapon") || !test_resources::have_program("mkswap") {
        return Some("mkswap/swapon (util-linux) not found".into());
    }
    None
}

#[test]
fn workloads_tiny_rows_and_cleanup() {
    if skip_without_kvm(TEST) {
        return;
    }
    if let Some(why) = missing() {
        skip(TEST, Resource::MemcgSwap, why);
        return;
    }
    let Some(bin) = common::hugevmm_or_skip(TEST) else {
        return;
    };
    let swaps_before = swapon_show();
    let cgroups_before = suite_cgroups();
    let files_before = swap_files_in_store();
    let common::TinyRun { stdout, json, out } =
        common::run_tiny("workloads", "HUGEVMM_BENCH_WORKLOADS_PLAN", &bin, "kswap");
    common::assert_rows(
        &stdout,
        &[
            "hugevmm auto",
            "hugevmm 2m",
            "hugevmm 4k",
            "kernel, thp",
            "kernel, 4k",
            "seqwrite (tiny)",
        ],
    );
    let runs = json["workloads"]["workloads"][0]["runs"]
        .as_array()
        .expect("workloads.workloads[0].runs");
    assert!(runs.len() >= 5, "{runs:?}");
    let engine = &runs[0];
    assert_eq!(engine["variant"], "auto");
    for (run, unit) in runs[1..3].iter().zip(["2m", "4k"]) {
        assert_eq!(run["variant"], unit);
        assert_eq!(run["end"], "ok", "{run}");
        assert!(
            run["store_faults"].as_f64().unwrap_or(0.0) > 0.0,
            "the {unit} run used its store: {run}"
        );
    }
    assert_eq!(engine["end"], "ok", "{engine}");
    let footprint = engine["cgroup_peak_bytes"]
        .as_u64()
        .or(engine["rss_peak_bytes"].as_u64())
        .expect("engine footprint");
    assert!(footprint > 0);
    // Each kernel variant climbs the ladder of limits: it starts at auto's
    // footprint, runs again at a step after an OOM kill, and gets the next
    // step only after the step's second OOM kill.
    let ladder = [1.0, 1.25, 1.5, 2.0];
    let tries_per_step = 2;
    for variant in ["kernel-thp", "kernel-4k"] {
        let tries: Vec<&serde_json::Value> =
            runs.iter().filter(|r| r["variant"] == variant).collect();
        assert!(
            !tries.is_empty() && tries.len() <= ladder.len() * tries_per_step,
            "{variant}: {tries:?}"
        );
        for (i, run) in tries.iter().enumerate() {
            let headroom = ladder[i / tries_per_step];
            assert_eq!(run["headroom"].as_f64(), Some(headroom), "{run}");
            assert_eq!(
                run["limit_bytes"].as_u64(),
                Some(((footprint as f64 * headroom) as u64).div_ceil(4096) * 4096),
                "the kernel run gets {headroom}x auto's footprint: {run}"
            );
            let end = run["end"].as_str().unwrap_or("");
            if i + 1 < tries.len() {
                assert_eq!(end, "oom-killed", "only an OOM kill runs again: {run}");
            } else {
                assert!(["ok", "oom-killed", "timeout"].contains(&end), "{run}");
            }
        }
    }
    // Where a kernel run needed more room than auto's footprint and
    // swapped, auto ran once more with that room; nowhere else.
    let kernel_needed_room = runs.iter().any(|r| {
        r["variant"]
            .as_str()
            .is_some_and(|v| v.starts_with("kernel-"))
            && r["end"] == "ok"
            && r["headroom"].as_f64().unwrap_or(1.0) > 1.0
            && r["swap_outs"].as_u64().unwrap_or(0) > 0
    });
    let matched: Vec<&serde_json::Value> = runs
        .iter()
        .filter(|r| r["variant"] == "auto-matched")
        .collect();
    assert_eq!(
        matched.len(),
        usize::from(kernel_needed_room),
        "auto at the kernel's footprint: {matched:?}"
    );
    for run in &matched {
        assert!(
            run["headroom"].as_f64().unwrap_or(1.0) > 1.0
                && run["command"]
                    .as_str()
                    .unwrap_or("")
                    .contains("--swap-unit auto"),
            "{run}"
        );
    }
    // Only what this run added counts: another bench may be running.
    let swaps_after = bench_swap_files(&swapon_show());
    let swaps_new: Vec<&String> = swaps_after
        .iter()
        .filter(|s| !bench_swap_files(&swaps_before).contains(s))
        .collect();
    assert!(
        swaps_new.is_empty(),
        "a swap file of the bench is still on: {swaps_new:?}"
    );
    let left: Vec<PathBuf> = suite_cgroups()
        .into_iter()
        .filter(|c| !cgroups_before.contains(c))
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    let files_new: Vec<PathBuf> = swap_files_in_store()
        .into_iter()
        .filter(|f| !files_before.contains(f))
        .collect();
    assert!(files_new.is_empty(), "swap files left: {files_new:?}");
    let _ = std::fs::remove_dir_all(&out);
}

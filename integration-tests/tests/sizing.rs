//! `--mem-limit auto`: the limit sized from the guest's stall, on a
//! payload whose hot set grows, moves and shrinks (`phases`), and the
//! options' checks.

use integration_tests::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;

#[test]
fn auto_sizing_lowers_the_limit_and_raises_it_when_the_guest_stalls() {
    if skip_without_kvm("auto_sizing_lowers_the_limit_and_raises_it_when_the_guest_stalls") {
        return;
    }
    let timeline = temp_path("sizing-timeline.jsonl");
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "phases",
            "--vcpus",
            "2",
            "--mem",
            "512M",
            "--mem-limit",
            "auto",
            "--payload-args",
            "heap=256M ops=8000000",
            "--stats-timeline",
            timeline.to_str().unwrap(),
            "--stats-interval",
            "1000",
        ],
        Duration::from_secs(300),
    );
    let samples = std::fs::read_to_string(&timeline).unwrap_or_default();
    let _ = std::fs::remove_file(&timeline);
    run.expect_status(0);
    assert!(
        run.stdout.contains("phases vcpu=0 phases=6") && run.stdout.contains(" ok"),
        "every phase's pages were checked: {}",
        run.stdout
    );
    let (raises, lowers) = (
        run.stat("/mem_limit_auto/raises"),
        run.stat("/mem_limit_auto/lowers"),
    );
    let lowest = run.stat("/mem_limit_auto/lowest_bytes");
    let highest = run.stat("/mem_limit_auto/highest_bytes");
    eprintln!(
        "auto: {raises} raises, {lowers} lowers, limit {} to {} MiB, mean {} MiB; {}",
        lowest / MIB,
        highest / MIB,
        run.stat("/mem_limit_auto/mean_bytes") / MIB,
        run.stderr
            .lines()
            .filter(|l| l.contains("stall"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    assert_eq!(run.stat("/mem_limit_auto/max_bytes"), 512 * MIB);
    assert!(
        lowers >= 1 && lowest < 256 * MIB,
        "the limit came down: {lowers}, {lowest}"
    );
    assert!(
        raises >= 1,
        "the hot set outgrew the lowered limit and the limit followed: {}",
        run.stderr
    );
    let stats = run.stats.as_ref().unwrap();
    assert!(stats["mem_limit_auto"]["stopped"].is_null(), "{stats}");
    let limits: Vec<u64> = samples
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|s| s.pointer("/swap/mem_limit_bytes").and_then(|v| v.as_u64()))
        .collect();
    assert!(
        limits.windows(2).any(|w| w[1] > w[0]) && limits.iter().any(|&l| l < 256 * MIB),
        "the timeline shows the limit going down and back up: {limits:?}"
    );
    assert!(
        run.stat("/swap/stall/some_us") > 0,
        "the controller read a stall: {stats}"
    );
}

#[test]
fn auto_sizing_options_are_checked() {
    for (args, want) in [
        (
            vec!["--mem-limit", "64M", "--mem-limit-min", "32M"],
            "--mem-limit-min bounds --mem-limit auto",
        ),
        (vec!["--mem-limit", "auto=stall:99"], "0.1 to 50 percent"),
        (vec!["--mem-limit", "auto=often"], "auto=stall:PCT"),
        (
            vec![
                "--mem-limit",
                "auto",
                "--mem-limit-min",
                "96M",
                "--mem-limit-max",
                "64M",
            ],
            "is above --mem-limit-max",
        ),
        (
            vec!["--mem-limit", "auto", "--mem-limit-max", "3M"],
            "invalid --mem-limit-max",
        ),
    ] {
        let mut full = vec!["run", "--payload", "hello", "--mem", "128M"];
        full.extend_from_slice(&args);
        assert_refused(&full, want);
    }
}

/// A limit set through the API is the operator's: auto sizing stops and
/// leaves it, rather than undoing it within a second.
#[test]
fn a_limit_set_through_the_api_ends_auto_sizing() {
    if skip_without_kvm("a_limit_set_through_the_api_ends_auto_sizing") {
        return;
    }
    let (vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "verify",
        "--vcpus",
        "2",
        "--mem",
        "256M",
        "--mem-limit",
        "auto",
        "--payload-args",
        "passes=30",
    ]);
    let fixed_bytes = 96 * MIB;
    let reply = ctl(&socket, &["mem-limit", "96M"]);
    assert_eq!(reply["mem_limit_bytes"], fixed_bytes, "{reply}");
    // Two periods of the controller.
    std::thread::sleep(Duration::from_millis(2500));
    let stats = ctl(&socket, &["stats"]);
    assert_eq!(stats["swap"]["mem_limit_bytes"], fixed_bytes, "{stats}");
    let run = vm.finish(Duration::from_secs(300));
    run.expect_status(0);
    let stats = run.stats.as_ref().unwrap();
    assert_eq!(stats["swap"]["mem_limit_bytes"], fixed_bytes, "{stats}");
    let stopped = stats["mem_limit_auto"]["stopped"]
        .as_str()
        .unwrap_or_default();
    assert!(stopped.contains("PUT /mem-limit"), "{stats}");
    assert!(run.stderr.contains("auto sizing ends"), "{}", run.stderr);
}

/// Working-set sampling on a guest whose active set is known by
/// construction: the phases payload writes its whole heap once (`warm=1`),
/// so all of it is resident, then its one phase touches random pages of
/// the first sixteenth of it, and nothing else. The estimate is that
/// sixteenth plus the memory every payload uses (its code, stack and page
/// tables in the pinned first chunk, the generation table), not the heap
/// that was resident; the idle rest goes to the store. The run goes on
/// until the estimate rests on 400 samples (at 40 a second and a window of
/// 10 s, about 20 s), whatever the host's speed, and is then told to quit.
#[test]
fn working_set_sampling_estimates_a_phase_s_active_set() {
    if skip_without_kvm("working_set_sampling_estimates_a_phase_s_active_set") {
        return;
    }
    let (vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "phases",
        "--mem",
        "512M",
        "--swap-store",
        "default",
        "--working-set-sampling",
        "40",
        "--payload-args",
        "phases=1 heap=256M warm=1 ops=1000000000000",
    ]);
    let t0 = std::time::Instant::now();
    let mut live = serde_json::Value::Null;
    while t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_secs(1));
        live = ctl(&socket, &["stats"])["swap"]["working_set"].clone();
        if live["estimate_samples"].as_u64().unwrap_or(0) >= 400 {
            break;
        }
    }
    ctl(&socket, &["quit"]);
    let run = vm.finish(Duration::from_secs(120));
    run.expect_status(0);
    let stats = run.stats.as_ref().unwrap();
    let ws = &stats["swap"]["working_set"];
    eprintln!(
        "after {:.1} s: {ws}; {}",
        t0.elapsed().as_secs_f64(),
        run.stderr
            .lines()
            .filter(|l| l.contains("working set"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    assert!(
        ws["estimate_samples"].as_u64().unwrap_or(0) >= 400,
        "400 samples within 120 s (live: {live}): {ws}"
    );
    let estimate = ws["estimate_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("an estimate after the run: {ws}"));
    // The phase's set (16 MiB), the pinned first chunk, the generation
    // table: 11 chunks, what stays resident in the same run without
    // warm=1, where every sample comes back. Samples drawn while the whole
    // heap was resident count up to 256 MiB or nothing, so the estimate
    // is noisy: within 15 % or three standard errors (a miss 1 run in
    // 370), and the error itself small.
    let active = 22 * MIB;
    let stderr = run.stat("/swap/working_set/estimate_stderr_bytes");
    assert!(
        stderr <= active / 5,
        "standard error {} MiB: {ws}",
        stderr as f64 / MIB as f64
    );
    assert!(
        estimate.abs_diff(active) <= (active * 15 / 100).max(3 * stderr),
        "estimate {} MiB, active set {} MiB: {ws}",
        estimate / MIB,
        active / MIB
    );
    assert!(
        run.stat("/swap/resident_bytes_max") >= 128 * MIB,
        "most of the heap was resident at once (sampling began with the run): {stats}"
    );
    assert!(
        run.stat("/swap/resident_bytes") < 128 * MIB,
        "the heap's idle part left: {stats}"
    );
    assert!(
        run.stat("/swap/working_set/returned") < run.stat("/swap/working_set/samples"),
        "idle samples stayed out: {ws}"
    );
    // The sampling's cost is reported, and is part of the stall's waits
    // (how large it is, against vCPU time, is a figure for a quiet
    // machine: README, "Memory that sizes itself").
    let by_source_us: u64 = stats["swap"]["stall"]["by_source_us"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let cost_us = run.stat("/swap/working_set/sample_wait_us");
    assert!(
        cost_us > 0 && cost_us <= by_source_us,
        "sampling cost {cost_us} us, waits {by_source_us} us: {ws}"
    );
}

#[test]
fn working_set_sampling_options_are_checked() {
    for (args, want) in [
        (
            vec!["--working-set-sampling", "2"],
            "--working-set-sampling configures the swap engine",
        ),
        (
            vec!["--swap-store", "default", "--working-set-sampling", "0"],
            "give a rate of at least",
        ),
        (
            vec!["--swap-store", "default", "--working-set-sampling", "5000"],
            "at most 1000",
        ),
        (
            vec!["--swap-store", "default", "--working-set-sampling", "often"],
            "--working-set-sampling",
        ),
        (
            vec!["--swap-store", "default", "--working-set-window-ms", "1000"],
            "give --working-set-sampling UNITS_PER_S too",
        ),
        (
            vec![
                "--swap-store",
                "default",
                "--working-set-horizon-ms",
                "1000",
            ],
            "give --working-set-sampling UNITS_PER_S too",
        ),
        (
            vec![
                "--swap-store",
                "default",
                "--working-set-sampling",
                "2",
                "--working-set-window-ms",
                "0",
            ],
            "working-set window of 0 ms: give at least 1 ms",
        ),
        (
            vec![
                "--swap-store",
                "default",
                "--working-set-sampling",
                "2",
                "--working-set-horizon-ms",
                "100000000",
            ],
            "working-set horizon of 100000000 ms: give at least 1 ms and at most 86400000 ms",
        ),
    ] {
        let mut full = vec!["run", "--payload", "hello", "--mem", "128M"];
        full.extend_from_slice(&args);
        assert_refused(&full, want);
    }
}

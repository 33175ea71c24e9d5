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
        let run = hugevmm(&full, Duration::from_secs(60));
        assert!(
            run.status == Some(1) || run.status == Some(2),
            "{args:?}: exited {:?}: {}",
            run.status,
            run.stderr
        );
        assert!(run.stderr.contains(want), "{args:?}: {}", run.stderr);
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

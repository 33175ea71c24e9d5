//! `hugevmm host`: several VMs, each a `hugevmm run` of its own, under one
//! memory budget; a VM that ends gives its memory back; a supervisor that
//! dies leaves the VMs their last limits; the options' checks.

use integration_tests::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A VM description file.
fn vm_config(name: &str, json: &str) -> PathBuf {
    temp_file(&format!("{name}.json"), json)
}

/// The report's timeline as (t_s, [(vm index by name order, limit)]).
fn limits_over_time(report: &serde_json::Value) -> Vec<(f64, Vec<(String, u64)>)> {
    report["timeline"]
        .as_array()
        .expect("a timeline")
        .iter()
        .map(|sample| {
            let vms = sample["vms"]
                .as_array()
                .unwrap()
                .iter()
                .map(|vm| {
                    (
                        vm["name"].as_str().unwrap().to_string(),
                        vm["limit_bytes"].as_u64().unwrap(),
                    )
                })
                .collect();
            (sample["t_s"].as_f64().unwrap(), vms)
        })
        .collect()
}

/// Two VMs whose peaks together pass the budget: a short `verify` and a
/// longer `phases`, each checking every word it wrote. The limits never sum
/// above the budget, both VMs end with status 0, and once the short one
/// has ended the other gets all of the budget it can use.
#[test]
fn host_divides_its_budget_and_gives_an_ended_vm_s_memory_back() {
    if skip_without_kvm("host_divides_its_budget_and_gives_an_ended_vm_s_memory_back") {
        return;
    }
    let short = vm_config(
        "short",
        r#"{"payload": "verify", "mem": "128M", "payload-args": "passes=4"}"#,
    );
    let long = vm_config(
        "long",
        r#"{"payload": "phases", "mem": "320M", "payload-args": "heap=256M phases=6 ops=8000000"}"#,
    );
    let report_path = temp_path("host-report.json");
    let state = temp_path("host-state");
    let budget = 256 * MIB;
    let run = hugevmm(
        &[
            "host",
            "--budget",
            "256M",
            "--vm",
            short.to_str().unwrap(),
            "--vm",
            long.to_str().unwrap(),
            "--period-ms",
            "500",
            "--state-dir",
            state.to_str().unwrap(),
            "--report",
            report_path.to_str().unwrap(),
        ],
        Duration::from_secs(600),
    );
    let report = take_report(&report_path, &run);
    let names: Vec<String> = report["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vm| vm["name"].as_str().unwrap().to_string())
        .collect();
    for (i, vm) in report["vms"].as_array().unwrap().iter().enumerate() {
        assert_eq!(vm["exit_status"], 0, "{}: {report}", names[i]);
        let stats: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(vm["stats_json"].as_str().unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(stats["exit_status"], 0, "{}: {stats}", names[i]);
        let out = std::fs::read_to_string(vm["stdout"].as_str().unwrap()).unwrap();
        assert!(out.contains(" ok"), "{}: its data checked: {out}", names[i]);
    }
    let timeline = limits_over_time(&report);
    for (t, vms) in &timeline {
        let sum: u64 = vms.iter().map(|(_, l)| l).sum();
        assert!(
            sum <= budget,
            "at {t} s the limits sum to {} MiB: {vms:?}",
            sum / MIB
        );
    }
    // The periods after the short VM ended: the long one alone, and within
    // two periods at the whole budget (its RAM is more).
    let alone: Vec<&(f64, Vec<(String, u64)>)> = timeline
        .iter()
        .skip_while(|(_, vms)| vms.len() == 2)
        .filter(|(_, vms)| vms.len() == 1)
        .collect();
    assert!(alone.len() >= 3, "the long VM ran on alone: {timeline:?}");
    assert_eq!(alone[0].1[0].0, names[1], "{timeline:?}");
    assert_eq!(
        alone[2].1[0].1, budget,
        "the ended VM's memory went to the other: {timeline:?}"
    );
    assert!(
        run.stderr.contains("its memory goes to the others"),
        "{}",
        run.stderr
    );
    let _ = std::fs::remove_dir_all(&state);
}

/// Reads a VM's limit through its API socket; None once the VM has ended.
fn limit_of(socket: &Path) -> Option<u64> {
    let run = hugevmm(
        &["ctl", "--api-socket", socket.to_str().unwrap(), "stats"],
        Duration::from_secs(60),
    );
    let stats: serde_json::Value = serde_json::from_str(run.stdout.trim()).ok()?;
    stats["swap"]["mem_limit_bytes"].as_u64()
}

/// Kills, when dropped, every VM whose command line names `state` (their
/// sockets are there): a test that fails with a supervisor killed leaves
/// no VM running.
struct VmsOf(PathBuf);

impl Drop for VmsOf {
    fn drop(&mut self) {
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-f"])
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The supervisor is killed (SIGKILL, no chance to clean up): its VMs run
/// on with the limits it last set, and end as they would have.
#[test]
fn a_dead_supervisor_leaves_the_vms_their_last_limits() {
    if skip_without_kvm("a_dead_supervisor_leaves_the_vms_their_last_limits") {
        return;
    }
    let configs = [
        vm_config(
            "one",
            r#"{"payload": "verify", "mem": "192M", "payload-args": "passes=30"}"#,
        ),
        vm_config(
            "two",
            r#"{"payload": "verify", "mem": "192M", "payload-args": "passes=30"}"#,
        ),
    ];
    let state = temp_path("host-state");
    let _vms = VmsOf(state.clone());
    let mut host = Background::start(&[
        "host",
        "--budget",
        "256M",
        "--vm",
        configs[0].to_str().unwrap(),
        "--vm",
        configs[1].to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    let sockets: Vec<PathBuf> = configs
        .iter()
        .map(|c| state.join(format!("{}.sock", c.file_stem().unwrap().to_str().unwrap())))
        .collect();
    host.wait_until("both VMs' API sockets", Duration::from_secs(120), || {
        sockets.iter().all(|s| s.exists())
    });
    // Two periods of the supervisor.
    std::thread::sleep(Duration::from_millis(2500));
    host.signal(libc::SIGKILL);
    let _ = host.finish(Duration::from_secs(30));
    let limits: Vec<Option<u64>> = sockets.iter().map(|s| limit_of(s)).collect();
    let sum: u64 = limits.iter().flatten().sum();
    assert!(sum <= 256 * MIB, "{limits:?}");
    std::thread::sleep(Duration::from_millis(2500));
    let later: Vec<Option<u64>> = sockets.iter().map(|s| limit_of(s)).collect();
    for (before, after) in limits.iter().zip(&later) {
        // A VM that ended meanwhile answers no more.
        if let (Some(before), Some(after)) = (before, after) {
            assert_eq!(
                before, after,
                "the VMs kept their last limits: {limits:?} {later:?}"
            );
        }
    }
    // Both end on their own, their data checked (the stats file is
    // written after the socket is removed, as the run ends).
    let read_stats = |config: &PathBuf| {
        let name = config.file_stem().unwrap().to_str().unwrap();
        std::fs::read_to_string(state.join(format!("{name}.stats.json")))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
    };
    let t0 = Instant::now();
    while configs.iter().any(|c| read_stats(c).is_none()) {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "the VMs never ended"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for config in &configs {
        let stats = read_stats(config).unwrap();
        assert_eq!(stats["exit_status"], 0, "{config:?}: {stats}");
    }
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn host_options_are_checked() {
    let vm = vm_config(
        "checked",
        r#"{"payload": "hello", "mem": "128M", "vcpus": 2}"#,
    );
    let vm = vm.to_str().unwrap();
    for (args, want) in [
        (
            vec!["--budget", "100M", "--vm", vm, "--vm", vm],
            "is below the VMs' floors together",
        ),
        (
            vec!["--budget", "1G", "--vm", vm, "--floor", "256M"],
            "is more than its guest RAM",
        ),
        (
            vec!["--budget", "1G", "--vm", "/nonexistent/vm.json"],
            "/nonexistent/vm.json",
        ),
        (vec!["--budget", "1G"], "--vm"),
        (
            vec!["--budget", "1G", "--vm", vm, "--period-ms", "5"],
            "--period-ms 5",
        ),
    ] {
        let mut full = vec!["host"];
        full.extend_from_slice(&args);
        assert_refused(&full, want);
    }
}

/// The supervisor's API, through the real curl and the real OpenMetrics
/// parser: the VMs and their limits, the budget lowered at run time (the
/// limits follow within two periods; a budget below the floors is refused
/// with what to give), and metrics labelled by vm.
#[test]
fn the_supervisor_api_shows_the_vms_and_takes_a_new_budget() {
    let test = "the_supervisor_api_shows_the_vms_and_takes_a_new_budget";
    if skip_without_kvm_curl_and_parser(test) {
        return;
    }
    let config = vm_config(
        "api",
        r#"{"payload": "verify", "mem": "256M", "payload-args": "passes=1000000"}"#,
    );
    let state = temp_path("host-state");
    let _vms = VmsOf(state.clone());
    let socket = temp_path("host.sock");
    let mut host = Background::start(&[
        "host",
        "--budget",
        "384M",
        "--vm",
        config.to_str().unwrap(),
        "--vm",
        config.to_str().unwrap(),
        "--period-ms",
        "200",
        "--state-dir",
        state.to_str().unwrap(),
        "--api-socket",
        socket.to_str().unwrap(),
    ]);
    let get_vms = || curl(Some(&socket), "GET", "http://host/vms", None, &[]);
    host.wait_until(
        "both VMs read by the supervisor",
        Duration::from_secs(120),
        || {
            socket.exists()
                && get_vms().json()["vms"].as_array().is_some_and(|vms| {
                    vms.len() == 2 && vms.iter().all(|vm| vm["resident_bytes"].as_u64() > Some(0))
                })
        },
    );
    let vms = get_vms().json();
    let names: Vec<&str> = vms["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vm| vm["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{vms}");
    assert_ne!(
        names[0], names[1],
        "two VMs of one file get names of their own: {vms}"
    );
    let refused = curl(
        Some(&socket),
        "PUT",
        "http://host/budget",
        Some(r#"{"budget_bytes": "100M"}"#),
        &[],
    );
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused.body.contains("below the running VMs' floors"),
        "{}",
        refused.body
    );
    let lowered = curl(
        Some(&socket),
        "PUT",
        "http://host/budget",
        Some(r#"{"budget_bytes": "160M"}"#),
        &[],
    );
    assert_eq!(lowered.status, 200, "{}", lowered.body);
    assert_eq!(lowered.json()["budget_bytes"], 160 * MIB);
    // Within two periods (and a slack for a loaded host) the limits fit.
    let t0 = Instant::now();
    loop {
        let vms = get_vms().json();
        let sum: u64 = vms["vms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|vm| vm["limit_bytes"].as_u64().unwrap())
            .sum();
        if sum <= 160 * MIB {
            // The VMs' own APIs agree.
            for vm in vms["vms"].as_array().unwrap() {
                let own = limit_of(Path::new(vm["socket"].as_str().unwrap()));
                assert!(
                    own.is_some_and(|own| own <= 160 * MIB - 64 * MIB),
                    "{own:?}: {vms}"
                );
            }
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the limits never fit: {vms}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let metrics = curl(Some(&socket), "GET", "http://host/metrics", None, &[]);
    assert_eq!(metrics.status, 200, "{}", metrics.body);
    let families = parse_openmetrics(&metrics.body);
    assert_eq!(
        families["hugevmm_host_budget_bytes"]["samples"][0][2].as_f64(),
        Some((160 * MIB) as f64),
        "{families}"
    );
    let limits = families["hugevmm_host_vm_limit_bytes"]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("{families}"));
    let labelled: Vec<&str> = limits
        .iter()
        .map(|s| s[1]["vm"].as_str().unwrap_or_default())
        .collect();
    for name in &names {
        assert!(labelled.contains(name), "{name}: {families}");
    }
    host.signal(libc::SIGTERM);
    let run = host.finish(Duration::from_secs(120));
    assert!(
        run.stderr.contains("stop signal: ending the VMs"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("killing"),
        "one SIGTERM: {}",
        run.stderr
    );
    assert!(!socket.exists(), "the supervisor's socket is removed");
    let _ = std::fs::remove_dir_all(&state);
}

/// `--balloons`: a VM with a balloon is asked through it for what its RAM
/// has above its limit. The balloon payload follows the target it is
/// given, inflates that much and checks the inflated chunks were dropped.
#[test]
fn with_balloons_a_vm_is_asked_for_what_its_ram_has_above_its_limit() {
    if skip_without_kvm("with_balloons_a_vm_is_asked_for_what_its_ram_has_above_its_limit") {
        return;
    }
    let ballooned = vm_config(
        "ballooned",
        r#"{"payload": "balloon", "mem": "256M", "balloon": true, "payload-args": "follow=1 wait_gcycles=600"}"#,
    );
    let other = vm_config(
        "other",
        r#"{"payload": "verify", "mem": "128M", "payload-args": "passes=20"}"#,
    );
    let state = temp_path("host-state");
    let _vms = VmsOf(state.clone());
    let report_path = temp_path("host-report.json");
    let run = hugevmm(
        &[
            "host",
            "--budget",
            "256M",
            "--balloons",
            "--vm",
            ballooned.to_str().unwrap(),
            "--vm",
            other.to_str().unwrap(),
            "--period-ms",
            "200",
            "--state-dir",
            state.to_str().unwrap(),
            "--report",
            report_path.to_str().unwrap(),
        ],
        Duration::from_secs(600),
    );
    let report = take_report(&report_path, &run);
    let out = std::fs::read_to_string(report["vms"][0]["stdout"].as_str().unwrap()).unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with("balloon follow ok"))
        .unwrap_or_else(|| panic!("the guest followed its balloon: {out}"));
    let field = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {line}"))
    };
    // Its RAM above a limit the budget allows it (the other VM holds at
    // least its floor): a whole number of 2 MiB units, in pages.
    let target_bytes = field("target_pages=") * 4096;
    assert!(
        (64 * MIB..=192 * MIB).contains(&target_bytes) && target_bytes % (2 * MIB) == 0,
        "{line}"
    );
    assert!(field("dropped_chunks=") > 0, "{line}");
}

/// The supervisor's `--report` (removed once read), after checking that
/// the run ended well; a missing or broken report fails with the run's
/// stderr.
fn take_report(report_path: &std::path::Path, run: &Run) -> serde_json::Value {
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report_path).unwrap_or_default())
            .unwrap_or_else(|e| panic!("the report ({e}): {}", run.stderr));
    let _ = std::fs::remove_file(report_path);
    run.expect_status(0);
    report
}

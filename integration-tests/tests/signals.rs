//! Stop signals delivered twice at once (GNU `timeout` signals its child,
//! then its process group, which holds the child too) are one request: the
//! run still ends cleanly, with its statistics and status file written.

use integration_tests::*;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// A swapping VM's arguments: 2 vCPUs over 256 MiB held to 64 MiB, writing
/// until it is told to stop.
const SWAPPING: [&str; 10] = [
    "run",
    "--payload",
    "verify",
    "--vcpus",
    "2",
    "--mem",
    "256M",
    "--mem-limit",
    "64M",
    "--payload-args",
];

fn swapping_args(socket_or_status: &[&str]) -> Vec<String> {
    SWAPPING
        .iter()
        .chain(&["passes=100000"])
        .chain(socket_or_status)
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn two_sigterms_at_once_end_the_run_cleanly() {
    if skip_without_kvm("two_sigterms_at_once_end_the_run_cleanly") {
        return;
    }
    let status_file = temp_path("two-sigterms-status.json");
    let status_arg = status_file.to_str().unwrap().to_string();
    let args = swapping_args(&["--status-file", &status_arg]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (vm, socket) = start_with_api_socket(&args);
    let mut swapped = false;
    for _ in 0..600 {
        if ctl(&socket, &["stats"])["swap"]["evictions"]
            .as_u64()
            .unwrap_or(0)
            > 0
        {
            swapped = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(swapped, "the guest never swapped");
    vm.signal(libc::SIGTERM);
    vm.signal(libc::SIGTERM);
    let run = vm.finish(LIMIT);
    run.expect_status(128 + libc::SIGTERM);
    assert!(
        !run.stderr.contains("second signal"),
        "a repeated signal ended the run at once:\n{}",
        run.stderr
    );
    let stats = run.stats.as_ref().expect("--stats-json written");
    assert_eq!(stats["exit_kind"], "signal", "{stats}");
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status_file).expect("status file")).unwrap();
    assert_eq!(status["exit_kind"], "signal", "{status}");
    assert!(!socket.exists(), "the API socket was left behind");
    std::fs::remove_file(&status_file).unwrap();
}

#[test]
fn gnu_timeout_ends_a_swapping_run_with_its_stats_written() {
    if skip_without_kvm("gnu_timeout_ends_a_swapping_run_with_its_stats_written") {
        return;
    }
    // `timeout` is GNU coreutils', on every Debian machine (essential).
    for attempt in 0..3 {
        let stats_file = temp_path("timeout-stats.json");
        let mut cmd = Command::new("timeout");
        cmd.arg("5").arg(hugevmm_bin());
        cmd.args(swapping_args(&[]));
        cmd.arg("--stats-json").arg(&stats_file);
        let output = run_with_limit(cmd, LIMIT);
        let stderr = String::from_utf8_lossy(&output.stderr);
        // timeout exits 124 when it had to send the signal.
        assert_eq!(
            output.status.code(),
            Some(124),
            "attempt {attempt}: {stderr}"
        );
        assert!(
            !stderr.contains("second signal"),
            "attempt {attempt}: timeout's two SIGTERMs ended the run at once:\n{stderr}"
        );
        let text = std::fs::read_to_string(&stats_file)
            .unwrap_or_else(|e| panic!("attempt {attempt}: no --stats-json ({e}):\n{stderr}"));
        let stats: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(stats["exit_kind"], "signal", "{stats}");
        assert!(stats["swap"]["evictions"].as_u64().unwrap() > 0, "{stats}");
        std::fs::remove_file(&stats_file).unwrap();
    }
}

//! The per-thread seccomp filters (docs/SECURITY.md): every thread of a
//! running VM has one, `--no-seccomp` installs none, and a forbidden call
//! on any kind of thread ends the run with a message naming the call and
//! the kind.

use integration_tests::*;
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(300);

/// (thread name, `Seccomp:` mode) of every thread of `pid`.
fn thread_modes(pid: u32) -> Vec<(String, String)> {
    let mut modes = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return modes;
    };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        modes.push((field("Name:"), field("Seccomp:")));
    }
    modes.sort();
    modes
}

/// Starts a VM with the swap engine, a disk, the balloon and the API that
/// runs until it is told to quit; returns it once `ready` holds for its
/// threads (or panics after 30 s with what they show).
fn check_threads(extra: &[&str], ready: impl Fn(&[(String, String)]) -> bool) {
    let disk = std::path::PathBuf::from("/var/tmp").join(format!(
        "hugevmm-test-{}-seccomp-{}.img",
        std::process::id(),
        extra.len()
    ));
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut args = vec![
        "run",
        "--payload",
        "balloon",
        "--vcpus",
        "2",
        "--mem",
        "128M",
        "--mem-limit",
        "64M",
        "--balloon",
        "--disk",
        disk.to_str().unwrap(),
        "--payload-args",
        "follow=1",
    ];
    args.extend_from_slice(extra);
    let (vm, socket) = start_with_api_socket(&args);
    // One request, so that a client thread has run too.
    ctl(&socket, &["stats"]);
    let start = Instant::now();
    let mut modes = thread_modes(vm.pid());
    while !ready(&modes) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
        modes = thread_modes(vm.pid());
    }
    let names: Vec<&str> = modes.iter().map(|(n, _)| n.as_str()).collect();
    ctl(&socket, &["quit"]);
    let run = vm.finish(LIMIT);
    std::fs::remove_file(&disk).ok();
    assert!(
        ready(&modes),
        "threads and their seccomp modes: {modes:?}\n{}",
        run.stderr
    );
    // vCPU 1 of the balloon payload is done at once; vCPU 0 waits.
    for name in [
        "vcpu0",
        "swap-fault-0",
        "swap-evictor",
        "swap-refill",
        "signals",
        "api",
    ] {
        assert!(names.contains(&name), "no {name} thread among {names:?}");
    }
    run.expect_status(0);
}

#[test]
fn every_thread_of_a_running_vm_has_a_filter() {
    if skip_without_kvm("every_thread_of_a_running_vm_has_a_filter") {
        return;
    }
    check_threads(&[], |modes| {
        !modes.is_empty() && modes.iter().all(|(_, mode)| mode == "2")
    });
}

#[test]
fn no_seccomp_installs_no_filter() {
    if skip_without_kvm("no_seccomp_installs_no_filter") {
        return;
    }
    check_threads(&["--no-seccomp"], |modes| {
        !modes.is_empty() && modes.iter().all(|(_, mode)| mode == "0")
    });
}

#[test]
fn a_forbidden_call_ends_the_run_naming_the_call_and_the_thread_kind() {
    if skip_without_kvm("a_forbidden_call_ends_the_run_naming_the_call_and_the_thread_kind") {
        return;
    }
    for kind in [
        "vcpu",
        "main",
        "fault-service",
        "evictor",
        "device",
        "control",
    ] {
        let socket = temp_path("probe.sock");
        let mut cmd = Command::new(hugevmm_bin());
        cmd.args([
            "run",
            "--payload",
            "hello",
            "--vcpus",
            "2",
            "--mem",
            "64M",
            "--mem-limit",
            "32M",
        ])
        .arg("--api-socket")
        .arg(&socket)
        .env("HUGEVMM_SECCOMP_PROBE", kind);
        let out = run_with_limit(cmd, LIMIT);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = format!(
            "hugevmm: seccomp: forbidden system call execve (59) on a thread of kind {kind}; ending the VM"
        );
        assert!(stderr.contains(&want), "{kind}: {stderr}");
        assert_eq!(out.status.code(), Some(159), "{kind}: {stderr}");
        // Without the filters the same probe is let through, and says so.
        let mut cmd = Command::new(hugevmm_bin());
        cmd.args(["run", "--payload", "hello", "--mem", "64M", "--no-seccomp"])
            .env("HUGEVMM_SECCOMP_PROBE", kind);
        let out = run_with_limit(cmd, LIMIT);
        assert_eq!(out.status.code(), Some(0), "{kind} --no-seccomp");
    }
}

/// A run whose filter stopped a call still ends the way a failed run does:
/// `--stats-json` and `--status-file` are written, naming the call and the
/// kind, and the status is 159. (They were left empty: the handler ended
/// the process where the call was made.)
#[test]
fn a_run_stopped_by_its_filter_writes_its_stats_and_status_file() {
    if skip_without_kvm("a_run_stopped_by_its_filter_writes_its_stats_and_status_file") {
        return;
    }
    for kind in ["evictor", "vcpu", "control"] {
        let status_file = temp_path("seccomp-status.json");
        let stats_file = temp_path("seccomp-stats.json");
        let socket = temp_path("seccomp-status.sock");
        let mut cmd = Command::new(hugevmm_bin());
        cmd.args([
            "run",
            "--payload",
            "hello",
            "--vcpus",
            "2",
            "--mem",
            "64M",
            "--mem-limit",
            "32M",
        ])
        .arg("--status-file")
        .arg(&status_file)
        .arg("--stats-json")
        .arg(&stats_file)
        .arg("--api-socket")
        .arg(&socket)
        .env("HUGEVMM_SECCOMP_PROBE", kind);
        let out = run_with_limit(cmd, LIMIT);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let read = |path: &std::path::Path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let _ = std::fs::remove_file(path);
            serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| {
                panic!(
                    "{kind}: {} is not JSON ({e}): {text:?}\n{stderr}",
                    path.display()
                )
            })
        };
        let (status, stats) = (read(&status_file), read(&stats_file));
        let want = format!("seccomp: forbidden system call execve (59) on a thread of kind {kind}");
        assert_eq!(out.status.code(), Some(159), "{kind}: {stderr}");
        assert_eq!(status["exit_status"], 159, "{kind}: {status}");
        assert_eq!(status["exit_kind"], "vm-failure", "{kind}: {status}");
        assert_eq!(status["message"], want.as_str(), "{kind}: {status}");
        assert_eq!(stats["exit_status"], 159, "{kind}: {stats}");
        assert_eq!(stats["failure"], want.as_str(), "{kind}: {stats}");
        assert!(
            stderr.contains(&format!("hugevmm: {want}; ending the VM")),
            "{kind}: {stderr}"
        );
        assert!(!socket.exists(), "{kind}: the API socket is left");
    }
}

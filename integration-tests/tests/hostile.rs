//! A guest that attacks the VMM (the `hostile` payload) while the swap
//! engine runs, with and without a memory limit: the VMM must end the run
//! with a clear message (one vCPU's deliberate exception), never crash or
//! hang, keep the disk usable after every reset, and keep its log bounded.

use integration_tests::*;
use std::path::PathBuf;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
const VCPUS: usize = 4;
/// Random port accesses per vCPU (the payload's default).
const PORTS: u64 = 20_000;

fn disk_image(tag: &str) -> PathBuf {
    let path =
        PathBuf::from("/var/tmp").join(format!("hugevmm-test-{}-{tag}.img", std::process::id()));
    let file = std::fs::File::create(&path).expect("create disk image");
    file.set_len(64 << 20).expect("size disk image");
    path
}

/// The count after `kind ` in the suppressed-messages summary line.
fn suppressed(stderr: &str, kind: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("guest-triggered messages suppressed"))
        .unwrap_or_else(|| panic!("no suppressed-messages summary:\n{stderr}"));
    let at = line
        .find(&format!("{kind} "))
        .unwrap_or_else(|| panic!("no {kind} in {line}"));
    line[at + kind.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count after {kind} in {line}"))
}

#[test]
fn a_hostile_guest_ends_with_a_message_and_a_bounded_log() {
    if skip_without_kvm("a_hostile_guest_ends_with_a_message_and_a_bounded_log") {
        return;
    }
    let disk = disk_image("hostile");
    let spec = disk.to_str().unwrap().to_string();
    for extra in [&[][..], &["--mem-limit", "64M"][..]] {
        let mut args = vec![
            "run",
            "--payload",
            "hostile",
            "--vcpus",
            "4",
            "--mem",
            "256M",
            "--disk",
            &spec,
            "--balloon",
        ];
        args.extend_from_slice(extra);
        let run = hugevmm(&args, LIMIT);
        let all = format!("--- stdout\n{}\n--- stderr\n{}", run.stdout, run.stderr);
        // The deliberate exceptions end the run as a VM failure, by message.
        run.expect_status(125);
        assert!(
            run.stderr.contains("guest exception: vector"),
            "{extra:?}: {all}"
        );
        assert!(!run.stderr.contains("panicked"), "{extra:?}: {all}");
        for vcpu in 0..VCPUS {
            assert!(
                run.stdout.contains(&format!("hostile vcpu={vcpu} ok ")),
                "{extra:?}: vCPU {vcpu} did not finish its attacks: {all}"
            );
        }
        assert!(
            run.stdout.contains("hostile devices=2 ") && run.stdout.contains(" recovered=1"),
            "{extra:?}: the disk did not recover: {all}"
        );
        // The attacks that must break a device did.
        let broken: u64 = run
            .stdout
            .split("broken=")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("broken= count");
        assert!(
            broken >= 20,
            "{extra:?}: only {broken} attacks broke a device: {all}"
        );
        // About 80,000 accesses to unknown ports, a few dozen lines.
        let printed = run.stderr.matches("at unknown I/O port").count() as u64;
        let lost = suppressed(&run.stderr, "unknown I/O port");
        let total = printed + lost;
        assert!(
            total <= VCPUS as u64 * PORTS && total > VCPUS as u64 * PORTS * 99 / 100,
            "{extra:?}: {printed} printed + {lost} suppressed unknown-port messages: {all}"
        );
        let lines = run.stderr.lines().count();
        assert!(lines < 150, "{extra:?}: {lines} lines on stderr: {all}");
        if !extra.is_empty() {
            assert!(
                run.stat("/swap/evictions") > 0,
                "the swap engine did not evict: {all}"
            );
        }
    }
    std::fs::remove_file(&disk).ok();
}

#[test]
fn a_hostile_guest_without_exceptions_exits_cleanly() {
    if skip_without_kvm("a_hostile_guest_without_exceptions_exits_cleanly") {
        return;
    }
    let disk = disk_image("hostile-clean");
    let spec = disk.to_str().unwrap().to_string();
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hostile",
            "--vcpus",
            "2",
            "--mem",
            "128M",
            "--mem-limit",
            "32M",
            "--disk",
            &spec,
            "--payload-args",
            "exceptions=0 ports=2000 notifies=2000",
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert!(
        run.stdout.contains("recovered=1") && run.stdout.contains("hostile vcpu=1 ok "),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    std::fs::remove_file(&disk).ok();
}

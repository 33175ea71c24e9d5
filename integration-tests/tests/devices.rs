//! virtio devices driven from payloads (protocol version 2): a virtio-blk
//! disk written and read back, balloon free page reports that drop whole
//! chunks, with and without the swap engine, and a balloon target set at
//! start (`--balloon-target`) or at run time (`--api-socket`, `hugevmm
//! ctl`).

use integration_tests::*;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// A sparse raw image on a disk filesystem (O_DIRECT needs a real one).
fn disk_image(tag: &str, len_bytes: u64) -> PathBuf {
    let path =
        PathBuf::from("/var/tmp").join(format!("hugevmm-test-{}-{tag}.img", std::process::id()));
    let file = std::fs::File::create(&path).expect("create disk image");
    file.set_len(len_bytes).expect("size disk image");
    path
}

#[test]
fn blkcheck_writes_and_reads_back_a_virtio_disk() {
    if skip_without_kvm("blkcheck") {
        return;
    }
    let disk = disk_image("blk", 64 << 20);
    let spec = disk.to_str().unwrap().to_string();
    for extra in [&[][..], &["--mem-limit", "64M"][..]] {
        let mut args = vec![
            "run",
            "--payload",
            "blkcheck",
            "--mem",
            "256M",
            "--vcpus",
            "2",
            "--disk",
            &spec,
        ];
        args.extend_from_slice(extra);
        let run = hugevmm(&args, LIMIT);
        run.expect_status(0);
        assert!(
            run.stdout.contains("blkcheck ok sectors="),
            "{extra:?}: {}",
            run.stdout
        );
    }
    check_blkcheck_readonly(&spec);
    let _ = std::fs::remove_file(&disk);
}

#[test]
fn balloon_reports_drop_whole_free_chunks_only() {
    if skip_without_kvm("balloon") {
        return;
    }
    for extra in [
        &[][..],
        &["--mem-limit", "64M"][..],
        &[
            "--mem-limit",
            "64M",
            "--swap-store",
            "mem:lz4",
            "--payload-args",
            "chunks=16",
        ][..],
    ] {
        let mut args = vec!["run", "--payload", "balloon", "--balloon", "--mem", "256M"];
        args.extend_from_slice(extra);
        let run = hugevmm(&args, LIMIT);
        run.expect_status(0);
        assert!(
            run.stdout.contains("balloon ok dropped_chunks=")
                && run.stdout.contains("kept_partial=1"),
            "{extra:?}: {}",
            run.stdout
        );
    }
}

#[test]
fn devices_need_a_version_2_payload() {
    if skip_without_kvm("devices_need_v2") {
        return;
    }
    // A protocol-1 payload (no HVMM note) must not be handed a v2 boot info.
    let asm = temp_file(
        "v1.S",
        ".globl _start\n.text\n_start:\n mov $0xf4, %dx\n xor %eax, %eax\n outl %eax, %dx\n1: jmp 1b\n",
    );
    let elf = gcc_build(
        &[&asm],
        &["-Wl,-Ttext-segment=0x400000", "-Wl,--build-id=none"],
        "v1.elf",
    );
    let run = hugevmm(
        &[
            "run",
            "--payload-file",
            elf.to_str().unwrap(),
            "--mem",
            "64M",
            "--balloon",
        ],
        LIMIT,
    );
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("protocol version 1"), "{}", run.stderr);
    // Without devices the same payload runs.
    hugevmm(
        &[
            "run",
            "--payload-file",
            elf.to_str().unwrap(),
            "--mem",
            "64M",
        ],
        LIMIT,
    )
    .expect_status(0);
}

#[test]
fn balloon_target_changes_at_run_time() {
    if skip_without_kvm("balloon_target_changes_at_run_time") {
        return;
    }
    for extra in [&[][..], &["--mem-limit", "64M"][..]] {
        let socket = temp_path("api.sock");
        // A socket left by a VM that was killed: replaced, not refused.
        drop(UnixListener::bind(&socket).unwrap());
        let mut args = vec![
            "run",
            "--payload",
            "balloon",
            "--balloon",
            "--mem",
            "256M",
            "--payload-args",
            "follow=1",
            "--api-socket",
            socket.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut vm = Background::start(&args);
        // Not the path's existence: the stale socket is there already.
        vm.wait_until("the control socket accepts connections", LIMIT, || {
            UnixStream::connect(&socket).is_ok()
        });
        assert_eq!(
            ctl(&socket, &["help"])["commands"][0]["command"],
            "balloon SIZE"
        );
        assert!(ctl(&socket, &["stats"])["elapsed_s"].as_f64().is_some());

        // The guest hands a fresh statistics report back each time it is
        // asked (its first one comes with the driver's start): ask until a
        // second one has arrived. The guest waits for a target meanwhile.
        let mut tries = 0;
        let stats = loop {
            let stats = ctl(&socket, &["balloon-stats"]);
            assert_eq!(stats["target_pages"], 0, "{stats}");
            if stats["stats_reports"].as_u64().unwrap() >= 2 {
                break stats;
            }
            tries += 1;
            assert!(tries < 2000, "no second statistics report: {stats}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(stats["driver_active"], true, "{stats}");
        assert_eq!(stats["guest_stats"]["total_bytes"], 256 << 20, "{stats}");

        // Bad input is an error reply, and ctl says so.
        let bad = hugevmm(
            &[
                "ctl",
                "--api-socket",
                socket.to_str().unwrap(),
                "balloon",
                "5000",
            ],
            LIMIT,
        );
        assert_eq!(bad.status, Some(1), "{}", bad.stderr);
        assert!(bad.stderr.contains("multiple of 4 KiB"), "{}", bad.stderr);

        let reply = ctl(&socket, &["balloon", "64M"]);
        assert_eq!(reply["target_pages"], 16384, "{reply}");

        let run = vm.finish(LIMIT);
        run.expect_status(0);
        assert!(
            run.stdout
                .contains("balloon follow ok target_pages=16384 dropped_chunks=32"),
            "{extra:?}: {}",
            run.stdout
        );
        assert_eq!(run.stat("/balloon/target_pages"), 16384);
        assert_eq!(run.stat("/balloon/actual_pages"), 16384);
        assert_eq!(run.stat("/balloon/inflated_pages"), 16384);
        assert!(run.stat("/balloon/stats_reports") >= 2);

        // The socket is gone with the VM, and ctl says how to get one.
        assert!(!socket.exists(), "{} left behind", socket.display());
        let gone = hugevmm(
            &["ctl", "--api-socket", socket.to_str().unwrap(), "stats"],
            LIMIT,
        );
        assert_eq!(gone.status, Some(1));
        assert!(
            gone.stderr.contains(socket.to_str().unwrap())
                && gone.stderr.contains("hugevmm run --api-socket"),
            "{}",
            gone.stderr
        );
    }
}

#[test]
fn balloon_target_at_start() {
    if skip_without_kvm("balloon_target_at_start") {
        return;
    }
    // 10 MiB: five whole chunks dropped, no partial one.
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "balloon",
            "--balloon",
            "--balloon-target",
            "10M",
            "--mem",
            "128M",
            "--payload-args",
            "follow=1",
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert!(
        run.stdout
            .contains("balloon follow ok target_pages=2560 dropped_chunks=5"),
        "{}",
        run.stdout
    );
    assert_eq!(run.stat("/balloon/target_pages"), 2560);
    assert_eq!(run.stat("/balloon/actual_pages"), 2560);
}

/// Configuration errors found before KVM is opened: no /dev/kvm needed.
#[test]
fn balloon_target_and_api_socket_errors() {
    let run_args = ["run", "--payload", "hello", "--mem", "64M"];
    let with = |extra: &[&str]| {
        let mut args = run_args.to_vec();
        args.extend_from_slice(extra);
        hugevmm(&args, LIMIT)
    };
    let run = with(&["--balloon", "--balloon-target", "5000"]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("--balloon-target") && run.stderr.contains("multiple of 4 KiB"),
        "{}",
        run.stderr
    );
    let run = with(&["--balloon", "--balloon-target", "1G"]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("more than the guest's RAM"),
        "{}",
        run.stderr
    );
    let run = with(&["--balloon-target", "4M"]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("--balloon"), "{}", run.stderr);

    // A socket someone listens on is refused, and left alone.
    let socket = temp_path("live.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let run = with(&["--api-socket", socket.to_str().unwrap()]);
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("listens on this socket"),
        "{}",
        run.stderr
    );
    assert!(socket.exists());
    drop(listener);
    std::fs::remove_file(&socket).unwrap();

    // ctl without a VM names the path and says how to start one.
    let run = hugevmm(
        &["ctl", "--api-socket", socket.to_str().unwrap(), "stats"],
        LIMIT,
    );
    assert_eq!(run.status, Some(1));
    assert!(
        run.stderr.contains(socket.to_str().unwrap())
            && run.stderr.contains("hugevmm run --api-socket"),
        "{}",
        run.stderr
    );
}

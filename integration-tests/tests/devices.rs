//! virtio devices driven from payloads (protocol version 2): a virtio-blk
//! disk written and read back, and balloon free page reports that drop
//! whole chunks, with and without the swap engine.

use integration_tests::*;
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
    let readonly = format!("{spec},readonly");
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "blkcheck",
            "--mem",
            "128M",
            "--disk",
            &readonly,
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert!(run.stdout.contains("readonly=1"), "{}", run.stdout);
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

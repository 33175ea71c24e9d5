//! Swap stores on a vhost-user-blk backend, qemu-storage-daemon, started
//! by each test on a Unix socket of its own over a file: overcommitted
//! guests keep every word (whole and split chunks, sealed or not, on one
//! or two queues); a backend killed mid-run and started again over the
//! same file is reconnected and nothing is lost; a backend gone for good
//! or frozen ends the VM naming it and the chunk, never with zeros; a
//! device too small for the run is refused at start; and the store's
//! worker runs under its own seccomp filter.

use blockio::test_support::StorageServer;
use integration_tests::*;
use std::path::PathBuf;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

/// A sparse file on a disk filesystem behind the backend, removed when
/// dropped.
struct Backing(PathBuf);

impl Backing {
    fn new(tag: &str, len_bytes: u64) -> Backing {
        let path =
            PathBuf::from("/var/tmp").join(format!("hugevmm-vub-{}-{tag}.img", std::process::id()));
        let file = std::fs::File::create(&path).expect("create the backend's file");
        file.set_len(len_bytes).expect("size the backend's file");
        Backing(path)
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn store_of(server: &StorageServer, options: &str) -> String {
    format!("vhost-user-blk:{}{options}", server.uri())
}

#[test]
fn verify_at_4x_overcommit_on_one_and_two_queues_sealed_or_not() {
    if skip_without_kvm("vhost-user verify") {
        return;
    }
    let file = Backing::new("verify", 1 << 30);
    let Some(server) =
        StorageServer::qemu_storage_daemon("vhost-user verify", &file.0, &["num-queues=2"])
    else {
        return;
    };
    let run = verify_on(&store_of(&server, ""), &[]);
    check_swapped_through(&run, "one queue");
    let run = verify_on(&store_of(&server, ",queues=2"), &["--swap-encrypt"]);
    check_swapped_through(&run, "two queues, sealed");
}

/// Splits forced every third restore: pages of split chunks are written
/// and read alone in their chunk's slot on the device.
#[test]
fn verify_with_forced_splits_on_a_vhost_user_store() {
    if skip_without_kvm("vhost-user forced splits") {
        return;
    }
    let file = Backing::new("splits", 1 << 30);
    let Some(server) = StorageServer::qemu_storage_daemon("vhost-user forced splits", &file.0, &[])
    else {
        return;
    };
    let run = verify_on(&store_of(&server, ""), &["--force-split-every", "3"]);
    check_swapped_through(&run, "forced splits");
    let splits = run.stat("/swap/split/splits");
    let page_reads = run.stat("/swap/split/page_faults/store");
    let pages_written = run.stat("/swap/split/pages_written");
    eprintln!(
        "forced splits: splits={splits} page_reads={page_reads} pages_written={pages_written}"
    );
    assert!(splits >= 100, "only {splits} splits");
    assert!(page_reads > 0, "no page was read alone");
    assert!(pages_written > 0, "no page was written alone");
}

#[test]
fn a_backend_killed_and_started_again_mid_run_loses_no_word() {
    if skip_without_kvm("vhost-user restart") {
        return;
    }
    let file = Backing::new("restart", 1 << 30);
    let Some(mut server) = StorageServer::qemu_storage_daemon("vhost-user restart", &file.0, &[])
    else {
        return;
    };
    let (vm, _socket) = start_swapping(&store_of(&server, ",timeout=120"));
    server.kill();
    // Down long enough for the vCPUs to wait on it (reads) and the
    // evictor to find it gone (writes); no result depends on how long.
    std::thread::sleep(Duration::from_secs(2));
    server.restart();
    let run = vm.finish(LIMIT);
    run.expect_status(0);
    assert_eq!(run.stdout.matches(" ok").count(), 4, "{}", run.stdout);
    assert!(!run.stdout.contains("MISMATCH"), "{}", run.stdout);
    assert!(
        run.stderr.contains("the backend closed the connection"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("reconnected after"), "{}", run.stderr);
}

fn assert_names_backend_and_chunk(run: &Run, path: &str) {
    assert_eq!(run.status, Some(125), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(path), "{}", run.stderr);
    assert!(run.stderr.contains("guest address 0x"), "{}", run.stderr);
    assert!(!run.stdout.contains("MISMATCH"), "{}", run.stdout);
}

#[test]
fn a_backend_gone_for_good_ends_the_vm_naming_it_and_the_chunk() {
    if skip_without_kvm("vhost-user dead backend") {
        return;
    }
    let file = Backing::new("dead", 1 << 30);
    let Some(mut server) =
        StorageServer::qemu_storage_daemon("vhost-user dead backend", &file.0, &[])
    else {
        return;
    };
    let (vm, _socket) = start_swapping(&store_of(&server, ",timeout=3"));
    server.kill();
    let run = vm.finish(LIMIT);
    assert_names_backend_and_chunk(&run, server.uri());
    assert!(
        run.stderr.contains("could not be reached again within 3 s"),
        "{}",
        run.stderr
    );
}

/// qemu-storage-daemon frozen mid-run (SIGSTOP): its socket stays up and
/// no request completes. After the bound the VM ends naming the backend
/// and the chunk, instead of waiting forever.
#[test]
fn a_frozen_backend_ends_the_vm_naming_it_and_the_chunk() {
    if skip_without_kvm("vhost-user frozen backend") {
        return;
    }
    let file = Backing::new("frozen", 1 << 30);
    let Some(server) =
        StorageServer::qemu_storage_daemon("vhost-user frozen backend", &file.0, &[])
    else {
        return;
    };
    let (vm, _socket) = start_swapping(&store_of(&server, ",timeout=3"));
    server.freeze();
    let run = vm.finish(LIMIT);
    assert_names_backend_and_chunk(&run, server.uri());
    assert!(run.stderr.contains("went unanswered"), "{}", run.stderr);
}

/// A backend whose device fails every read, then one that fails every
/// write (QEMU's blkdebug): `VIRTIO_BLK_S_IOERR` is retried by the retry
/// policy, then ends the VM naming the backend and the chunk; no chunk is
/// ever read back as zeros.
#[test]
fn an_io_error_status_is_fatal_never_zeros() {
    if skip_without_kvm("vhost-user io error") {
        return;
    }
    for (event, what) in [
        ("read_aio", "read of 2097152 bytes"),
        ("write_aio", "swap out the chunk"),
    ] {
        let file = Backing::new(event, 1 << 30);
        let Some(server) =
            StorageServer::qemu_storage_daemon_failing("vhost-user io error", &file.0, event)
        else {
            return;
        };
        let run = verify_on(&store_of(&server, ""), &[]);
        assert_names_backend_and_chunk(&run, server.uri());
        assert!(run.stderr.contains(what), "{event}: {}", run.stderr);
        assert!(
            run.stderr.contains("VIRTIO_BLK_S_IOERR"),
            "{event}: {}",
            run.stderr
        );
    }
}

#[test]
fn a_device_too_small_for_the_run_is_refused_at_start() {
    if skip_without_kvm("vhost-user too small") {
        return;
    }
    let file = Backing::new("small", 64 << 20);
    let Some(server) = StorageServer::qemu_storage_daemon("vhost-user too small", &file.0, &[])
    else {
        return;
    };
    let run = verify_on(&store_of(&server, ""), &[]);
    assert_ne!(run.status, Some(0));
    assert!(
        run.stderr
            .contains("the backend's device is too small for this run"),
        "{}",
        run.stderr
    );
    let run = verify_on(&format!("vhost-user-blk:{}-missing", server.uri()), &[]);
    assert_ne!(run.status, Some(0));
    assert!(
        run.stderr.contains("start the backend first"),
        "{}",
        run.stderr
    );
}

#[test]
fn the_vhost_user_worker_runs_its_own_seccomp_filter() {
    if skip_without_kvm("vhost-user seccomp") {
        return;
    }
    let file = Backing::new("seccomp", 64 << 20);
    let Some(server) = StorageServer::qemu_storage_daemon("vhost-user seccomp", &file.0, &[])
    else {
        return;
    };
    assert_store_thread_runs_its_filter(&store_of(&server, ""), "vhost-user");
}

/// A virtio-blk disk on the backend's device: `blkcheck` writes, reads
/// back, flushes and discards through it, with and without guest RAM
/// swapped (the disk's data then moves through swapped memory).
#[test]
fn blkcheck_on_a_vhost_user_disk() {
    if skip_without_kvm("vhost-user blkcheck") {
        return;
    }
    let file = Backing::new("disk", 64 << 20);
    let Some(server) = StorageServer::qemu_storage_daemon("vhost-user blkcheck", &file.0, &[])
    else {
        return;
    };
    let disk = format!("vhost-user-blk:{}", server.uri());
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
            &disk,
        ];
        args.extend_from_slice(extra);
        let run = hugevmm(&args, LIMIT);
        run.expect_status(0);
        assert!(
            run.stdout.contains("blkcheck ok sectors=") && run.stdout.contains("capacity=131072"),
            "{extra:?}: {}",
            run.stdout
        );
    }
    check_blkcheck_readonly(&disk);
}

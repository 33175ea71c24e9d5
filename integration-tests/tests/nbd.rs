//! Swap stores and disks on NBD exports, against real servers the tests
//! start on Unix sockets of their own (nbdkit's memory and file plugins,
//! its error filter, qemu-nbd over a file) and a fake one that goes away
//! on cue: overcommitted guests keep every word; a server restarted
//! mid-run, whether killed (SIGKILL) or stopped (SIGTERM), or one that
//! closes its connections after a reply or in the middle of one, is
//! reconnected and nothing is lost; a server gone for good, frozen or
//! failing I/O ends the VM with the chunk's address and the server's name,
//! never with zeros; and an export too small for the run is refused at start.

use blockio::test_support::{FakeNbdServer, Misbehaviour, NbdServer, TlsCertificates};
use integration_tests::*;
use std::path::PathBuf;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

/// A sparse file on a disk filesystem for file-backed servers.
fn backing_file(tag: &str, len_bytes: u64) -> PathBuf {
    let path =
        PathBuf::from("/var/tmp").join(format!("hugevmm-nbd-{}-{tag}.img", std::process::id()));
    let file = std::fs::File::create(&path).expect("create the export's file");
    file.set_len(len_bytes).expect("size the export's file");
    path
}

#[test]
fn verify_at_4x_overcommit_on_nbdkit_memory_and_qemu_nbd() {
    if skip_without_kvm("nbd verify") {
        return;
    }
    if let Some(server) = NbdServer::nbdkit("nbd verify on nbdkit", &["memory", "size=1G"]) {
        let run = verify_on(server.uri(), &[]);
        check_swapped_through(&run, "nbdkit memory");
    }
    let file = backing_file("qemu-nbd", 1 << 30);
    if let Some(server) = NbdServer::qemu_nbd("nbd verify on qemu-nbd", &file) {
        let run = verify_on(server.uri(), &[]);
        check_swapped_through(&run, "qemu-nbd");
    }
    let _ = std::fs::remove_file(&file);
}

/// The same over TLS (`nbds+unix://`, NBD_OPT_STARTTLS): nbdkit with
/// `--tls=require`, and qemu-nbd with `--tls-creds`, which also checks the
/// VM's client certificate. The store is sealed too (TLS guards the link,
/// sealing guards against the server), and no warning is printed.
#[test]
fn verify_at_4x_overcommit_over_tls_on_nbdkit_and_qemu_nbd() {
    if skip_without_kvm("nbd tls verify") {
        return;
    }
    let certs = TlsCertificates::new();
    if let Some(server) =
        NbdServer::nbdkit_tls("nbd tls verify on nbdkit", &certs, &["memory", "size=1G"])
    {
        assert!(server.uri().starts_with("nbds+unix://"));
        let run = verify_on(server.uri(), &[]);
        check_swapped_through(&run, "nbdkit memory over TLS");
        assert!(!run.stderr.contains("warning"), "{}", run.stderr);
        assert_eq!(
            run.stats.as_ref().unwrap().pointer("/swap/store/sealed"),
            Some(&serde_json::Value::Bool(true))
        );
    }
    let file = backing_file("qemu-nbd-tls", 1 << 30);
    if let Some(server) = NbdServer::qemu_nbd_tls("nbd tls verify on qemu-nbd", &certs, &file) {
        let run = verify_on(server.uri(), &[]);
        check_swapped_through(&run, "qemu-nbd over TLS");
    }
    let _ = std::fs::remove_file(&file);
}

/// A TLS server killed and started again mid-run: the reply reader makes
/// a new TLS session under its seccomp filter (random numbers, no files:
/// the certificates were read at start) and nothing is lost.
#[test]
fn a_tls_server_restarted_mid_run_loses_no_word() {
    if skip_without_kvm("nbd tls restart") {
        return;
    }
    let certs = TlsCertificates::new();
    let file = backing_file("restart-nbdkit-tls", 1 << 30);
    let path = file.to_str().unwrap().to_string();
    if let Some(server) = NbdServer::nbdkit_tls("nbd tls restart", &certs, &["file", &path]) {
        restart_mid_run(server, "nbdkit file over TLS", NbdServer::kill);
    }
    let _ = std::fs::remove_file(&file);
}

/// An NBD store seals its pages unless told not to, and says so when told.
#[test]
fn an_nbd_store_is_sealed_unless_told_not_to() {
    if skip_without_kvm("nbd sealed by default") {
        return;
    }
    let Some(server) = NbdServer::nbdkit("nbd sealed by default", &["memory", "size=1G"]) else {
        return;
    };
    let sealed = verify_on(server.uri(), &[]);
    check_swapped_through(&sealed, "nbd, no --swap-encrypt");
    assert_eq!(
        sealed.stats.as_ref().unwrap().pointer("/swap/store/sealed"),
        Some(&serde_json::Value::Bool(true)),
        "an NBD store is sealed by default"
    );
    assert!(
        !sealed.stderr.contains("plaintext"),
        "no warning when sealed: {}",
        sealed.stderr
    );
    let plain = verify_on(server.uri(), &["--swap-encrypt=false"]);
    check_swapped_through(&plain, "nbd, --swap-encrypt=false");
    assert_eq!(
        plain.stats.as_ref().unwrap().pointer("/swap/store/sealed"),
        Some(&serde_json::Value::Bool(false))
    );
    assert!(
        plain
            .stderr
            .contains("in plaintext, protected only by a crc32"),
        "the warning: {}",
        plain.stderr
    );
}

#[test]
fn blkcheck_on_an_nbd_disk() {
    if skip_without_kvm("nbd blkcheck") {
        return;
    }
    let Some(server) = NbdServer::nbdkit("nbd blkcheck", &["memory", "size=64M"]) else {
        return;
    };
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
            server.uri(),
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
    let Some(ro) = NbdServer::nbdkit("nbd blkcheck read-only", &["-r", "memory", "size=8M"]) else {
        return;
    };
    check_blkcheck_readonly(ro.uri());
    // Without ,readonly a read-only export is refused, saying what to do.
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "blkcheck",
            "--mem",
            "128M",
            "--disk",
            ro.uri(),
        ],
        LIMIT,
    );
    assert_ne!(run.status, Some(0));
    assert!(run.stderr.contains("read-only"), "{}", run.stderr);
}

/// Stops `server` mid-run with `stop` (kill: SIGKILL, terminate:
/// SIGTERM), starts it again, and checks that the run lost nothing.
fn restart_mid_run(mut server: NbdServer, what: &str, stop: fn(&mut NbdServer)) {
    let store = format!("{},timeout=120", server.uri());
    let (vm, _socket) = start_swapping(&store);
    stop(&mut server);
    // Down long enough for the vCPUs to wait on it (reads) and the
    // evictor to find it gone (writes); no result depends on how long.
    std::thread::sleep(Duration::from_secs(2));
    server.restart();
    let run = vm.finish(LIMIT);
    run.expect_status(0);
    assert_eq!(
        run.stdout.matches(" ok").count(),
        4,
        "{what}: {}",
        run.stdout
    );
    assert!(!run.stdout.contains("MISMATCH"), "{what}: {}", run.stdout);
    assert!(
        run.stderr.contains("connection lost"),
        "{what}: {}",
        run.stderr
    );
    assert!(run.stderr.contains("reconnected"), "{what}: {}", run.stderr);
    eprintln!(
        "{what}: {} reconnection(s), {} NBD_ESHUTDOWN answer(s) seen",
        run.stderr.matches("reconnected").count(),
        run.stderr.matches("answered NBD_ESHUTDOWN);").count()
    );
}

#[test]
fn a_server_restarted_mid_run_loses_no_word() {
    if skip_without_kvm("nbd restart") {
        return;
    }
    let file = backing_file("restart-nbdkit", 1 << 30);
    let path = file.to_str().unwrap().to_string();
    if let Some(server) = NbdServer::nbdkit("nbd restart nbdkit file", &["file", &path]) {
        restart_mid_run(server, "nbdkit file", NbdServer::kill);
    }
    let _ = std::fs::remove_file(&file);
    let file = backing_file("restart-qemu-nbd", 1 << 30);
    if let Some(server) = NbdServer::qemu_nbd("nbd restart qemu-nbd", &file) {
        restart_mid_run(server, "qemu-nbd", NbdServer::kill);
    }
    let _ = std::fs::remove_file(&file);
}

/// nbdkit stopped the normal way (SIGTERM, what `systemctl stop` sends)
/// mid-run: it answers the requests it holds `NBD_ESHUTDOWN` and waits for
/// its clients to disconnect before it exits. The VM disconnects, waits
/// for it to come back, sends those requests again and loses no word
/// (before: it ended at once with status 125, "Cannot send after transport
/// endpoint shutdown").
#[test]
fn a_server_stopped_with_sigterm_mid_run_loses_no_word() {
    if skip_without_kvm("nbd sigterm restart") {
        return;
    }
    let file = backing_file("sigterm-nbdkit", 1 << 30);
    let path = file.to_str().unwrap().to_string();
    if let Some(server) = NbdServer::nbdkit("nbd sigterm restart", &["file", &path]) {
        restart_mid_run(server, "nbdkit stopped with SIGTERM", NbdServer::terminate);
    }
    let _ = std::fs::remove_file(&file);
}

/// `verify` (512 MiB held to 128 MiB) on a fake server that goes away as
/// `misbehaviour` says, many times over the run: every word comes back.
fn verify_through_a_server_that(misbehaviour: Misbehaviour) {
    let server = FakeNbdServer::start(512 << 20, misbehaviour);
    let store = format!("{},timeout=60", server.uri());
    let run = verify_small_overcommitted(&store, &[]);
    run.expect_status(0);
    assert_eq!(
        run.stdout.matches(" ok").count(),
        2,
        "{misbehaviour:?}: {}",
        run.stdout
    );
    assert!(
        !run.stdout.contains("MISMATCH"),
        "{misbehaviour:?}: {}",
        run.stdout
    );
    assert!(run.stat("/swap/faults/store") > 0, "{misbehaviour:?}");
    eprintln!(
        "{misbehaviour:?}: {} connections, {} closed on purpose",
        server.connections(),
        server.misbehaved()
    );
    assert!(
        server.misbehaved() >= 10,
        "{misbehaviour:?}: the server went away only {} times",
        server.misbehaved()
    );
    assert!(
        run.stderr.contains("reconnected"),
        "{misbehaviour:?}: {}",
        run.stderr
    );
}

#[test]
fn a_server_closing_after_a_reply_loses_no_word() {
    if skip_without_kvm("nbd close after a reply") {
        return;
    }
    verify_through_a_server_that(Misbehaviour::CloseAfterReply { every: 100 });
}

#[test]
fn a_server_closing_mid_reply_loses_no_word() {
    if skip_without_kvm("nbd close mid-reply") {
        return;
    }
    verify_through_a_server_that(Misbehaviour::CloseMidReply { every: 100 });
}

fn assert_names_server_and_chunk(run: &Run, uri: &str) {
    assert_eq!(run.status, Some(125), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(uri), "{}", run.stderr);
    assert!(run.stderr.contains("guest address 0x"), "{}", run.stderr);
    assert!(!run.stdout.contains("MISMATCH"), "{}", run.stdout);
}

#[test]
fn a_server_gone_for_good_ends_the_vm_naming_it_and_the_chunk() {
    if skip_without_kvm("nbd dead server") {
        return;
    }
    let Some(mut server) = NbdServer::nbdkit("nbd dead server", &["memory", "size=1G"]) else {
        return;
    };
    let store = format!("{},timeout=3", server.uri());
    let (vm, _socket) = start_swapping(&store);
    server.kill();
    let run = vm.finish(LIMIT);
    assert_names_server_and_chunk(&run, server.uri());
    assert!(run.stderr.contains("unreachable"), "{}", run.stderr);
    assert!(run.stderr.contains("timeout=SECONDS"), "{}", run.stderr);
}

/// nbdkit frozen mid-run (SIGSTOP): its connection stays up and nothing
/// comes back. After the bound without a reply the VM ends (status 125)
/// naming the server and the chunk, instead of waiting forever.
#[test]
fn a_frozen_server_ends_the_vm_naming_it_and_the_chunk() {
    if skip_without_kvm("nbd frozen server") {
        return;
    }
    let Some(server) = NbdServer::nbdkit("nbd frozen server", &["memory", "size=1G"]) else {
        return;
    };
    let store = format!("{},timeout=3", server.uri());
    let (vm, _socket) = start_swapping(&store);
    server.freeze();
    let run = vm.finish(LIMIT);
    assert_names_server_and_chunk(&run, server.uri());
    // Frozen between replies or in the middle of one: either is named.
    assert!(
        run.stderr.contains("it is frozen, or its host is gone")
            || run
                .stderr
                .contains("the server is frozen, or its host is gone"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("timeout=SECONDS"), "{}", run.stderr);
}

#[test]
fn sigterm_ends_a_vm_waiting_on_a_dead_server() {
    if skip_without_kvm("nbd sigterm") {
        return;
    }
    let Some(mut server) = NbdServer::nbdkit("nbd sigterm", &["memory", "size=1G"]) else {
        return;
    };
    // A bound far beyond the test: only the signal can end this run.
    let store = format!("{},timeout=3600", server.uri());
    let (mut vm, socket) = start_swapping(&store);
    server.kill();
    // Wait until a fault is stuck on the server: the fault count stops
    // moving once every vCPU waits (the API still answers).
    let mut last = 0;
    vm.wait_until("the vCPUs wait on the dead server", LIMIT, || {
        std::thread::sleep(Duration::from_millis(500));
        let faults = ctl(&socket, &["stats"])
            .pointer("/swap/faults/total")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let still = faults == last;
        last = faults;
        still
    });
    vm.signal(libc::SIGTERM);
    let run = vm.finish(LIMIT);
    assert_eq!(run.status, Some(128 + libc::SIGTERM), "{}", run.stderr);
    assert!(!run.stdout.contains("MISMATCH"), "{}", run.stdout);
}

fn with_error_filter(test: &str, rates: [&str; 2]) -> Option<NbdServer> {
    NbdServer::nbdkit(
        test,
        &[
            "--filter=error",
            "memory",
            "size=1G",
            "error=EIO",
            rates[0],
            rates[1],
        ],
    )
}

#[test]
fn eio_from_the_server_is_fatal_never_zeros() {
    if skip_without_kvm("nbd eio") {
        return;
    }
    // Reads fail: the first chunk read back ends the VM.
    if let Some(server) = with_error_filter(
        "nbd eio on reads",
        ["error-pread-rate=100%", "error-pwrite-rate=0%"],
    ) {
        let run = verify_on(server.uri(), &[]);
        assert_names_server_and_chunk(&run, server.uri());
        assert!(
            run.stderr.contains("read of 2097152 bytes"),
            "{}",
            run.stderr
        );
        assert!(run.stderr.contains("Input/output error"), "{}", run.stderr);
    }
    // Writes fail: the first eviction ends the VM.
    if let Some(server) = with_error_filter(
        "nbd eio on writes",
        ["error-pread-rate=0%", "error-pwrite-rate=100%"],
    ) {
        let run = verify_on(server.uri(), &[]);
        assert_names_server_and_chunk(&run, server.uri());
        assert!(run.stderr.contains("swap out the chunk"), "{}", run.stderr);
        assert!(run.stderr.contains("Input/output error"), "{}", run.stderr);
    }
}

#[test]
fn an_export_too_small_for_the_run_is_refused_at_start() {
    if skip_without_kvm("nbd too small") {
        return;
    }
    let Some(server) = NbdServer::nbdkit("nbd too small", &["memory", "size=64M"]) else {
        return;
    };
    let run = verify_on(server.uri(), &[]);
    assert_ne!(run.status, Some(0));
    assert!(
        run.stderr.contains("holds 67108864 bytes"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("can need"), "{}", run.stderr);
    assert!(
        !run.stdout.contains("verify vcpu"),
        "the guest must not run"
    );
}

#[test]
fn malformed_nbd_uris_are_refused_saying_the_form() {
    for (flag, value) in [
        ("--swap-store", "nbd:///swap"),
        ("--swap-store", "nbd+unix:///swap"),
        ("--disk", "nbd://h:99999/x"),
    ] {
        let run = hugevmm(
            &["run", "--payload", "hello", "--mem", "64M", flag, value],
            LIMIT,
        );
        assert_ne!(run.status, Some(0));
        assert!(
            run.stderr.contains("nbd+unix:///EXPORT?socket=PATH"),
            "{flag} {value}: {}",
            run.stderr
        );
    }
}

#[test]
fn the_nbd_reader_thread_runs_its_own_seccomp_filter() {
    if skip_without_kvm("nbd seccomp") {
        return;
    }
    let Some(server) = NbdServer::nbdkit("nbd seccomp", &["memory", "size=64M"]) else {
        return;
    };
    assert_store_thread_runs_its_filter(server.uri(), "nbd");
}

/// `--swap-encrypt` on an NBD store: the export (nbdkit's file plugin, so
/// the test can read what the server keeps) holds none of the pages
/// `verify` leaves in it without encryption, and the guest reads back
/// every word through the sealed NBD store.
#[test]
fn an_encrypted_nbd_store_leaves_no_guest_page_on_the_server() {
    if skip_without_kvm("encrypted nbd store") {
        return;
    }
    for encrypt in [false, true] {
        let file = backing_file(if encrypt { "sealed" } else { "plain" }, 1 << 30);
        let file_arg = format!("file={}", file.display());
        let Some(server) = NbdServer::nbdkit("encrypted nbd store", &["file", &file_arg]) else {
            let _ = std::fs::remove_file(&file);
            return;
        };
        // Sealing is the default on NBD: the plain run asks for plaintext.
        let extra: &[&str] = if encrypt {
            &[]
        } else {
            &["--swap-encrypt=false"]
        };
        let run = verify_small_overcommitted(server.uri(), extra);
        run.expect_status(0);
        assert_eq!(run.stdout.matches(" ok").count(), 2, "{}", run.stdout);
        assert!(run.stat("/swap/evictions") >= 256, "too few evictions");
        let sealed = run.stats.as_ref().unwrap().pointer("/swap/store/sealed");
        assert_eq!(sealed, Some(&serde_json::Value::Bool(encrypt)));
        drop(server);
        let image = std::fs::read(&file).expect("read the export's file");
        let _ = std::fs::remove_file(&file);
        let found = verify_pages_in(&image);
        eprintln!("nbd store, encrypt={encrypt}: {found} pages shaped as verify's");
        if encrypt {
            assert_eq!(found, 0, "guest pages in the clear on the NBD server");
        } else {
            assert!(
                found > 1000,
                "the scan finds the plain run's pages: {found}"
            );
        }
    }
}

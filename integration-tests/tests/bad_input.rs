//! Bad input, as a careless or hostile user gives it: every case is
//! refused with a message that names the problem and what to do, before
//! the guest runs and before anything the user named is written; signals
//! end a run cleanly; ending a VM while a disk write is in flight (held by
//! an NBD server) never puts zeros on its disk.

use integration_tests::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Runs `hugevmm run ARGS` and checks it refused them (status 1) with a
/// message containing `want`, before the guest printed anything.
fn refused(args: &[&str], want: &str) {
    // Not through `hugevmm()`, which adds a --stats-json of its own.
    let mut cmd = std::process::Command::new(hugevmm_bin());
    cmd.arg("run").args(args);
    let output = run_with_limit(cmd, LIMIT);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "{args:?} must be refused\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        stderr.contains(want),
        "{args:?}: the message must say {want:?}:\n{stderr}"
    );
    assert!(
        stdout.is_empty(),
        "{args:?}: the guest ran before the options were refused:\n{stdout}"
    );
}

#[test]
fn special_and_oversized_input_files_are_refused_by_name() {
    refused(
        &["--payload-file", "/dev/zero"],
        "--payload-file /dev/zero is a character device, not a regular file",
    );
    refused(&["--payload-file", "/tmp"], "/tmp is a directory");
    let fifo = temp_path("payload.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path only.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    refused(&["--payload-file", fifo.to_str().unwrap()], "is a FIFO");
    std::fs::remove_file(&fifo).unwrap();
    // A sparse file one byte larger than guest RAM: refused from its size,
    // without reading 64 MiB.
    let big = temp_path("big-initrd");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    refused(
        &["--mem", "64M", "--payload-file", big.to_str().unwrap()],
        "more than the 64 MiB it must fit in",
    );
    std::fs::remove_file(&big).unwrap();
}

#[test]
fn kernels_and_payloads_given_for_each_other_are_refused() {
    let payload = temp_path("hello.elf");
    std::fs::write(&payload, payloads::find("hello").unwrap().elf).unwrap();
    refused(
        &["--kernel", payload.to_str().unwrap()],
        "is a hugevmm payload (an ELF linked at low addresses), not a Linux kernel: run it with --payload-file",
    );
    std::fs::remove_file(&payload).unwrap();
    let kernel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/linux-kernel/vmlinuz");
    if !kernel.exists() {
        skip(
            "kernels_and_payloads_given_for_each_other_are_refused (kernel as payload)",
            Resource::Kernel,
            "no target/linux-kernel/vmlinuz; run .ci/fetch-kernel",
        );
        return;
    }
    refused(
        &["--payload-file", kernel.to_str().unwrap()],
        "is a Linux kernel, not a payload: boot it with --kernel",
    );
}

#[test]
fn options_that_do_not_apply_or_are_out_of_range_are_refused() {
    let hello = ["--payload", "hello", "--mem", "64M"];
    let cases: &[(&[&str], &str)] = &[
        (
            &["--console-log", "/tmp/c.log"],
            "--console-log applies to --kernel only",
        ),
        (
            &["--initrd", "/etc/hostname"],
            "--initrd applies to --kernel only",
        ),
        (
            &["--cmdline", "quiet"],
            "--cmdline applies to --kernel only",
        ),
        (
            &["--virtio-announce", "acpi"],
            "--virtio-announce applies to --kernel only",
        ),
        (
            &["--swap-unit", "4k"],
            "--swap-unit configures the swap engine",
        ),
        (
            &["--fault-threads", "2"],
            "--fault-threads configures the swap engine",
        ),
        (&["--pageout"], "--pageout configures the swap engine"),
        (
            &["--mem-limit", "32M", "--fault-threads", "0"],
            "--fault-threads 0 is out of range: give 1 to 32",
        ),
        (
            &["--mem-limit", "32M", "--fault-threads", "1000"],
            "--fault-threads 1000 is out of range",
        ),
        (
            &["--mem-limit", "32M", "--fault-thread-nice", "100"],
            "--fault-thread-nice 100 is out of range: give -20",
        ),
        (
            &["--mem-limit", "32M", "--fault-thread-nice", "-100"],
            "--fault-thread-nice -100 is out of range",
        ),
        (
            &["--stats-interval", "10"],
            "--stats-interval sets the sampling of --stats-timeline",
        ),
        (
            &["--stats-timeline", "/tmp/t.jsonl", "--stats-interval", "0"],
            "--stats-interval 0 is out of range",
        ),
        (
            &["--mem-limit", "128M"],
            "invalid --mem-limit: 128 MiB is more than the guest's 64 MiB of RAM",
        ),
        (
            &["--balloon-target", "4M"],
            "--balloon-target needs --balloon",
        ),
        (&["--vcpus", "0"], "--vcpus 0 is out of range"),
        (&["--timeout", "0"], "--timeout must be a positive number"),
    ];
    for (extra, want) in cases {
        let mut args = hello.to_vec();
        args.extend_from_slice(extra);
        refused(&args, want);
    }
    let kernel_args = ["--kernel", "/etc/hostname", "--payload-args", "x=1"];
    refused(&kernel_args, "--payload-args applies to payloads only");
}

#[test]
fn an_unusable_output_path_fails_before_the_guest_runs_and_the_status_file_says_config() {
    let status_file = temp_path("status.json");
    for (option, path, want) in [
        (
            "--stats-json",
            "/proc/x",
            "cannot open --stats-json /proc/x for writing",
        ),
        (
            "--stats-timeline",
            "/nonexistent-dir/t.jsonl",
            "its directory /nonexistent-dir cannot be used",
        ),
        ("--stats-json", "/tmp", "--stats-json /tmp is a directory"),
    ] {
        refused(
            &[
                "--payload",
                "hello",
                "--mem",
                "64M",
                option,
                path,
                "--status-file",
                status_file.to_str().unwrap(),
            ],
            want,
        );
        let status: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&status_file).unwrap()).unwrap();
        assert_eq!(status["exit_kind"], "config", "{status}");
        assert_eq!(status["exit_status"], 1, "{status}");
        assert!(
            status["message"].as_str().unwrap().contains(want),
            "{status}"
        );
    }
    std::fs::remove_file(&status_file).unwrap();
}

#[test]
fn exit_kind_tells_a_payload_status_from_hugevmm_s_own() {
    if skip_without_kvm("exit_kind_tells_a_payload_status_from_hugevmm_s_own") {
        return;
    }
    let status_file = temp_path("status.json");
    // A payload that exits 1, the status hugevmm uses for configuration
    // errors: only the kind tells them apart.
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "selftest",
            "--mem",
            "64M",
            "--payload-args",
            "exit=1",
            "--status-file",
            status_file.to_str().unwrap(),
        ],
        LIMIT,
    );
    run.expect_status(1);
    let stats = run.stats.as_ref().expect("stats");
    assert_eq!(stats["exit_kind"], "payload", "{stats}");
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status_file).unwrap()).unwrap();
    assert_eq!(status["exit_kind"], "payload", "{status}");
    assert_eq!(status["exit_status"], 1, "{status}");
    std::fs::remove_file(&status_file).unwrap();
}

#[test]
fn each_stop_signal_ends_a_swapping_run_cleanly() {
    if skip_without_kvm("each_stop_signal_ends_a_swapping_run_cleanly") {
        return;
    }
    for (signo, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let (vm, socket) = start_with_api_socket(&[
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
            "passes=100000",
        ]);
        // Swapping under way before the signal.
        let mut swapped = false;
        for _ in 0..600 {
            let stats = ctl(&socket, &["stats"]);
            if stats["swap"]["evictions"].as_u64().unwrap_or(0) > 0 {
                swapped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(swapped, "{name}: the guest never swapped");
        vm.signal(signo);
        let run = vm.finish(LIMIT);
        run.expect_status(128 + signo);
        assert!(
            run.stderr
                .contains(&format!("ending the VM: {name} received")),
            "{name}: {}",
            run.stderr
        );
        assert!(!run.stdout.contains("MISMATCH"), "{name}: {}", run.stdout);
        let stats = run
            .stats
            .as_ref()
            .expect("--stats-json written after a signal");
        assert_eq!(stats["exit_kind"], "signal", "{name}: {stats}");
        assert!(stats["swap"]["evictions"].as_u64().unwrap() > 0, "{stats}");
        assert!(
            !socket.exists(),
            "{name}: the control socket was left behind"
        );
    }
}

/// What a disk sector written by `blkcheck stream=` holds in `round`.
fn stream_sector(round: u64, sector: u64) -> [u8; 512] {
    let mut bytes = [0u8; 512];
    bytes[..8].copy_from_slice(&0x4d41_4552_5453_4b42u64.to_le_bytes());
    bytes[8..16].copy_from_slice(&round.to_le_bytes());
    bytes[16..24].copy_from_slice(&sector.to_le_bytes());
    for (i, b) in bytes.iter_mut().enumerate().skip(24) {
        *b = (round
            .wrapping_mul(31)
            .wrapping_add(sector * 7)
            .wrapping_add(i as u64)
            | 1) as u8;
    }
    bytes
}

/// The round in a stream sector's header (0 if it has none).
fn round_of(sector_bytes: &[u8]) -> u64 {
    if sector_bytes[..8] != 0x4d41_4552_5453_4b42u64.to_le_bytes() {
        return 0;
    }
    u64::from_le_bytes(sector_bytes[8..16].try_into().unwrap())
}

/// One request in nbdkit's log filter's file: `connection=C Write id=N
/// offset=0x.. count=0x..` when it arrives, `connection=C ...Write id=N
/// return=R` when it is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LoggedWrite {
    connection: String,
    id: String,
    offset_bytes: u64,
    count_bytes: u64,
    /// The `return=` of its answer, None while it is not answered.
    returned: Option<String>,
}

/// The writes in an nbdkit log file, in arrival order.
fn logged_writes(log: &Path) -> Vec<LoggedWrite> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let field = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_string)
    };
    let hex = |v: Option<String>| {
        v.and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
            .unwrap_or(0)
    };
    let mut writes: Vec<LoggedWrite> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (Some(connection), Some(id)) = (field(line, "connection="), field(line, "id=")) else {
            continue;
        };
        if words.contains(&"Write") {
            writes.push(LoggedWrite {
                connection,
                id,
                offset_bytes: hex(field(line, "offset=")),
                count_bytes: hex(field(line, "count=")),
                returned: None,
            });
        } else if words.contains(&"...Write") {
            let returned = field(line, "return=").unwrap_or_default();
            if let Some(w) = writes
                .iter_mut()
                .find(|w| w.connection == connection && w.id == id && w.returned.is_none())
            {
                w.returned = Some(returned);
            }
        }
    }
    writes
}

/// Sends one command to nbdkit's pause filter (`p` pause, `r` resume) and
/// waits for its answer (the letter in upper case; `P` once the requests
/// received before the pause were answered).
fn pause_filter(control: &Path, command: u8) {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(control)
        .unwrap_or_else(|e| panic!("nbdkit's pause control {}: {e}", control.display()));
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    stream.write_all(&[command]).unwrap();
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).unwrap();
    assert_eq!(
        answer[0],
        command.to_ascii_uppercase(),
        "pause filter answer"
    );
}

/// The guest streams swapped-out memory to its disk, an NBD export that
/// nbdkit serves through its log filter (every request's arrival and
/// answer) and its pause filter (requests that arrive while paused are
/// held). The test pauses the server, waits until the log shows a write
/// of the guest's that arrived and is held unanswered, ends the VM with
/// `end` while it is held (and checks it still is), then lets it through.
/// Every sector must then hold its old content or a whole sector of some
/// round, never zeros (a device that read guest memory nobody served any
/// more would write zeros), and a held write that was answered as done
/// must be on the disk whole.
fn disk_writes_in_flight_survive(test: &str, end: impl FnOnce(&Background, &Path)) {
    if skip_without_kvm(test) {
        return;
    }
    const OLD: u8 = 0xaa;
    let disk_bytes = 32usize << 20;
    let disk = temp_path("stream-disk.img");
    std::fs::write(&disk, vec![OLD; disk_bytes]).unwrap();
    let log = temp_path("stream-disk.nbdkit-log");
    let control = temp_path("stream-disk.pause");
    let Some(mut server) = blockio::test_support::NbdServer::nbdkit(
        test,
        &[
            "--filter=log",
            "--filter=pause",
            "file",
            disk.to_str().unwrap(),
            &format!("logfile={}", log.display()),
            &format!("pause-control={}", control.display()),
        ],
    ) else {
        std::fs::remove_file(&disk).unwrap();
        return;
    };
    let disk_arg = server.uri().to_string();
    let (vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "blkcheck",
        "--mem",
        "256M",
        "--mem-limit",
        "16M",
        "--disk",
        &disk_arg,
        "--payload-args",
        "stream=1000000 stream_mib=32",
    ]);
    // Wait until round 3 reached the disk: writes from memory that was
    // swapped out (32 MiB of buffer under a 16 MiB limit) are going on.
    let mut first = [0u8; 512];
    let mut seen_round = 0;
    for _ in 0..2400 {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(&disk).unwrap();
        f.read_exact_at(&mut first, 0).unwrap();
        seen_round = round_of(&first);
        if seen_round >= 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        seen_round >= 3,
        "{test}: the guest's stream never reached round 3 on the disk"
    );
    let evictions = ctl(&socket, &["stats"])["swap"]["evictions"]
        .as_u64()
        .unwrap();
    assert!(
        evictions > 0,
        "{test}: the stream buffer was never swapped out"
    );
    pause_filter(&control, b'p');
    // A write logged but unanswered at the moment of the pause may still
    // be inside the server and be answered a moment later: take one only
    // once the log has shown no new answer for a second, when the server
    // really holds it.
    let mut held = None;
    let mut answered_before = usize::MAX;
    let mut quiet_since = std::time::Instant::now();
    for _ in 0..2400 {
        let writes = logged_writes(&log);
        let answered = writes.iter().filter(|w| w.returned.is_some()).count();
        if answered != answered_before {
            answered_before = answered;
            quiet_since = std::time::Instant::now();
        } else if quiet_since.elapsed() >= Duration::from_secs(1) {
            held = writes.into_iter().find(|w| w.returned.is_none());
            if held.is_some() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let held = held.unwrap_or_else(|| {
        panic!("{test}: no guest write arrived at the paused server, so none would be in flight")
    });
    // What the held write's sectors hold before it lands: the round
    // before its own (the server is idle while paused).
    let sectors_of = |w: &LoggedWrite| {
        let first = w.offset_bytes as usize / 512;
        first..first + w.count_bytes as usize / 512
    };
    let before: Vec<u64> = {
        let image = std::fs::read(&disk).unwrap();
        sectors_of(&held)
            .map(|s| round_of(&image[s * 512..(s + 1) * 512]))
            .collect()
    };
    end(&vm, &socket);
    let still = logged_writes(&log);
    assert!(
        still.contains(&held),
        "{test}: the held write {held:?} was answered while the server was paused: {still:?}"
    );
    pause_filter(&control, b'r');
    let run = vm.finish(LIMIT);
    assert!(
        run.status.is_some(),
        "{test}: hugevmm died by a signal\n{}",
        run.stderr
    );
    // Every request the server holds is answered before it stops.
    server.terminate();
    let fate = logged_writes(&log)
        .into_iter()
        .find(|w| w.connection == held.connection && w.id == held.id)
        .and_then(|w| w.returned);
    eprintln!("{test}: the write in flight when the VM was ended: {held:?}, answered {fate:?}");
    let image = std::fs::read(&disk).unwrap();
    std::fs::remove_file(&disk).unwrap();
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&control);
    let mut rounds_seen = std::collections::BTreeMap::new();
    for (sector, bytes) in image.chunks(512).enumerate() {
        if bytes.iter().all(|b| *b == OLD) {
            *rounds_seen.entry(0).or_insert(0u64) += 1;
            continue;
        }
        let round = round_of(bytes);
        assert!(
            round > 0 && bytes == stream_sector(round, sector as u64),
            "{test}: sector {sector} holds neither its old content nor a whole stream sector (zeros: {}); first bytes {:02x?}\n{}",
            bytes.iter().all(|b| *b == 0),
            &bytes[..32],
            run.stderr
        );
        *rounds_seen.entry(round).or_insert(0u64) += 1;
    }
    if fate.as_deref() == Some("0") {
        for (sector, was) in sectors_of(&held).zip(before) {
            let now = round_of(&image[sector * 512..(sector + 1) * 512]);
            assert!(
                now > was,
                "{test}: the held write {held:?} was answered as done, but sector {sector} still holds round {now} (before it: {was})"
            );
        }
    }
    eprintln!("{test}: sectors per round on the disk: {rounds_seen:?}");
}

#[test]
fn disk_writes_in_flight_when_a_signal_ends_the_vm_never_put_zeros_on_the_disk() {
    disk_writes_in_flight_survive(
        "disk_writes_in_flight_when_a_signal_ends_the_vm_never_put_zeros_on_the_disk",
        |vm, _| vm.signal(libc::SIGTERM),
    );
}

#[test]
fn disk_writes_in_flight_when_quit_ends_the_vm_never_put_zeros_on_the_disk() {
    disk_writes_in_flight_survive(
        "disk_writes_in_flight_when_quit_ends_the_vm_never_put_zeros_on_the_disk",
        |_, socket| {
            ctl(socket, &["quit"]);
        },
    );
}

//! The API socket under a real VM: clients that connect and say nothing,
//! or trickle a byte at a time, block neither other clients nor the VM,
//! and are dropped with a 408; requests from several clients run at once.

use integration_tests::*;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

/// How long a raw client waits for the server's line before the test
/// fails: a bound against hanging, not a measurement (the server's idle
/// timeout is 10 s).
const GUARD: Duration = Duration::from_secs(120);

/// The response the server sends before closing a connection (empty if
/// it closed without one).
fn last_words(stream: &UnixStream) -> String {
    stream.set_read_timeout(Some(GUARD)).unwrap();
    let mut text = Vec::new();
    match (&*stream).read_to_end(&mut text) {
        Ok(_) => {}
        // Closed with our bytes unread: Linux reports a reset.
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the server never dropped the client: {e}"),
    }
    String::from_utf8_lossy(&text).into_owned()
}

fn assert_dropped_for_idling(stream: &UnixStream, who: &str) {
    let reply = last_words(stream);
    assert!(reply.starts_with("HTTP/1.1 408 "), "{who}: {reply}");
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no complete request"),
        "{who}: {body}"
    );
}

#[test]
fn silent_and_trickling_clients_block_nobody() {
    if skip_without_kvm("silent_and_trickling_clients_block_nobody") {
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
        "64M",
        // Far more passes than the test waits for: `quit` ends it.
        "--payload-args",
        "passes=100000",
    ]);
    // Connected first and silent: a server of one client at a time would
    // serve only it, and `ctl` would time out.
    let silent = UnixStream::connect(&socket).unwrap();
    let stats = ctl(&socket, &["stats"]);
    assert_eq!(stats["vcpus"], 2, "{stats}");

    // Two pageouts at once from two clients: both answer (one after the
    // other inside the VMM), while a third client reads stats.
    let pageouts: Vec<_> = (0..2)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || ctl(&socket, &["pageout"]))
        })
        .collect();
    assert!(ctl(&socket, &["stats"])["elapsed_s"].is_f64());
    for pageout in pageouts {
        let reply = pageout.join().unwrap();
        assert!(reply["written_bytes"].as_u64().is_some(), "{reply}");
    }

    // A byte every half second, never a whole request.
    let trickling = UnixStream::connect(&socket).unwrap();
    let mut writer = trickling.try_clone().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let trickle_done = done.clone();
    let trickler = std::thread::spawn(move || {
        let mut bytes = b"GET /stats HTTP/1.1\r\n".iter().cycle();
        while !trickle_done.load(Ordering::Relaxed)
            && writer.write_all(&[*bytes.next().unwrap()]).is_ok()
        {
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    assert!(ctl(&socket, &["stats"])["elapsed_s"].is_f64());
    assert_dropped_for_idling(&trickling, "trickling client");
    done.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
    assert_dropped_for_idling(&silent, "silent client");

    assert_eq!(ctl(&socket, &["quit"])["quitting"], true);
    let run = vm.finish(LIMIT);
    run.expect_status(0);
    assert!(!run.stdout.contains("MISMATCH"), "{}", run.stdout);
    assert!(!socket.exists(), "the socket is removed");
}

/// A terminal: (master, slave) of a new pseudo-terminal pair.
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt returns a new descriptor or -1; it is owned by
    // the File made from it below.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    assert!(
        master >= 0,
        "posix_openpt: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: master is a descriptor of ours, not owned elsewhere.
    let master = unsafe { std::fs::File::from_raw_fd(master) };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&master);
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: fd is an open pty master; ptsname_r writes at most
    // name.len() bytes into the buffer, NUL included.
    let named = unsafe {
        libc::grantpt(fd) == 0
            && libc::unlockpt(fd) == 0
            && libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) == 0
    };
    assert!(named, "pty: {}", std::io::Error::last_os_error());
    // SAFETY: ptsname_r NUL-terminated the buffer.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    (master, slave)
}

/// A `hugevmm run` started here, its stderr on a pipe or on a terminal,
/// read as it comes; killed if the test ends first.
struct Spawned {
    child: std::process::Child,
    stderr: Arc<std::sync::Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    socket: std::path::PathBuf,
    stats: std::path::PathBuf,
}

impl Spawned {
    /// `hugevmm run ARGS --api-socket S --stats-json J` with `env` set;
    /// waits until the socket accepts connections.
    fn start(args: &[&str], env: &[(&str, &str)], on_terminal: bool) -> Self {
        let socket = temp_path("api.sock");
        let stats = temp_path("stats.json");
        let mut cmd = std::process::Command::new(hugevmm_bin());
        cmd.arg("run")
            .args(args)
            .arg("--api-socket")
            .arg(&socket)
            .arg("--stats-json")
            .arg(&stats)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        let source: Box<dyn Read + Send> = if on_terminal {
            let (master, slave) = pty();
            cmd.stderr(slave);
            Box::new(master)
        } else {
            cmd.stderr(std::process::Stdio::piped());
            Box::new(std::io::empty())
        };
        let mut child = cmd.spawn().expect("spawn hugevmm");
        // The slave end went with `cmd`: the master reads EIO once the
        // child (the last holder) is gone.
        drop(cmd);
        let source = match child.stderr.take() {
            Some(pipe) => Box::new(pipe) as Box<dyn Read + Send>,
            None => source,
        };
        let stderr = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = stderr.clone();
        let reader = std::thread::spawn(move || {
            let mut source = source;
            let mut buf = [0u8; 4096];
            while let Ok(n) = source.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let mut vm = Spawned {
            child,
            stderr,
            reader: Some(reader),
            socket,
            stats,
        };
        vm.wait_until("the API socket", |_, socket| {
            UnixStream::connect(socket).is_ok()
        });
        vm
    }

    /// What it printed on stderr so far (a terminal's \r\n as \n).
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).replace("\r\n", "\n")
    }

    /// Waits until `ready(stderr, socket)` holds; panics if the VM ends
    /// first or the generous deadline passes.
    fn wait_until(&mut self, what: &str, ready: impl Fn(&str, &std::path::Path) -> bool) {
        let start = std::time::Instant::now();
        while !ready(&self.stderr(), &self.socket) {
            let ended = self.child.try_wait().unwrap();
            assert!(
                ended.is_none() && start.elapsed() < LIMIT,
                "never saw {what} ({ended:?})\n--- stderr\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the end: the status, stderr and the stats.
    fn finish(mut self) -> (Option<i32>, String, serde_json::Value) {
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(start.elapsed() < LIMIT, "did not end\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(50));
        };
        self.reader.take().unwrap().join().unwrap();
        let stats = std::fs::read_to_string(&self.stats).expect("--stats-json written");
        let _ = std::fs::remove_file(&self.stats);
        (
            status.code(),
            self.stderr(),
            serde_json::from_str(&stats).unwrap(),
        )
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The status lines in `stderr` (`hugevmm: N s: ...`).
fn status_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.strip_prefix("hugevmm: ")
                .and_then(|rest| rest.split_once(" s: "))
                .is_some_and(|(secs, _)| secs.parse::<u64>().is_ok())
        })
        .collect()
}

/// A long run on a terminal prints a status line every few seconds (what
/// is resident, faults, store I/O); on a pipe, and with --quiet, it does
/// not. The summary names what ended the run: SIGTERM, quit.
#[test]
fn a_status_line_on_a_terminal_only_and_the_end_named() {
    if skip_without_kvm("a_status_line_on_a_terminal_only_and_the_end_named") {
        return;
    }
    // The engine without a cap: faults, no swapping (light on the CPU).
    let args = [
        "--payload",
        "verify",
        "--mem",
        "64M",
        "--mem-limit",
        "none",
        "--payload-args",
        "passes=1000000",
    ];
    let quiet_args: Vec<&str> = args.iter().copied().chain(["--quiet"]).collect();
    // Started first, so each has run at least as long as the terminal one
    // when it has printed its lines.
    let piped = Spawned::start(&args, &[], false);
    let quiet = Spawned::start(&quiet_args, &[], true);
    let mut shown = Spawned::start(&args, &[], true);
    shown.wait_until("two status lines", |e, _| status_lines(e).len() >= 2);

    assert_eq!(ctl(&piped.socket, &["quit"])["quitting"], true);
    assert_eq!(ctl(&quiet.socket, &["quit"])["quitting"], true);
    shown.child_signal(libc::SIGTERM);

    let (status, stderr, _) = shown.finish();
    assert_eq!(status, Some(128 + libc::SIGTERM), "{stderr}");
    let lines = status_lines(&stderr);
    for line in &lines {
        assert!(
            line.contains(": resident ")
                && line.contains(" (no limit), ")
                && line.contains(" faults (")
                && line.contains("store read ")
                && line.contains(", written "),
            "{line}"
        );
    }
    assert!(
        stderr.contains("hugevmm: verify ended by SIGTERM (status 143) after "),
        "{stderr}"
    );
    for (vm, what) in [(piped, "stderr on a pipe"), (quiet, "--quiet")] {
        let (status, stderr, stats) = vm.finish();
        assert_eq!(status, Some(0), "{what}: {stderr}");
        // It ran past the first line's time: a line would have come.
        assert!(
            stats["elapsed_s"].as_f64().unwrap() > 5.0,
            "{what}: {stats}"
        );
        assert_eq!(
            status_lines(&stderr),
            Vec::<&str>::new(),
            "{what}: {stderr}"
        );
        assert!(
            stderr.contains("hugevmm: verify ended by quit (status 0) after "),
            "{what}: {stderr}"
        );
    }
}

impl Spawned {
    fn child_signal(&self, signo: i32) {
        // SAFETY: kill has no memory effects; the child has not been waited
        // for, so its pid is not reused.
        let ret = unsafe { libc::kill(self.child.id() as libc::pid_t, signo) };
        assert_eq!(ret, 0, "kill: {}", std::io::Error::last_os_error());
    }
}

/// `hugevmm ARGS` with `env` set, to the end.
fn hugevmm_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = std::process::Command::new(hugevmm_bin());
    cmd.args(args).envs(env.iter().copied());
    let output = run_with_limit(cmd, LIMIT);
    Run {
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        stats: None,
    }
}

/// An error prints its OS cause once, not once in the message and once
/// more as the chain's last link.
#[test]
fn an_error_says_its_cause_once() {
    let missing = temp_path("no-such-payload");
    let run = hugevmm(&["run", "--payload-file", missing.to_str().unwrap()], LIMIT);
    run.expect_status(1);
    assert_eq!(
        run.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("check that it exists and is readable"),
        "{}",
        run.stderr
    );
}

/// `HUGEVMM_LOG` that is no level is refused, naming the levels, as a
/// configuration error (status 1, the status file says `config`).
#[test]
fn an_unknown_log_level_is_refused() {
    let status_file = temp_path("status.json");
    let run = hugevmm_env(
        &[
            "run",
            "--payload",
            "hello",
            "--status-file",
            status_file.to_str().unwrap(),
        ],
        &[("HUGEVMM_LOG", "bogus")],
    );
    run.expect_status(1);
    assert!(
        run.stderr.contains(
            "hugevmm: error: HUGEVMM_LOG=bogus is not a log level: give error, warn (the default), info, debug, trace or off"
        ),
        "{}",
        run.stderr
    );
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status_file).unwrap()).unwrap();
    let _ = std::fs::remove_file(&status_file);
    assert_eq!(status["exit_kind"], "config", "{status}");
    // Other commands too.
    let run = hugevmm_env(&["payloads"], &[("HUGEVMM_LOG", "verbose")]);
    run.expect_status(1);
    assert!(run.stderr.contains("HUGEVMM_LOG=verbose"), "{}", run.stderr);
    // A level is taken in any case; empty is the default.
    hugevmm_env(&["payloads"], &[("HUGEVMM_LOG", "DEBUG")]).expect_status(0);
    hugevmm_env(&["payloads"], &[("HUGEVMM_LOG", "")]).expect_status(0);
}

/// `HUGEVMM_LOG=info` shows what a user follows a run by: the store, the
/// engine's start, limit changes; `debug` adds the policy's decisions,
/// the first ones each, then at most a line a second that says how many
/// went unlogged.
#[test]
fn log_levels_show_the_engine_at_work() {
    if skip_without_kvm("log_levels_show_the_engine_at_work") {
        return;
    }
    let mut vm = Spawned::start(
        &[
            "--payload",
            "verify",
            "--vcpus",
            "2",
            "--mem",
            "128M",
            "--mem-limit",
            "64M",
            "--payload-args",
            "passes=1000000",
        ],
        &[("HUGEVMM_LOG", "info")],
        false,
    );
    ctl(&vm.socket, &["mem-limit", "32M"]);
    vm.wait_until("the limit change", |e, _| {
        e.contains("swap engine: memory limit 64 MiB -> 32 MiB")
    });
    ctl(&vm.socket, &["mem-limit", "none"]);
    vm.wait_until("the limit lifted", |e, _| {
        e.contains("swap engine: memory limit 32 MiB -> none")
    });
    ctl(&vm.socket, &["quit"]);
    let (status, stderr, _) = vm.finish();
    assert_eq!(status, Some(0), "{stderr}");
    for said in [
        "hugevmm: info: swap::engine: swap store: ",
        "hugevmm: info: swap::engine: swap engine: started over 128 MiB of guest RAM (THP), unit auto",
        "limit 64 MiB, 1 fault thread(s)",
    ] {
        assert!(stderr.contains(said), "no '{said}' in\n{stderr}");
    }
    assert!(!stderr.contains("hugevmm: debug: "), "{stderr}");

    // Every restore splits (2m unit, the test knob): thousands of splits.
    let mut vm = Spawned::start(
        &[
            "--payload",
            "verify",
            "--mem",
            "128M",
            "--mem-limit",
            "64M",
            "--swap-unit",
            "2m",
            "--force-split-every",
            "1",
            "--payload-args",
            "passes=1000000",
        ],
        &[("HUGEVMM_LOG", "debug")],
        false,
    );
    vm.wait_until("a summarized split line", |e, _| {
        e.contains("more since the last such line")
    });
    ctl(&vm.socket, &["quit"]);
    let (status, stderr, stats) = vm.finish();
    assert_eq!(status, Some(0), "{stderr}");
    let split_lines = stderr
        .lines()
        .filter(|l| l.contains("swap engine: split the "))
        .count() as u64;
    let splits = stats["swap"]["split"]["splits_by_origin"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum::<u64>();
    let elapsed_s = stats["elapsed_s"].as_f64().unwrap();
    // The first 20, then at most one a second.
    assert!(
        split_lines > 20 && split_lines <= 20 + elapsed_s.ceil() as u64 + 1,
        "{split_lines} split lines in {elapsed_s} s for {splits} splits"
    );
    assert!(splits > split_lines, "{splits} splits, {split_lines} lines");
}

/// What the errors suggest is taken: `--mem-limit none` (the limit's
/// error offers it) runs the engine without a cap, in a file too; a host
/// name for --metrics-addr is resolved.
#[test]
fn suggestions_are_accepted() {
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64M",
            "--mem-limit",
            "128M",
        ],
        LIMIT,
    );
    run.expect_status(1);
    assert!(run.stderr.contains("`none`"), "{}", run.stderr);
    let run = hugevmm(
        &["run", "--payload", "hello", "--metrics-addr", "localhost"],
        LIMIT,
    );
    run.expect_status(2);
    assert!(run.stderr.contains("e.g. 127.0.0.1:9800"), "{}", run.stderr);
    if skip_without_kvm("suggestions_are_accepted") {
        return;
    }
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64M",
            "--mem-limit",
            "none",
            "--metrics-addr",
            "localhost:0",
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert!(run.stats.as_ref().unwrap()["swap"]["mem_limit_bytes"].is_null());
    assert!(run.stat("/swap/faults/total") > 0);
    let config = temp_file(
        "none.json",
        r#"{"payload": "hello", "mem": "64M", "mem-limit": "none"}"#,
    );
    let run = hugevmm(&["run", "--config", config.to_str().unwrap()], LIMIT);
    let _ = std::fs::remove_file(&config);
    run.expect_status(0);
    assert!(run.stats.as_ref().unwrap()["swap"].is_object());
}

/// `tools/ab-compare --help` prints its usage (it failed on `set -u`).
#[test]
fn ab_compare_has_a_help() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/ab-compare");
    let out = std::process::Command::new(&script)
        .arg("--help")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("Usage: tools/ab-compare OLD_BINARY NEW_BINARY"),
        "{stdout}"
    );
    let out = std::process::Command::new(&script).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage:"));
}

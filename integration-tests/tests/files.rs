//! What a run does with the files around it and with its own process
//! (issue 29): outputs never written through a symbolic link to a file and
//! created mode 0600, the console log capped, the key file opened without
//! blocking and checked for its owner, and the process non-dumpable unless
//! `--dumpable` asks.

use integration_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A bound on each run: none of these should take more than seconds.
const LIMIT: Duration = Duration::from_secs(300);
/// `nobody`, the other user these tests use.
const NOBODY: u32 = 65534;
/// The status of a configuration error.
const EXIT_CONFIG: i32 = 1;

/// `hugevmm` with `args` (no --stats-json added), its umask 0 so that the
/// modes it asks for are the modes it gets.
fn run(args: &[&str]) -> Output {
    let mut cmd = Command::new(hugevmm_bin());
    cmd.args(args);
    // SAFETY: umask is async-signal-safe and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    run_with_limit(cmd, LIMIT)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this test can run commands as `nobody` (root and setpriv);
/// skips it if not.
fn can_be_nobody(test: &str) -> bool {
    if !is_root() {
        skip(
            test,
            Resource::OtherUser,
            "not root: cannot run commands as another user",
        );
        return false;
    }
    if !have_program("setpriv") {
        skip(
            test,
            Resource::OtherUser,
            "setpriv is not installed (apt-get install util-linux)",
        );
        return false;
    }
    true
}

/// `setpriv` arguments that run the rest as `nobody` with no groups.
fn as_nobody() -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid",
        &NOBODY.to_string(),
        "--regid",
        &NOBODY.to_string(),
        "--clear-groups",
    ]);
    cmd
}

#[test]
fn outputs_are_not_written_through_symbolic_links_to_files() {
    let dir = temp_path("links");
    std::fs::create_dir(&dir).unwrap();
    let target = dir.join("precious");
    std::fs::write(&target, "the user's file\n").unwrap();
    for option in [
        "--stats-json",
        "--status-file",
        "--stats-timeline",
        "--console-log",
    ] {
        let link = dir.join(format!("link{option}"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let link_arg = link.to_str().unwrap();
        let mut args = vec!["run", "--payload", "hello", option, link_arg];
        if option == "--console-log" {
            // The console is a kernel's: the output paths are checked
            // before the kernel is, so none is needed to see the refusal.
            args = vec!["run", "--kernel", "/nonexistent", option, link_arg];
        }
        let out = run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{option}: {err}");
        assert!(
            err.contains(&format!("{option} {link_arg} is a symbolic link")),
            "{option}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "the user's file\n",
            "{option} wrote through the link"
        );
        std::fs::remove_file(&link).unwrap();
    }
    // A link to a device is written to (/dev/stdout, here /dev/null).
    if skip_without_kvm(
        "outputs_are_not_written_through_symbolic_links_to_files (a link to a device)",
    ) {
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let to_null = dir.join("to-null");
    std::os::unix::fs::symlink("/dev/null", &to_null).unwrap();
    let out = run(&[
        "run",
        "--payload",
        "hello",
        "--stats-json",
        to_null.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn outputs_are_created_owner_only() {
    if skip_without_kvm("outputs_are_created_owner_only") {
        return;
    }
    let dir = temp_path("modes");
    std::fs::create_dir(&dir).unwrap();
    let stats = dir.join("stats.json");
    let status = dir.join("status.json");
    let timeline = dir.join("timeline.jsonl");
    let out = run(&[
        "run",
        "--payload",
        "hello",
        "--stats-json",
        stats.to_str().unwrap(),
        "--status-file",
        status.to_str().unwrap(),
        "--stats-timeline",
        timeline.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Under umask 0: a file made with the default 0666 would show it.
    for path in [&stats, &status, &timeline] {
        assert_eq!(mode(path), 0o600, "{}", path.display());
    }
    // One that exists keeps its mode (the user chose it).
    std::fs::set_permissions(&stats, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&[
        "run",
        "--payload",
        "hello",
        "--stats-json",
        stats.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(mode(&stats), 0o644);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn kernel() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HUGEVMM_TEST_KERNEL") {
        return Some(PathBuf::from(path));
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/linux-kernel/vmlinuz");
    path.exists().then_some(path)
}

#[test]
fn the_console_log_is_owner_only_and_capped() {
    let test = "the_console_log_is_owner_only_and_capped";
    if skip_without_kvm(test) {
        return;
    }
    let Some(kernel) = kernel() else {
        skip(
            test,
            Resource::Kernel,
            "no kernel at target/linux-kernel/vmlinuz; run .ci/fetch-kernel (CI does)",
        );
        return;
    };
    let log = temp_path("console.log");
    // Early boot prints the banner, the command line, the e820 map and
    // more: well past 2 KiB whether the kernel gets far (a full boot, no
    // initrd: a panic, which ends the VM) or stops early (an emulation
    // failure on PVM hosts).
    let out = run(&[
        "run",
        "--kernel",
        kernel.to_str().unwrap(),
        "--mem",
        "256M",
        "--cmdline",
        "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1",
        "--timeout",
        "200",
        "--console-log",
        log.to_str().unwrap(),
        "--console-log-max",
        "2K",
    ]);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let file_mode = mode(&log);
    let _ = std::fs::remove_file(&log);
    let line = "\n[hugevmm: console log truncated: it reached --console-log-max (2048 bytes); the rest of the guest's output is dropped]\n";
    assert!(
        text.ends_with(line),
        "status {:?}, {} bytes:\n{text}\n--- stderr\n{}",
        out.status,
        text.len(),
        stderr(&out)
    );
    assert_eq!(text.len(), 2048 + line.len());
    assert!(text.contains("Linux version"), "{text}");
    assert_eq!(file_mode, 0o600);
}

/// A FIFO at a fresh path.
fn fifo(name: &str) -> PathBuf {
    let path = temp_path(name);
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path, which lives across the
    // call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    path
}

fn encrypted_run_with_key(key: &Path) -> Output {
    run(&[
        "run",
        "--payload",
        "hello",
        "--mem",
        "256M",
        "--mem-limit",
        "128M",
        "--swap-encrypt",
        "--swap-key-file",
        key.to_str().unwrap(),
    ])
}

#[test]
fn a_fifo_key_file_is_refused_at_once() {
    // Opened blocking, a FIFO nobody writes to would hold the start for
    // ever: `run` would reach its limit and fail the test.
    let key = fifo("key.fifo");
    let out = encrypted_run_with_key(&key);
    std::fs::remove_file(&key).unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{err}");
    assert!(err.contains("is not a regular file"), "{err}");
}

#[test]
fn a_key_file_of_another_user_is_refused() {
    let test = "a_key_file_of_another_user_is_refused";
    if !is_root() {
        skip(
            test,
            Resource::OtherUser,
            "not root: cannot give a file to another user",
        );
        return;
    }
    let key = temp_path("key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&key, Some(NOBODY), Some(NOBODY)).unwrap();
    let out = encrypted_run_with_key(&key);
    std::fs::remove_file(&key).unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(EXIT_CONFIG), "{err}");
    assert!(
        err.contains(&format!(
            "belongs to uid {NOBODY}, not to the user running hugevmm"
        )),
        "{err}"
    );
}

/// A VM started as `nobody` (with `CAP_DAC_OVERRIDE` alone, to open
/// /dev/kvm, which is root's on most hosts), running until killed.
struct NobodyVm {
    child: Child,
    socket: PathBuf,
    err_path: PathBuf,
}

impl NobodyVm {
    fn start(extra: &[&str]) -> NobodyVm {
        let socket = temp_path("nobody.sock");
        let err_path = temp_path("nobody.err");
        let mut cmd = as_nobody();
        cmd.args([
            "--inh-caps",
            "+dac_override",
            "--ambient-caps",
            "+dac_override",
        ])
        .arg(hugevmm_bin())
        .args([
            "run",
            "--payload",
            "verify",
            "--vcpus",
            "1",
            "--mem",
            "128M",
            "--payload-args",
            "passes=1000000",
            "--api-socket",
            socket.to_str().unwrap(),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap());
        let mut vm = NobodyVm {
            child: cmd.spawn().unwrap(),
            socket,
            err_path,
        };
        // Serving the API means the machine is built: the point from which
        // the process is non-dumpable.
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&vm.socket).is_err() {
            let ended = vm.child.try_wait().unwrap();
            assert!(
                ended.is_none() && start.elapsed() < LIMIT,
                "the VM run as nobody never served its API ({ended:?}): {}",
                std::fs::read_to_string(&vm.err_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        vm
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NobodyVm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.err_path);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The uids of /proc/PID/status's `Uid:` line.
fn proc_uid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Whether another process of `nobody`, with the same privileges as the
/// VM (ptrace access also needs the reader's capabilities to cover the
/// target's), can read /proc/PID/environ.
fn nobody_reads_environ(pid: u32) -> bool {
    let mut cmd = as_nobody();
    cmd.args([
        "--inh-caps",
        "+dac_override",
        "--ambient-caps",
        "+dac_override",
    ])
    .args(["cat", &format!("/proc/{pid}/environ")]);
    run_with_limit(cmd, LIMIT).status.success()
}

#[test]
fn the_process_is_not_dumpable_unless_asked() {
    let test = "the_process_is_not_dumpable_unless_asked";
    if skip_without_kvm(test) || !can_be_nobody(test) {
        return;
    }
    // Run as nobody: a dumpable process's /proc/PID files are its own
    // user's, a non-dumpable one's root's (root's own processes are root's
    // either way, which is why the test needs another user).
    let vm = NobodyVm::start(&[]);
    let pid = vm.pid();
    assert_eq!(proc_uid(pid), NOBODY, "the VM runs as nobody");
    for file in ["environ", "mem"] {
        let owner = std::fs::metadata(format!("/proc/{pid}/{file}"))
            .unwrap()
            .uid();
        assert_eq!(owner, 0, "/proc/{pid}/{file} belongs to uid {owner}");
    }
    assert!(
        !nobody_reads_environ(pid),
        "another process of the same user read the VM's environment"
    );
    drop(vm);

    let vm = NobodyVm::start(&["--dumpable"]);
    let pid = vm.pid();
    let owner = std::fs::metadata(format!("/proc/{pid}/environ"))
        .unwrap()
        .uid();
    assert_eq!(owner, NOBODY, "--dumpable keeps the process's own files");
    assert!(nobody_reads_environ(pid));
}

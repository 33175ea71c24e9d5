//! Helpers for tests that launch real VMs through the `hugevmm` binary.
#![deny(missing_docs)]

pub mod cpio;
pub mod openapi;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use test_resources::{have_program, skip, skip_by_choice, skip_without_kvm, Resource};

/// Path of the `hugevmm` binary built by this workspace, building it first
/// (once per test process) when it is missing, so that a test file run on
/// its own (`cargo test -p integration-tests --test linux`) works too.
///
/// `cargo test --workspace` builds it because the `vmm` package has tests
/// of its own; it sits next to the test's `deps` folder, in the profile's
/// directory the test was built for.
pub fn hugevmm_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(find_or_build_hugevmm)
        .clone()
        .unwrap_or_else(|why| panic!("{why}"))
}

fn find_or_build_hugevmm() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("test executable path: {e}"))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("the test executable is not in target/<profile>/deps")?;
    let bin = profile_dir.join("hugevmm");
    if bin.exists() {
        return Ok(bin);
    }
    let how = "build it with `cargo build -p vmm` (add --release for release tests)";
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "vmm", "--bin", "hugevmm"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        other => {
            return Err(format!(
                "{} does not exist (profile {other:?}): {how}",
                bin.display()
            ))
        }
    }
    if let Some(target_dir) = profile_dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    eprintln!("{} is missing: running {cmd:?}", bin.display());
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run cargo ({e}): {how}"))?;
    if !status.success() || !bin.exists() {
        return Err(format!("{cmd:?} failed ({status}): {how}"));
    }
    Ok(bin)
}

/// The result of one `hugevmm` invocation.
pub struct Run {
    /// Exit status (None if killed by a signal).
    pub status: Option<i32>,
    /// Guest console and anything else on stdout.
    pub stdout: String,
    /// VMM messages.
    pub stderr: String,
    /// `--stats-json` content when requested.
    pub stats: Option<serde_json::Value>,
}

impl Run {
    /// Panics with the whole output unless the exit status is `want`.
    pub fn expect_status(&self, want: i32) -> &Self {
        assert_eq!(
            self.status,
            Some(want),
            "hugevmm exited {:?}, expected {want}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// A number from the stats object, by JSON pointer (e.g. `/kvm/pages_2m`).
    pub fn stat(&self, pointer: &str) -> u64 {
        let stats = self.stats.as_ref().expect("run had no --stats-json");
        stats
            .pointer(pointer)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| panic!("stats have no number at {pointer}: {stats}"))
    }
}

/// This process's folder of temporary files, `$TMPDIR/hugevmm-test-PID`.
///
/// A test harness has no hook that runs once its tests are done, and a test
/// that fails, or a VM that a seccomp trap ends, leaves its files behind.
/// So instead of each test cleaning up after itself, the first call in a
/// process removes the folders (and the single files of the older layout,
/// `hugevmm-test-PID-N-TAG`) of test processes that are no longer alive.
/// Leftovers are then bounded by the test processes running now.
fn process_temp_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let temp = std::env::temp_dir();
        remove_leftovers_of_ended_tests(&temp);
        let dir = temp.join(format!("hugevmm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        dir
    })
}

/// Removes `hugevmm-test-PID…` entries in `temp` whose process has ended.
/// A PID that was reused keeps its entry until the new process ends too.
fn remove_leftovers_of_ended_tests(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("hugevmm-test-")) else {
            continue;
        };
        let Ok(pid) = rest.split('-').next().unwrap_or("").parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        let _ = match entry.file_type() {
            Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
    }
}

fn unique_path(tag: &str) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    process_temp_dir().join(format!("{n}-{tag}"))
}

/// Runs `hugevmm` with `args`, collecting stats, killing it after `limit`.
pub fn hugevmm(args: &[&str], limit: Duration) -> Run {
    let stats_path = unique_path("stats.json");
    let mut cmd = Command::new(hugevmm_bin());
    cmd.args(args);
    let with_stats = args.first() == Some(&"run");
    if with_stats {
        cmd.arg("--stats-json").arg(&stats_path);
    }
    let output = run_with_limit(cmd, limit);
    let stats = if with_stats {
        std::fs::read_to_string(&stats_path)
            .ok()
            .map(|s| serde_json::from_str(&s).expect("stats json parses"))
    } else {
        None
    };
    let _ = std::fs::remove_file(&stats_path);
    Run {
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        stats,
    }
}

/// Runs `hugevmm` with `args` and checks that it refused them as a user
/// error (status 1, or 2 for what clap cannot parse) with a message that
/// contains `want`.
pub fn assert_refused(args: &[&str], want: &str) {
    let run = hugevmm(args, Duration::from_secs(60));
    assert!(
        run.status == Some(1) || run.status == Some(2),
        "{args:?}: exited {:?}: {}",
        run.status,
        run.stderr
    );
    assert!(run.stderr.contains(want), "{args:?}: {}", run.stderr);
}

/// Runs a command, killing it if it outlives `limit` (the test then fails
/// with what it printed so far).
pub fn run_with_limit(cmd: Command, limit: Duration) -> Output {
    Collecting::spawn(cmd).wait(limit)
}

/// A child whose stdout and stderr are read to the end by two threads, so
/// that it never blocks on a full pipe.
struct Collecting {
    cmd: Command,
    child: Child,
    out_reader: Option<JoinHandle<Vec<u8>>>,
    err_reader: Option<JoinHandle<Vec<u8>>>,
}

fn read_all(mut from: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = from.read_to_end(&mut v);
        v
    })
}

impl Collecting {
    fn spawn(mut cmd: Command) -> Self {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        let out_reader = Some(read_all(child.stdout.take().unwrap()));
        let err_reader = Some(read_all(child.stderr.take().unwrap()));
        Self {
            cmd,
            child,
            out_reader,
            err_reader,
        }
    }

    /// Kills the child and returns what it printed.
    fn kill(&mut self) -> (ExitStatus, String, String) {
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait");
        let text = |reader: Option<JoinHandle<Vec<u8>>>| {
            let bytes = reader.map(|r| r.join().unwrap()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let out = text(self.out_reader.take());
        let err = text(self.err_reader.take());
        (status, out, err)
    }

    /// Waits for the child, killing it if it outlives `limit` (the test
    /// then fails with what it printed so far).
    fn wait(mut self, limit: Duration) -> Output {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if start.elapsed() > limit {
                let (status, out, err) = self.kill();
                panic!(
                    "{:?} did not finish within {limit:?} ({status})\n--- stdout\n{out}\n--- stderr\n{err}",
                    self.cmd
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            status,
            stdout: self.out_reader.take().unwrap().join().unwrap(),
            stderr: self.err_reader.take().unwrap().join().unwrap(),
        }
    }
}

impl Drop for Collecting {
    /// A test that fails midway must not leave a VM running.
    fn drop(&mut self) {
        if self.out_reader.is_some() {
            let _ = self.kill();
        }
    }
}

/// `hugevmm` running in the background, e.g. while a test talks to its
/// control socket.
pub struct Background {
    process: Collecting,
    stats_path: Option<PathBuf>,
}

impl Background {
    /// Starts `hugevmm` with `args`; a `run` gets `--stats-json` as with
    /// [`hugevmm`].
    pub fn start(args: &[&str]) -> Self {
        let mut cmd = Command::new(hugevmm_bin());
        cmd.args(args);
        let stats_path = (args.first() == Some(&"run")).then(|| unique_path("stats.json"));
        if let Some(path) = &stats_path {
            cmd.arg("--stats-json").arg(path);
        }
        Self {
            process: Collecting::spawn(cmd),
            stats_path,
        }
    }

    /// Waits until `ready()` holds (e.g. the control socket accepts
    /// connections), checking every 20 ms for at most `limit`; panics with
    /// the output, naming `what`, if the process ends first or the limit
    /// passes.
    pub fn wait_until(&mut self, what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ready() {
            let exited = self.process.child.try_wait().expect("wait");
            if exited.is_some() || start.elapsed() > limit {
                let (status, out, err) = self.process.kill();
                panic!(
                    "never ready: {what} ({status}, waited {:?})\n--- stdout\n{out}\n--- stderr\n{err}",
                    start.elapsed()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process's id (its `/proc/PID`).
    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// Sends signal `signo` (e.g. `libc::SIGTERM`) to the process.
    pub fn signal(&self, signo: i32) {
        let pid = self.process.child.id() as libc::pid_t;
        // SAFETY: kill has no memory effects; the pid is our own child's,
        // which has not been waited for, so it cannot have been reused.
        let ret = unsafe { libc::kill(pid, signo) };
        assert_eq!(
            ret,
            0,
            "kill({pid}, {signo}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// Waits for the process to end (killing it after `limit`, which fails
    /// the test) and collects its output and stats.
    pub fn finish(self, limit: Duration) -> Run {
        let output = self.process.wait(limit);
        let stats = self.stats_path.as_ref().and_then(|path| {
            let text = std::fs::read_to_string(path).ok();
            let _ = std::fs::remove_file(path);
            text.map(|s| serde_json::from_str(&s).expect("stats json parses"))
        });
        Run {
            status: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            stats,
        }
    }
}

/// A fresh path in this test process's temporary folder (nothing is created
/// there), e.g. for a control socket. The folder is removed by a later test
/// process once this one has ended.
pub fn temp_path(name: &str) -> PathBuf {
    unique_path(name)
}

/// Makes sure `pages` free 2 MiB hugetlb pages exist, reserving them when
/// running as root, for as long as the returned value lives (the pool
/// shrinks back when it is dropped). Returns why not otherwise.
pub fn ensure_hugetlb_pages(pages: u64) -> Result<test_resources::hugetlb::HugetlbPages, String> {
    test_resources::hugetlb::reserve(pages)
}

/// Builds a payload from assembly or C sources with the system gcc.
pub fn gcc_build(sources: &[&Path], extra_args: &[&str], out_name: &str) -> PathBuf {
    let out = unique_path(out_name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let mut cmd = Command::new(&cc);
    cmd.args([
        "-O2",
        "-static",
        "-nostdlib",
        "-ffreestanding",
        "-fno-pic",
        "-no-pie",
        "-fno-stack-protector",
    ])
    .args(extra_args)
    .args(sources)
    .arg("-o")
    .arg(&out);
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e} (apt-get install gcc)"));
    assert!(
        output.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// Writes `text` to a fresh temporary file with the given name suffix.
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = unique_path(name);
    std::fs::write(&path, text).expect("write temp file");
    path
}

/// Asserts that KVM maps at least 90 % of `chunks` with 2 MiB stage-2
/// entries (`pages_2m` from the run's stats).
pub fn assert_mostly_huge(pages_2m: u64, chunks: u64, what: &str) {
    eprintln!("{what}: pages_2m={pages_2m} of {chunks} chunks");
    assert!(chunks > 0, "{what}: no chunks to check");
    assert!(
        pages_2m * 10 >= chunks * 9,
        "{what}: pages_2m {pages_2m} < 90% of {chunks} chunks"
    );
}

/// Sends one command through `hugevmm ctl` to the API socket at `socket`
/// and returns the body of the response, which must be a success (ctl
/// exits 0 for a 2xx only).
pub fn ctl(socket: &Path, words: &[&str]) -> serde_json::Value {
    let mut args = vec!["ctl", "--api-socket", socket.to_str().unwrap()];
    args.extend_from_slice(words);
    let run = hugevmm(&args, Duration::from_secs(120));
    run.expect_status(0);
    serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("{words:?}: reply is not JSON ({e}): {}", run.stdout))
}

/// What `curl` got back.
pub struct CurlReply {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: String,
    /// The body.
    pub body: String,
}

impl CurlReply {
    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One request with the real `curl` to `url` (over the Unix socket
/// `socket` if given), with a JSON body if `body` is given.
pub fn curl(
    socket: Option<&Path>,
    method: &str,
    url: &str,
    body: Option<&str>,
    headers: &[&str],
) -> CurlReply {
    let mut cmd = Command::new("curl");
    cmd.args([
        "--silent",
        "--show-error",
        "--max-time",
        "120",
        "-X",
        method,
    ]);
    if let Some(socket) = socket {
        cmd.arg("--unix-socket").arg(socket);
    }
    if let Some(body) = body {
        // From a file: curl sends a large one as it is, framed by its length.
        let file = temp_file("curl-body.json", body);
        cmd.args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(format!("@{}", file.display()));
    }
    for header in headers {
        cmd.args(["-H", header]);
    }
    // The status and content type after the body, on a line of their own.
    cmd.args(["-w", "\n%{http_code} %{content_type}"]).arg(url);
    let output = run_with_limit(cmd, Duration::from_secs(180));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "curl -X {method} {url} failed ({}): {}{text}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let (body, last) = text.rsplit_once('\n').expect("curl's -w line");
    let (status, content_type) = last.split_once(' ').unwrap_or((last, ""));
    CurlReply {
        status: status
            .parse()
            .unwrap_or_else(|_| panic!("curl status {last:?}")),
        content_type: content_type.to_string(),
        body: body.to_string(),
    }
}

/// The Python that parses metrics with the real OpenMetrics parser and
/// prints every sample as JSON: {family: {"type": T, "samples": [[name,
/// labels, value]]}}; it fails (non-zero exit) on text it cannot parse.
const PARSE_OPENMETRICS: &str = r#"
import json, math, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    out[family.name] = {
        "type": family.type,
        "samples": [[s.name, s.labels, s.value if math.isfinite(s.value) else str(s.value)] for s in family.samples],
    }
print(json.dumps(out))
"#;

/// The Python that Debian's python3-prometheus-client serves: the
/// system's, not another one found first on PATH (pyenv's, say).
fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Whether python3 with `prometheus_client`'s OpenMetrics parser is here.
pub fn have_openmetrics_parser() -> bool {
    Command::new(python())
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `test` must skip (and says so) for want of KVM, curl or the
/// OpenMetrics parser: what the API tests that scrape metrics need.
pub fn skip_without_kvm_curl_and_parser(test: &str) -> bool {
    if skip_without_kvm(test) {
        return true;
    }
    if !have_program("curl") {
        skip(
            test,
            Resource::Curl,
            "curl is not installed (apt-get install curl)",
        );
        return true;
    }
    if !have_openmetrics_parser() {
        skip(
            test,
            Resource::PrometheusParser,
            "python3 cannot import prometheus_client.openmetrics (apt-get install python3-prometheus-client)",
        );
        return true;
    }
    false
}

/// Parses OpenMetrics text with Python's `prometheus_client` (Debian's
/// python3-prometheus-client); panics with the parser's error otherwise.
pub fn parse_openmetrics(text: &str) -> serde_json::Value {
    use std::io::Write;
    let mut child = Command::new(python())
        .args(["-c", PARSE_OPENMETRICS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the OpenMetrics parser refused the text: {}\n--- text\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Starts `hugevmm run ARGS --api-socket <a fresh path>` in the background
/// and waits until its control socket accepts connections; returns the VM
/// and the socket's path.
pub fn start_with_api_socket(args: &[&str]) -> (Background, PathBuf) {
    let socket = temp_path("api.sock");
    let mut all = args.to_vec();
    all.extend_from_slice(&["--api-socket", socket.to_str().unwrap()]);
    let mut vm = Background::start(&all);
    vm.wait_until(
        "the control socket accepts connections",
        Duration::from_secs(300),
        || std::os::unix::net::UnixStream::connect(&socket).is_ok(),
    );
    (vm, socket)
}

/// Pages of `image` shaped as the `verify` payload leaves guest pages:
/// its three words per page (the first, the middle and the last 8 bytes,
/// each non-zero, payloads/src/guest/verify.c) and zeros everywhere else.
/// A sealed page looks like this with probability about 2^-32000.
pub fn verify_pages_in(image: &[u8]) -> usize {
    const PAGE: usize = 4096;
    let words = [0, PAGE / 2, PAGE - 8];
    image
        .chunks_exact(PAGE)
        .filter(|page| {
            let word = |at: usize| u64::from_le_bytes(page[at..at + 8].try_into().unwrap());
            words.iter().all(|&at| word(at) != 0)
                && page
                    .chunks_exact(8)
                    .enumerate()
                    .all(|(i, w)| words.contains(&(i * 8)) || w.iter().all(|&b| b == 0))
        })
        .count()
}

/// `verify` on 2 vCPUs, 512 MiB held to 128 MiB (4x overcommit), two
/// passes, on the store `spec` with `extra` options, within 10 minutes:
/// the run the store-content scans (plain vs `--swap-encrypt`) compare.
pub fn verify_small_overcommitted(spec: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "run",
        "--payload",
        "verify",
        "--vcpus",
        "2",
        "--mem",
        "512M",
        "--mem-limit",
        "128M",
        "--payload-args",
        "passes=2",
        "--swap-store",
        spec,
    ];
    args.extend_from_slice(extra);
    hugevmm(&args, Duration::from_secs(600))
}

/// `blkcheck` on `disk` attached with `,readonly`: the run passes and the
/// guest sees a read-only disk (`readonly=1`).
pub fn check_blkcheck_readonly(disk: &str) {
    let readonly = format!("{disk},readonly");
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
        Duration::from_secs(300),
    );
    run.expect_status(0);
    assert!(
        run.stdout.contains("readonly=1"),
        "{readonly}: {}",
        run.stdout
    );
}

/// `verify` on 4 vCPUs, 1 GiB held to 256 MiB (4x overcommit), two passes,
/// on the store `store` with `extra` options, within 10 minutes.
pub fn verify_on(store: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "run",
        "--payload",
        "verify",
        "--vcpus",
        "4",
        "--mem",
        "1G",
        "--mem-limit",
        "256M",
        "--payload-args",
        "passes=2",
        "--swap-store",
        store,
    ];
    args.extend_from_slice(extra);
    hugevmm(&args, Duration::from_secs(600))
}

/// That a [`verify_on`] run ended well and went through its store: every
/// unit evicted and half read back at least, within the limit.
pub fn check_swapped_through(run: &Run, what: &str) {
    run.expect_status(0);
    assert_eq!(
        run.stdout.matches(" ok").count(),
        4,
        "{what}: {}",
        run.stdout
    );
    let unit = run.stat("/swap/unit_bytes");
    let evictions = run.stat("/swap/evictions");
    let store_faults = run.stat("/swap/faults/store");
    eprintln!("{what}: evictions={evictions} store_faults={store_faults}");
    assert!(
        evictions >= (1 << 30) / unit,
        "{what}: evictions {evictions}"
    );
    assert!(
        store_faults >= (1 << 29) / unit,
        "{what}: store faults {store_faults}"
    );
    assert!(run.stat("/swap/resident_bytes_max") <= 256 << 20);
}

/// Starts `verify` on `store` (more passes, so that it runs long enough
/// to be interrupted) with an API socket, and waits until it has evicted
/// and read back through the store.
pub fn start_swapping(store: &str) -> (Background, PathBuf) {
    let (mut vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "verify",
        "--vcpus",
        "4",
        "--mem",
        "1G",
        "--mem-limit",
        "256M",
        "--payload-args",
        "passes=4",
        "--swap-store",
        store,
    ]);
    let sock = socket.clone();
    vm.wait_until(
        "the guest swaps through the store",
        Duration::from_secs(600),
        move || {
            let stats = ctl(&sock, &["stats"]);
            stats.pointer("/swap/faults/store").and_then(|v| v.as_u64()) > Some(100)
        },
    );
    (vm, socket)
}

/// Runs `hello` on the swap store `store` with `HUGEVMM_SECCOMP_PROBE=KIND`:
/// the first thread of that kind calls `execve` right after installing
/// its filter, so the run must end with status 159 naming the kind (only
/// a filtered thread of the kind traps).
pub fn assert_store_thread_runs_its_filter(store: &str, kind: &str) {
    let mut cmd = Command::new(hugevmm_bin());
    cmd.args([
        "run",
        "--payload",
        "hello",
        "--mem",
        "64M",
        "--mem-limit",
        "32M",
        "--swap-store",
        store,
    ])
    .env("HUGEVMM_SECCOMP_PROBE", kind);
    let out = run_with_limit(cmd, Duration::from_secs(600));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(159), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "forbidden system call execve (59) on a thread of kind {kind}"
        )),
        "{stderr}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries of an ended process go, in both layouts; this process's own
    /// and other names stay.
    #[test]
    fn leftovers_of_ended_test_processes_are_removed() {
        let temp = process_temp_dir().join("sweep");
        std::fs::create_dir_all(&temp).unwrap();
        // No process has the PID pid_max: PIDs are below it.
        let ended: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let own = std::process::id();
        let ended_dir = temp.join(format!("hugevmm-test-{ended}"));
        std::fs::create_dir_all(ended_dir.join("inner")).unwrap();
        let ended_file = temp.join(format!("hugevmm-test-{ended}-3-api.sock"));
        let own_dir = temp.join(format!("hugevmm-test-{own}"));
        let other = temp.join("hugevmm-testing-notes");
        for file in [&ended_file, &other] {
            std::fs::write(file, "x").unwrap();
        }
        std::fs::create_dir_all(&own_dir).unwrap();
        remove_leftovers_of_ended_tests(&temp);
        assert!(!ended_dir.exists() && !ended_file.exists());
        assert!(own_dir.exists() && other.exists());
        std::fs::remove_dir_all(&temp).unwrap();
    }
}

//! Skipping a test because the host lacks something it needs, in a way
//! nobody can miss, and failing it instead where that resource must exist.
//!
//! cargo captures the output of passing tests, so a test that prints
//! `SKIP ...` and returns shows as `ok`. Two environment variables make
//! skips count:
//!
//! - `HUGEVMM_REQUIRE_RESOURCES`: `all`, or a comma-separated list of
//!   [`Resource`] names (`kvm,hugetlb,...`). A test that would skip for a
//!   required resource panics instead, naming it. `.ci/run` sets `all`:
//!   CI provides every resource, so a missing one is a broken CI machine
//!   or install step, not a reason to pass.
//! - `HUGEVMM_SKIP_LOG`: a file each skip appends its line to, so that a
//!   run can list what it skipped at the end (`.ci/run` prints it).
//!
//! Skips that are the user's choice, not a missing resource (another
//! kernel named through an environment variable, say), go through
//! [`skip_by_choice`] and never fail.
#![deny(missing_docs)]

use std::fmt::Display;
use std::io::Write;

pub mod hugetlb;

/// The variable naming the resources a run requires.
pub const REQUIRE_VAR: &str = "HUGEVMM_REQUIRE_RESOURCES";
/// The variable naming the file skips are logged to.
pub const SKIP_LOG_VAR: &str = "HUGEVMM_SKIP_LOG";

/// Something a test needs from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// A usable `/dev/kvm`.
    Kvm,
    /// Free 2 MiB hugetlb pages (or the right to reserve them).
    Hugetlb,
    /// The Debian kernel and modules `.ci/fetch-kernel` puts in
    /// `target/linux-kernel/`.
    Kernel,
    /// `qemu-system-x86_64` (Debian: qemu-system-x86).
    Qemu,
    /// A static `/bin/busybox` (Debian: busybox-static).
    Busybox,
    /// `cpio` (Debian: cpio).
    Cpio,
    /// ACPICA's `iasl` (Debian: acpica-tools).
    Iasl,
    /// `objdump` (Debian: binutils).
    Objdump,
    /// `O_DIRECT` on the test directory's filesystem.
    ODirect,
    /// Punching holes (`FALLOC_FL_PUNCH_HOLE`) in the test directory.
    HolePunch,
    /// Root and `unshare(1)`, to run a command without `/dev/kvm`.
    Unshare,
    /// Mounting a small tmpfs (root), for full-filesystem tests.
    Mount,
    /// `fio` (Debian: fio).
    Fio,
    /// `nbdkit` (Debian: nbdkit).
    Nbdkit,
    /// `qemu-nbd` (Debian: qemu-utils).
    QemuNbd,
    /// `qemu-storage-daemon`, a vhost-user-blk backend (Debian:
    /// qemu-system-common).
    QemuStorageDaemon,
    /// `curl` (Debian: curl).
    Curl,
    /// Python's `prometheus_client` with its OpenMetrics parser (Debian:
    /// python3-prometheus-client).
    PrometheusParser,
    /// io_uring with ring restrictions (Linux >= 5.10, not disabled by
    /// the `kernel.io_uring_disabled` sysctl).
    IoUring,
    /// Locking a page in RAM (`mlock`): root (`CAP_IPC_LOCK`), or a
    /// locked-memory limit (`ulimit -l`) with a page to spare.
    Mlock,
    /// Root and `setpriv(1)` (util-linux), to give files to and run
    /// commands as another user (`nobody`, uid 65534).
    OtherUser,
    /// Root, a memory cgroup controller (v1 or v2) and `mkswap`/`swapon`
    /// (util-linux), for the host kernel's swap as a baseline.
    MemcgSwap,
}

impl Resource {
    /// Every resource, for `all` and for checking names.
    pub const ALL: [Resource; 22] = [
        Resource::Kvm,
        Resource::Hugetlb,
        Resource::Kernel,
        Resource::Qemu,
        Resource::Busybox,
        Resource::Cpio,
        Resource::Iasl,
        Resource::Objdump,
        Resource::ODirect,
        Resource::HolePunch,
        Resource::Unshare,
        Resource::Mount,
        Resource::Fio,
        Resource::Nbdkit,
        Resource::QemuNbd,
        Resource::QemuStorageDaemon,
        Resource::Curl,
        Resource::PrometheusParser,
        Resource::IoUring,
        Resource::Mlock,
        Resource::OtherUser,
        Resource::MemcgSwap,
    ];

    /// The name used in `HUGEVMM_REQUIRE_RESOURCES` and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Kvm => "kvm",
            Resource::Hugetlb => "hugetlb",
            Resource::Kernel => "kernel",
            Resource::Qemu => "qemu",
            Resource::Busybox => "busybox",
            Resource::Cpio => "cpio",
            Resource::Iasl => "iasl",
            Resource::Objdump => "objdump",
            Resource::ODirect => "o-direct",
            Resource::HolePunch => "hole-punch",
            Resource::Unshare => "unshare",
            Resource::Mount => "mount",
            Resource::Fio => "fio",
            Resource::Nbdkit => "nbdkit",
            Resource::QemuNbd => "qemu-nbd",
            Resource::QemuStorageDaemon => "qemu-storage-daemon",
            Resource::Curl => "curl",
            Resource::PrometheusParser => "python3-prometheus-client",
            Resource::IoUring => "io-uring",
            Resource::Mlock => "mlock",
            Resource::OtherUser => "other-user",
            Resource::MemcgSwap => "memcg-swap",
        }
    }
}

/// Which resources the environment requires, from the value of
/// [`REQUIRE_VAR`]. Panics on a name no [`Resource`] has, so that a typo
/// cannot quietly require nothing.
pub fn parse_required(value: &str) -> Vec<Resource> {
    let mut required = Vec::new();
    for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if word == "all" {
            return Resource::ALL.to_vec();
        }
        match Resource::ALL.iter().find(|r| r.name() == word) {
            Some(r) => required.push(*r),
            None => {
                let names: Vec<&str> = Resource::ALL.iter().map(|r| r.name()).collect();
                panic!(
                    "{REQUIRE_VAR}: unknown resource {word:?}; give `all` or some of: {}",
                    names.join(", ")
                )
            }
        }
    }
    required
}

/// Whether this run requires `resource`.
pub fn is_required(resource: Resource) -> bool {
    std::env::var(REQUIRE_VAR)
        .map(|v| parse_required(&v).contains(&resource))
        .unwrap_or(false)
}

fn log_line(line: &str) {
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_VAR) {
        // One write of one line per skip: tests run in parallel threads and
        // processes, and O_APPEND keeps whole lines apart.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            panic!(
                "{SKIP_LOG_VAR}={}: cannot log the skip: {e}",
                std::path::Path::new(&path).display()
            );
        }
    }
}

/// `test` cannot run because `resource` is missing (`reason` says how,
/// and how to get it). Prints and logs a `SKIP` line; where the run
/// requires the resource, panics instead. The caller returns after it.
pub fn skip(test: &str, resource: Resource, reason: impl Display) {
    if is_required(resource) {
        panic!(
            "required resource `{}` is missing for {test}: {reason} ({REQUIRE_VAR} requires it)",
            resource.name()
        );
    }
    log_line(&format!("SKIP {test} [{}]: {reason}", resource.name()));
}

/// `test` does not run by the user's choice (`reason`), not for want of a
/// resource: logged like a skip, never a failure.
pub fn skip_by_choice(test: &str, reason: impl Display) {
    log_line(&format!("SKIP {test} [by choice]: {reason}"));
}

/// Returns why `/dev/kvm` cannot be used, or None.
pub fn kvm_unavailable() -> Option<String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/kvm cannot be opened: {e}")),
    }
}

/// Skips `test` (see [`skip`]) and returns true when KVM is unusable.
pub fn skip_without_kvm(test: &str) -> bool {
    match kvm_unavailable() {
        Some(reason) => {
            skip(test, Resource::Kvm, reason);
            true
        }
        None => false,
    }
}

/// Whether `program` runs (`program --version` succeeds); for tools a
/// test shells out to.
pub fn have_program(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_all_means_every_resource() {
        assert_eq!(parse_required("all"), Resource::ALL.to_vec());
        assert_eq!(
            parse_required("kvm, iasl,"),
            vec![Resource::Kvm, Resource::Iasl]
        );
        assert!(parse_required("").is_empty());
        for r in Resource::ALL {
            assert_eq!(parse_required(r.name()), vec![r]);
        }
    }

    /// Set only in the child processes of the test below.
    const PROBE_VAR: &str = "TEST_RESOURCES_PROBE";

    /// A test that skips for iasl, when run as the probe; a no-op otherwise.
    #[test]
    fn probe_skips_for_iasl() {
        if std::env::var_os(PROBE_VAR).is_some() {
            skip("probe", Resource::Iasl, "pretending iasl is missing");
        }
    }

    fn run_probe(required: &str, log: &std::path::Path) -> std::process::Output {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::probe_skips_for_iasl", "--nocapture"])
            .env(PROBE_VAR, "1")
            .env(REQUIRE_VAR, required)
            .env(SKIP_LOG_VAR, log)
            .output()
            .unwrap()
    }

    #[test]
    fn a_required_resource_fails_the_test_naming_it_and_others_skip_visibly() {
        let log = std::env::temp_dir().join(format!("test-resources-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        let failed = run_probe("kvm,iasl", &log);
        let text = String::from_utf8_lossy(&failed.stdout).into_owned()
            + &String::from_utf8_lossy(&failed.stderr);
        assert!(!failed.status.success(), "{text}");
        assert!(
            text.contains("required resource `iasl` is missing for probe"),
            "{text}"
        );
        let skipped = run_probe("kvm", &log);
        let text = String::from_utf8_lossy(&skipped.stderr).into_owned();
        assert!(skipped.status.success(), "{text}");
        assert!(text.contains("SKIP probe [iasl]"), "{text}");
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        assert_eq!(logged, "SKIP probe [iasl]: pretending iasl is missing\n");
    }

    #[test]
    #[should_panic(expected = "unknown resource \"kvn\"")]
    fn a_misspelt_resource_is_an_error() {
        parse_required("kvn");
    }
}

//! A stock Debian kernel booted through hugevmm, on two vCPUs.
//!
//! Which variant runs depends on the host's KVM:
//!
//! - **banner** (this project's PVM hosts, where guest CPL 0 code is
//!   emulated and the emulator stops a stock kernel early): the test checks
//!   what the kernel printed up to there (banner, command line, our e820
//!   map, our ACPI tables found and the MADT used for two CPUs) and that
//!   hugevmm ends the VM with a clear emulation-failure message, in
//!   bounded time.
//! - **full** (VMX/SVM hosts, where guest kernel code runs natively): the
//!   same checks, then the kernel boots into an initramfs the test builds
//!   (static busybox, a newc cpio written by `integration_tests::cpio`,
//!   and the kernel package's virtio modules that `.ci/fetch-kernel` unpacked) whose /init loads
//!   the modules, prints a marker, the CPU count and the virtio drivers
//!   bound (the devices come from hugevmm's DSDT alone), reads a string the
//!   test wrote into a virtio-blk disk, and powers off through the ACPI
//!   sleep registers, which ends the VM with status 0.
//!
//! The test prints which variant it ran. `HUGEVMM_TEST_KERNEL=PATH` boots
//! another kernel than `.ci/fetch-kernel`'s; `HUGEVMM_TEST_MODULES=DIR`
//! then names its modules (a `load-order` file and `NAME.ko` files), if it
//! needs any.

use integration_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const MEM_BYTES: u64 = 256 << 20;
/// How long a run may take before the test gives up on it; the VM must end
/// by itself well before (hugevmm's own `--timeout` is shorter).
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// Printed by the initramfs's /init once it runs.
const INIT_MARKER: &str = "HUGEVMM-INITRAMFS-RUNNING";
/// Printed by /init before what it read from the disk.
const DISK_MARKER: &str = "HUGEVMM-DISK:";
/// Printed by /init when the disk never appeared.
const NO_DISK_MARKER: &str = "HUGEVMM-NO-DISK";
/// Printed by /init before the number of CPUs it sees.
const CPUS_MARKER: &str = "HUGEVMM-CPUS:";
/// Printed by /init before the drivers bound to virtio devices.
const VIRTIO_MARKER: &str = "HUGEVMM-VIRTIO-DRIVERS:";
/// Printed by /init when it waits for the balloon to inflate.
const BALLOON_READY_MARKER: &str = "HUGEVMM-BALLOON-READY";
/// Printed by /init before the pages its balloon driver inflated.
const BALLOON_INFLATED_MARKER: &str = "HUGEVMM-BALLOON-INFLATED-PAGES:";
/// Printed by /init before the pages its balloon driver deflated.
const BALLOON_DEFLATED_MARKER: &str = "HUGEVMM-BALLOON-DEFLATED-PAGES:";
/// Printed by /init for a module that would not load.
const INSMOD_FAILED_MARKER: &str = "HUGEVMM-INSMOD-FAILED";
/// The static busybox the initramfs is built from (Debian: busybox-static).
const BUSYBOX: &str = "/bin/busybox";

/// The modules the full variant's initramfs loads, in load order (empty
/// for a kernel with the drivers built in).
fn kernel_modules() -> Result<Vec<(String, Vec<u8>)>, String> {
    let dir = match std::env::var_os("HUGEVMM_TEST_MODULES") {
        Some(dir) => PathBuf::from(dir),
        None if std::env::var_os("HUGEVMM_TEST_KERNEL").is_some() => return Ok(Vec::new()),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/linux-kernel/modules"),
    };
    let order = std::fs::read_to_string(dir.join("load-order")).map_err(|e| {
        format!(
            "no {}: {e}; run .ci/fetch-kernel (CI does)",
            dir.join("load-order").display()
        )
    })?;
    order
        .split_whitespace()
        .map(|name| {
            let path = dir.join(format!("{name}.ko"));
            std::fs::read(&path)
                .map(|bytes| (name.to_string(), bytes))
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
        })
        .collect()
}

fn kernel() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HUGEVMM_TEST_KERNEL") {
        return Some(PathBuf::from(path));
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/linux-kernel/vmlinuz");
    path.exists().then_some(path)
}

/// How this host's KVM runs guest kernel code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostKind {
    /// PVM: guest CPL 0 is emulated; a stock kernel stops early.
    Pvm,
    /// Hardware virtualization (VMX/SVM) and no PVM module: full boots.
    Native,
    /// Neither is evident; treated like PVM (the banner variant).
    Unknown,
}

fn host_kind() -> HostKind {
    if Path::new("/sys/module/kvm_pvm").exists() {
        return HostKind::Pvm;
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hardware = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if hardware {
        HostKind::Native
    } else {
        HostKind::Unknown
    }
}

/// The BIOS-e820 lines Linux prints for hugevmm's layout of `mem_bytes` of
/// RAM (below 3 GiB only here): low RAM up to the EBDA, the legacy hole,
/// then the rest.
fn expected_e820(mem_bytes: u64) -> Vec<String> {
    let line = |start: u64, end: u64, kind: &str| {
        format!("BIOS-e820: [mem {start:#018x}-{:#018x}] {kind}", end - 1)
    };
    vec![
        line(0, 0x9fc00, "usable"),
        line(0x9fc00, 0x100000, "reserved"),
        line(0x100000, mem_bytes, "usable"),
    ]
}

/// Runs hugevmm with stdin closed: a terminal on stdin would switch on
/// console input (raw mode) and let the test's hugevmm read the terminal.
fn run_hugevmm(args: &[String]) -> Run {
    let mut cmd = Command::new(hugevmm_bin());
    cmd.args(args).stdin(Stdio::null());
    let output = run_with_limit(cmd, RUN_LIMIT);
    Run {
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        stats: None,
    }
}

fn boot_args(kernel: &Path, cmdline: &str, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "run",
        "--kernel",
        kernel.to_str().unwrap(),
        "--mem",
        "256M",
        "--vcpus",
        "2",
        "--cmdline",
        cmdline,
        "--timeout",
        "400",
        "--mem-limit",
        "192M",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend_from_slice(extra);
    args
}

/// What every variant checks: the banner, the command line the kernel saw
/// (ours, plus hugevmm's `virtio_mmio.device=` words), our e820 map, our
/// ACPI tables listed (the RSDP where hugevmm puts it), the MADT used for
/// both vCPUs, and that the VM ended by itself.
fn check_early_boot(run: &Run, want_cmdline: &str) {
    let out = &run.stdout;
    assert!(
        out.contains("Linux version "),
        "no banner:\n{out}\n{}",
        run.stderr
    );
    let printed = out
        .lines()
        .find_map(|l| {
            l.split_once("Command line: ")
                .map(|(_, c)| c.trim_end().to_string())
        })
        .unwrap_or_default();
    assert_eq!(
        printed, want_cmdline,
        "the kernel saw exactly our command line"
    );
    let e820: Vec<String> = out
        .lines()
        .filter_map(|l| {
            l.find("BIOS-e820: ")
                .map(|at| l[at..].trim_end().to_string())
        })
        .collect();
    assert_eq!(e820, expected_e820(MEM_BYTES), "e820 map:\n{out}");
    assert!(
        out.contains("ACPI: RSDP 0x00000000000E0000 000024 (v02 HUGVMM)"),
        "the kernel did not find hugevmm's RSDP:\n{out}"
    );
    for table in ["XSDT", "FACP", "DSDT", "APIC"] {
        assert!(
            out.lines()
                .any(|l| l.contains(&format!("ACPI: {table} 0x")) && l.contains("HUGVMM")),
            "the kernel did not list hugevmm's {table}:\n{out}"
        );
    }
    assert!(
        out.contains("Using ACPI (MADT) for SMP configuration information"),
        "the kernel did not take its CPUs from the MADT:\n{out}"
    );
    assert!(
        out.contains("nr_cpu_ids:2 "),
        "the kernel did not see both vCPUs:\n{out}"
    );
    assert_ne!(
        run.status,
        Some(124),
        "the VM must end by itself, not by --timeout:\n{}",
        run.stderr
    );
}

#[test]
fn a_debian_kernel_boots_on_two_vcpus_as_far_as_this_host_allows() {
    if skip_without_kvm("linux_boot") {
        return;
    }
    let Some(kernel) = kernel() else {
        skip(
            "linux_boot",
            Resource::Kernel,
            "no kernel at target/linux-kernel/vmlinuz; run .ci/fetch-kernel (CI does)",
        );
        return;
    };
    let host = host_kind();
    if host == HostKind::Native {
        match static_busybox().and_then(|b| Ok((b, kernel_modules()?))) {
            Ok((busybox, modules)) => return full_boot(&kernel, &busybox, &modules),
            Err(why) => skip(
                "linux_boot full variant (running the banner variant instead)",
                Resource::Busybox,
                format!("{why}; apt-get install busybox-static (.ci/run does)"),
            ),
        }
    }
    banner_boot(&kernel, host);
}

fn banner_boot(kernel: &Path, host: HostKind) {
    let cmdline = "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1 hugevmm.test=banner";
    let run = run_hugevmm(&boot_args(kernel, cmdline, &[]));
    check_early_boot(&run, cmdline);
    if run.stderr.contains("emulation failure") {
        eprintln!(
            "linux_boot: banner variant ({host:?} host, guest CPL 0 emulated): banner, cmdline and e820 checked on 2 vCPUs; the VM ended with an emulation failure, as expected here"
        );
        assert_eq!(run.status, Some(125));
        assert!(
            run.stderr.contains("emulation failure at rip 0x"),
            "{}",
            run.stderr
        );
    } else {
        eprintln!(
            "linux_boot: banner variant on a {host:?} host, but the kernel ran on (exit {:?}); the full variant runs on hosts with vmx/svm and no kvm_pvm module",
            run.status
        );
    }
}

/// The full variant's command line.
const FULL_CMDLINE: &str =
    "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1 rdinit=/init hugevmm.test=full";

/// The full variant's inputs, in a scratch directory removed on drop: the
/// initramfs, and a disk whose first sector holds `disk_text`.
struct FullBootFiles {
    dir: PathBuf,
    initrd: PathBuf,
    disk: PathBuf,
    disk_text: String,
}

impl FullBootFiles {
    fn new(variant: &str, busybox: &[u8], modules: &[(String, Vec<u8>)]) -> Self {
        let dir =
            std::env::temp_dir().join(format!("hugevmm-linux-{variant}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let initrd = dir.join("initramfs.cpio");
        std::fs::write(&initrd, cpio::newc(&initramfs(busybox, modules))).unwrap();
        let disk_text = format!(
            "hugevmm-virtio-blk-sector-0-{variant}-{}",
            std::process::id()
        );
        let disk = dir.join("disk.img");
        let mut image = vec![0u8; 1 << 20];
        image[..disk_text.len()].copy_from_slice(disk_text.as_bytes());
        std::fs::write(&disk, &image).unwrap();
        Self {
            dir,
            initrd,
            disk,
            disk_text,
        }
    }
}

impl Drop for FullBootFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The devices only in the DSDT, as a stock kernel (no
/// CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES) needs them.
const FULL_DEVICE_ARGS: [&str; 3] = ["--balloon", "--virtio-announce", "acpi"];

fn full_boot(kernel: &Path, busybox: &[u8], modules: &[(String, Vec<u8>)]) {
    let files = FullBootFiles::new("full", busybox, modules);
    let mut extra = vec![
        "--initrd".to_string(),
        files.initrd.display().to_string(),
        "--disk".to_string(),
        files.disk.display().to_string(),
    ];
    extra.extend(FULL_DEVICE_ARGS.map(String::from));
    let run = run_hugevmm(&boot_args(kernel, FULL_CMDLINE, &extra));
    check_full_boot(&run, FULL_CMDLINE, &files.disk_text);
    eprintln!(
        "linux_boot: full variant (VMX/SVM host): banner, cmdline, e820, ACPI tables, 2 CPUs, virtio drivers bound from the DSDT, virtio-blk read and ACPI power-off checked"
    );
}

/// What follows `marker` on the first line of `text` that has it.
fn marked(text: &str, marker: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.split_once(marker).map(|(_, v)| v.trim().to_string()))
}

/// What the full variant checks, natively or nested.
fn check_full_boot(run: &Run, cmdline: &str, disk_text: &str) {
    check_early_boot(run, cmdline);
    let out = &run.stdout;
    assert!(
        !run.stderr.contains("emulation failure"),
        "this host has vmx/svm but its KVM still stopped the kernel:\n{}",
        run.stderr
    );
    assert!(
        out.contains(INIT_MARKER),
        "the initramfs's /init never ran:\n{out}\n{}",
        run.stderr
    );
    assert!(
        !out.contains(INSMOD_FAILED_MARKER),
        "a module from the kernel package would not load:\n{out}"
    );
    let marked = |marker: &str| marked(out, marker);
    assert_eq!(
        marked(CPUS_MARKER).as_deref(),
        Some("2"),
        "the kernel must bring up both vCPUs from the MADT:\n{out}"
    );
    let drivers = marked(VIRTIO_MARKER).unwrap_or_default();
    assert!(
        drivers.contains("virtio_blk") && drivers.contains("virtio_balloon"),
        "the DSDT's virtio-mmio devices must be bound to their drivers, got {drivers:?}:\n{out}"
    );
    assert!(
        !out.contains(NO_DISK_MARKER),
        "/init ran but /dev/vda never appeared. The kernel needs ACPI (or \
         CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y) and virtio-mmio and virtio-blk, built in or \
         as modules in the initramfs (HUGEVMM_TEST_MODULES).\n{out}"
    );
    let read = out.lines().find_map(|l| {
        l.split_once(DISK_MARKER)
            .map(|(_, d)| d.trim_end().to_string())
    });
    assert_eq!(
        read.as_deref(),
        Some(disk_text),
        "what /init read from /dev/vda:\n{out}"
    );
    assert_eq!(
        run.status,
        Some(0),
        "poweroff -f ends the VM cleanly:\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("ACPI power off (S5)"),
        "the guest powered off through the ACPI sleep registers:\n{}",
        run.stderr
    );
}

/// The full variant on any host, this project's PVM hosts included: QEMU's
/// TCG emulates an AMD machine with SVM, the same stock kernel boots in it
/// with kvm_amd, and hugevmm runs there (`tools/nested-full-boot`), with
/// the swap engine on and working: a `--mem-limit` below what the boot
/// touches, so that the inner run's `--stats-json` (printed by the outer
/// machine) shows chunks evicted and faulted back from the store. Slow
/// emulation, a few minutes.
#[test]
fn a_debian_kernel_boots_fully_under_hugevmm_nested_in_qemu_tcg() {
    let Some(kernel) = kernel() else {
        skip(
            "linux_nested_full_boot",
            Resource::Kernel,
            "no kernel at target/linux-kernel/vmlinuz; run .ci/fetch-kernel (CI does)",
        );
        return;
    };
    if std::env::var_os("HUGEVMM_TEST_KERNEL").is_some() {
        skip_by_choice("linux_nested_full_boot", format!("it boots .ci/fetch-kernel's kernel, as host and guest, not HUGEVMM_TEST_KERNEL ({})", kernel.display()));
        return;
    }
    if !have_program("qemu-system-x86_64") {
        skip(
            "linux_nested_full_boot",
            Resource::Qemu,
            "no qemu-system-x86_64; apt-get install qemu-system-x86 (.ci/run does)",
        );
        return;
    }
    if !have_program("cpio") {
        skip(
            "linux_nested_full_boot",
            Resource::Cpio,
            "no cpio; apt-get install cpio (.ci/run does)",
        );
        return;
    }
    let inputs = static_busybox().and_then(|b| Ok((b, kernel_modules()?)));
    let (busybox, modules) = match inputs {
        Ok(inputs) => inputs,
        Err(why) => {
            skip(
                "linux_nested_full_boot",
                Resource::Busybox,
                format!("{why}; apt-get install busybox-static (.ci/run does)"),
            );
            return;
        }
    };
    let files = FullBootFiles::new("nested", &busybox, &modules);
    // The guest also waits for the host to set a 64 MiB balloon target at
    // run time (16384 pages of 4 KiB).
    let balloon_pages = 16384;
    let cmdline = format!("{FULL_CMDLINE} hugevmm.balloon_wait={balloon_pages}");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/nested-full-boot");
    // The outer console stays there when the test fails (the artifact to
    // read first), and is removed when it passes.
    let artifacts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../target/test-artifacts/nested-full-boot-{}",
        std::process::id()
    ));
    let kept = KeptOnFailure::new(artifacts.clone());
    let outer_console = artifacts.join("outer-console.log");
    // In the outer machine; printed there once hugevmm ended.
    let inner_stats = "/tmp/inner-stats.json";
    let mem_limit = nested_mem_limit();
    let mut cmd = Command::new(script);
    cmd.arg("--work")
        .arg(&artifacts)
        .arg("--hugevmm")
        .arg(hugevmm_bin())
        .arg("--initrd")
        .arg(&files.initrd)
        .arg("--disk")
        .arg(&files.disk)
        .args(["--timeout", "1000"])
        .args(["--balloon-when-ready", "64M"])
        .args(["--emit-file", inner_stats, "--"])
        // NESTED_MEM_LIMIT below what the boot touches: the engine evicts.
        .args(["--mem", "256M", "--vcpus", "2", "--mem-limit", &mem_limit])
        .args(["--stats-json", inner_stats])
        .args(FULL_DEVICE_ARGS)
        .args(["--timeout", "900", "--cmdline", &cmdline])
        .stdin(Stdio::null());
    let output = run_with_limit(cmd, NESTED_RUN_LIMIT);
    let console = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(3) {
        // The script checked the same inputs as above, and the KVM modules.
        skip("linux_nested_full_boot", Resource::Kernel, stderr.trim());
        return;
    }
    // CI shows the head and the tail of a failure's output: the panic's
    // own lines go first, before the whole console.
    assert_eq!(
        output.status.code(),
        Some(0),
        "the outer machine did not run hugevmm: {stderr}\n{}\n{console}\n(outer console kept in {})",
        panic_excerpt(&console),
        outer_console.display()
    );
    // hugevmm's output and the inner guest's console share the outer
    // console; both kinds of check read all of it.
    let inner: String = console
        .lines()
        // The outer console may put terminal escapes before the marker.
        .skip_while(|l| !l.contains("OUTER-HUGEVMM-START"))
        .skip(1)
        .take_while(|l| !l.contains("OUTER-HUGEVMM-EXIT:"))
        .map(|l| format!("{l}\n"))
        .collect();
    let status = console.lines().find_map(|l| {
        l.split_once("OUTER-HUGEVMM-EXIT: ")
            .and_then(|(_, s)| s.trim().parse().ok())
    });
    let run = Run {
        status,
        stdout: inner.clone(),
        stderr: inner,
        stats: None,
    };
    check_full_boot(&run, &cmdline, &files.disk_text);
    let inflated: u64 = marked(&run.stdout, BALLOON_INFLATED_MARKER)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        inflated >= balloon_pages,
        "the guest's balloon driver inflated {inflated} pages, not the {balloon_pages} set through the control socket:\n{console}"
    );
    let host_view = marked(&console, "OUTER-BALLOON-STATS:").unwrap_or_default();
    assert!(
        host_view.contains(&format!("\"actual_pages\":{balloon_pages}")),
        "`hugevmm ctl balloon-stats` must show the guest's actual = target: {host_view}\n{console}"
    );
    // Linux's driver primes the statistics queue while probing.
    assert!(
        !host_view.contains("\"stats_reports\":0") && !host_view.contains("\"guest_stats\":null"),
        "the guest's memory statistics never reached the host: {host_view}\n{console}"
    );
    let deflated: u64 = marked(&run.stdout, BALLOON_DEFLATED_MARKER)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        deflated >= balloon_pages,
        "the guest's balloon driver deflated {deflated} pages after the target went back to 0:\n{console}"
    );
    // The swap engine did its work under the boot: the inner run's stats.
    let stats_line = marked(&console, &format!("OUTER-FILE {inner_stats}:")).unwrap_or_default();
    let stats: serde_json::Value = serde_json::from_str(&stats_line).unwrap_or_else(|e| {
        panic!("the inner run's --stats-json ({e}): {stats_line:?}\n{console}")
    });
    let swap = |pointer: &str| stats["swap"].pointer(pointer).and_then(|v| v.as_u64());
    // Restores from the store: whole chunks, and pages of split ones.
    let (evictions, store_faults) = (
        swap("/evictions"),
        swap("/faults/store")
            .zip(swap("/split/page_faults/store"))
            .map(|(c, p)| c + p),
    );
    assert!(
        evictions.is_some_and(|n| n > 0) && store_faults.is_some_and(|n| n > 0),
        "under --mem-limit {mem_limit} the swap engine must evict chunks and fault them back from the store during the boot: evictions {evictions:?}, store faults (chunks and pages) {store_faults:?}\n{stats}"
    );
    drop(kept);
    eprintln!(
        "linux_nested_full_boot: full variant nested in QEMU TCG (SVM): banner, cmdline, e820, ACPI tables, 2 CPUs, virtio drivers bound from the DSDT, virtio-blk read, balloon resized at run time through the control socket ({inflated} pages inflated by the guest driver; host: {host_view}) and ACPI power-off checked; swap engine under --mem-limit {mem_limit}: {} evictions, {} faults ({} from the store), resident max {} MiB",
        evictions.unwrap_or(0),
        swap("/faults/total").unwrap_or(0),
        store_faults.unwrap_or(0),
        swap("/resident_bytes_max").unwrap_or(0) >> 20
    );
}

/// The nested boot's memory limit: under what the kernel and its
/// initramfs touch while booting. Measured through tools/nested-full-boot
/// with the test's arguments: at 192M the boot peaked at 86 MiB resident
/// and the engine evicted nothing (0 evictions, 69 zero-fill faults, 140 s);
/// at 64M it evicted 492 chunks and restored 90 chunks and 805 pages of
/// split ones from the store, and booted in 376 s. Before 99e5016 a fault
/// on a resident page of a split chunk could install a zero page over a
/// page an evictor was moving out: at 64M about one boot in three then
/// crashed on zeroed kernel memory (a NULL pointer in `prepare_creds`), and
/// at 48M one hit a general protection fault in `do_sync_core`; with the
/// fix, four boots at 64M and 48M all passed.
const NESTED_MEM_LIMIT: &str = "64M";

/// NESTED_MEM_LIMIT, or `HUGEVMM_NESTED_MEM_LIMIT` to reproduce a boot
/// that thrashes harder (the 48M fault above).
fn nested_mem_limit() -> String {
    std::env::var("HUGEVMM_NESTED_MEM_LIMIT").unwrap_or_else(|_| NESTED_MEM_LIMIT.to_string())
}

/// The lines of the console's first panic or oops, from the report's
/// start (`cut here`, `BUG:`, `Oops:`, `general protection fault`) to the
/// `Kernel panic` line, at most 60; empty when nothing panicked.
fn panic_excerpt(console: &str) -> String {
    let lines: Vec<&str> = console.lines().collect();
    let Some(end) = lines
        .iter()
        .position(|l| l.contains("Kernel panic - not syncing"))
    else {
        return String::new();
    };
    let starts = ["cut here", "BUG:", "Oops:", "general protection fault"];
    let start = (0..end)
        .rev()
        .take(200)
        .find(|&i| starts.iter().any(|s| lines[i].contains(s)))
        .unwrap_or(end.saturating_sub(40));
    let start = start.max(end.saturating_sub(60));
    let mut excerpt = String::from("the panic:\n");
    for l in &lines[start..=end] {
        excerpt.push_str(l);
        excerpt.push('\n');
    }
    excerpt
}

/// The nested boot's bound: swapping under TCG makes the boot take minutes.
const NESTED_RUN_LIMIT: Duration = Duration::from_secs(1200);

/// A directory of a test's artifacts: removed when the test passes, kept
/// (and named on stderr) when it panics.
struct KeptOnFailure(PathBuf);

impl KeptOnFailure {
    fn new(dir: PathBuf) -> Self {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Self(dir)
    }
}

impl Drop for KeptOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("artifacts of the failed run kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The busybox binary if it is there and static (an initramfs has no
/// shared libraries), else why not.
fn static_busybox() -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(BUSYBOX).map_err(|e| format!("no {BUSYBOX}: {e}"))?;
    match elf_is_static(&bytes) {
        Some(true) => Ok(bytes),
        Some(false) => Err(format!("{BUSYBOX} is dynamically linked")),
        None => Err(format!("{BUSYBOX} is not a 64-bit ELF")),
    }
}

/// Whether a 64-bit little-endian ELF has no program interpreter (None:
/// not such an ELF).
fn elf_is_static(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if elf.get(0..5)? != b"\x7fELF\x02" {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let phoff = u64::from_le_bytes(elf.get(0x20..0x28)?.try_into().ok()?) as usize;
    let (phentsize, phnum) = (u16_at(0x36)? as usize, u16_at(0x38)? as usize);
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?) == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// The /init script: mounts the kernel filesystems, loads the modules,
/// prints the markers and the disk's first sector (its NUL padding
/// dropped), powers off.
fn init_script() -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
# Keep kernel messages from splitting the lines the test looks for.
echo 1 > /proc/sys/kernel/printk
echo {INIT_MARKER}
if [ -f /lib/modules/load-order ]; then
    for m in $(cat /lib/modules/load-order); do
        insmod /lib/modules/$m.ko || echo "{INSMOD_FAILED_MARKER} $m"
    done
fi
echo "{CPUS_MARKER} $(grep -c ^processor /proc/cpuinfo)"
n=0
while [ ! -b /dev/vda ] && [ $n -lt 20 ]; do sleep 1; n=$((n + 1)); done
if [ -b /dev/vda ]; then
    echo "{DISK_MARKER}$(dd if=/dev/vda bs=512 count=1 2>/dev/null | tr -d '\000')"
else
    echo "{NO_DISK_MARKER}: virtio devices: $(ls /sys/bus/virtio/devices 2>&1)"
fi
drivers=""
for d in /sys/bus/virtio/devices/*; do
    [ -e "$d/driver" ] && drivers="$drivers $(basename "$(readlink "$d/driver")")"
done
echo "{VIRTIO_MARKER}$drivers"
# hugevmm.balloon_wait=PAGES: say so, then wait (up to a minute) until the
# balloon driver has inflated that many pages, which the host asks for
# through its control socket once it sees the ready line.
want=$(tr ' ' '\n' < /proc/cmdline | grep '^hugevmm.balloon_wait=' | cut -d= -f2)
if [ -n "$want" ]; then
    # Prints /proc/vmstat's counter $1 once it reaches $want, or after a
    # minute.
    vmstat_reaching() {{
        n=0
        while [ $n -lt 60 ]; do
            count=$(grep "^$1 " /proc/vmstat | cut -d' ' -f2)
            [ "${{count:-0}}" -ge "$want" ] && break
            sleep 1; n=$((n + 1))
        done
        echo "${{count:-0}}"
    }}
    echo "{BALLOON_READY_MARKER}"
    echo "{BALLOON_INFLATED_MARKER} $(vmstat_reaching balloon_inflate)"
    # The host checks its side, then sets the target back to 0.
    echo "{BALLOON_DEFLATED_MARKER} $(vmstat_reaching balloon_deflate)"
fi
# Through the FADT's sleep control register: S5 ends the VM.
poweroff -f
"#
    )
}

fn initramfs(busybox: &[u8], modules: &[(String, Vec<u8>)]) -> Vec<cpio::Entry> {
    use cpio::{Entry, Kind};
    let dir = |name: &str| Entry {
        name: name.into(),
        perm: 0o755,
        kind: Kind::Dir,
    };
    let file = |name: String, bytes: Vec<u8>| Entry {
        name,
        perm: 0o644,
        kind: Kind::File(bytes),
    };
    let mut module_entries = Vec::new();
    if !modules.is_empty() {
        module_entries.push(dir("lib"));
        module_entries.push(dir("lib/modules"));
        let order: String = modules
            .iter()
            .map(|(name, _)| format!("{name}\n"))
            .collect();
        module_entries.push(file("lib/modules/load-order".into(), order.into_bytes()));
        for (name, bytes) in modules {
            module_entries.push(file(format!("lib/modules/{name}.ko"), bytes.clone()));
        }
    }
    let mut entries = vec![
        dir("bin"),
        dir("dev"),
        dir("proc"),
        dir("sys"),
        // The kernel opens /dev/console for init's output before /init can
        // mount devtmpfs.
        Entry {
            name: "dev/console".into(),
            perm: 0o600,
            kind: Kind::CharDevice { major: 5, minor: 1 },
        },
        Entry {
            name: "bin/busybox".into(),
            perm: 0o755,
            kind: Kind::File(busybox.to_vec()),
        },
        Entry {
            name: "bin/sh".into(),
            perm: 0o777,
            kind: Kind::Symlink("busybox".into()),
        },
        Entry {
            name: "init".into(),
            perm: 0o755,
            kind: Kind::File(init_script().into_bytes()),
        },
    ];
    entries.extend(module_entries);
    entries
}

fn sample_entries() -> Vec<cpio::Entry> {
    use cpio::{Entry, Kind};
    vec![
        Entry {
            name: "d".into(),
            perm: 0o755,
            kind: Kind::Dir,
        },
        Entry {
            name: "d/odd".into(),
            perm: 0o644,
            kind: Kind::File(b"12345".to_vec()),
        },
        Entry {
            name: "d/empty".into(),
            perm: 0o600,
            kind: Kind::File(Vec::new()),
        },
        Entry {
            name: "d/four".into(),
            perm: 0o700,
            kind: Kind::File(b"abcd".to_vec()),
        },
        Entry {
            name: "link".into(),
            perm: 0o777,
            kind: Kind::Symlink("d/odd".into()),
        },
    ]
}

#[test]
fn initramfs_cpio_parses_back_to_its_entries() {
    let modules = [
        ("virtio".to_string(), b"\x7fELF pretend module".to_vec()),
        ("virtio_blk".to_string(), b"\x7fELF another".to_vec()),
    ];
    let entries = initramfs(b"\x7fELF pretend busybox", &modules);
    let order = entries
        .iter()
        .find(|e| e.name == "lib/modules/load-order")
        .unwrap();
    assert_eq!(
        order.kind,
        cpio::Kind::File(b"virtio\nvirtio_blk\n".to_vec())
    );
    assert!(entries
        .iter()
        .any(|e| e.name == "lib/modules/virtio_blk.ko"));
    assert!(!initramfs(b"x", &[])
        .iter()
        .any(|e| e.name.starts_with("lib")));
    let bytes = cpio::newc(&entries);
    assert_eq!(bytes.len() % 4, 0);
    assert_eq!(&bytes[..6], b"070701");
    assert_eq!(cpio::parse(&bytes).unwrap(), entries);
    let sample = sample_entries();
    assert_eq!(cpio::parse(&cpio::newc(&sample)).unwrap(), sample);
    // Every member's data starts 4-aligned: the kernel's unpacker relies on it.
    let init = entries.iter().find(|e| e.name == "init").unwrap();
    let cpio::Kind::File(script) = &init.kind else {
        panic!("init is a file")
    };
    assert!(script.starts_with(b"#!/bin/busybox sh\n"));
    let at = bytes
        .windows(script.len())
        .position(|w| w == &script[..])
        .unwrap();
    assert_eq!(at % 4, 0);
}

#[test]
fn cpio_header_fields_are_where_newc_puts_them() {
    let bytes = cpio::newc(&[cpio::Entry {
        name: "dev/console".into(),
        perm: 0o600,
        kind: cpio::Kind::CharDevice { major: 5, minor: 1 },
    }]);
    let header = std::str::from_utf8(&bytes[..110]).unwrap();
    // magic, ino 1, mode 020600, uid, gid, nlink 1, mtime, size 0, dev,
    // rdev 5:1, namesize 12, check.
    let want = format!(
        "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
        1, 0o020600, 0, 0, 1, 0, 0, 0, 0, 5, 1, 12, 0
    );
    assert_eq!(header, want);
    assert_eq!(&bytes[110..122], b"dev/console\0");
    assert!(
        cpio::parse(&bytes[..bytes.len() - 4]).is_err(),
        "a truncated trailer is an error"
    );
}

/// An independent check of the writer where busybox is installed: its cpio
/// lists and extracts what we wrote.
#[test]
fn busybox_cpio_reads_our_archives() {
    if !Path::new(BUSYBOX).exists() {
        skip(
            "busybox_cpio_reads_our_archives",
            Resource::Busybox,
            format!("no {BUSYBOX}; apt-get install busybox-static (.ci/run does)"),
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("hugevmm-cpio-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let busybox_cpio = |archive: &[u8], args: &[&str]| {
        let path = dir.join("archive.cpio");
        std::fs::write(&path, archive).unwrap();
        let out = Command::new(BUSYBOX)
            .arg("cpio")
            .args(args)
            .current_dir(&dir)
            .stdin(std::fs::File::open(&path).unwrap())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "busybox cpio {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let initramfs = initramfs(b"not really busybox", &[("m".into(), b"module".to_vec())]);
    let listed = busybox_cpio(&cpio::newc(&initramfs), &["-t"]);
    let names: Vec<&str> = initramfs.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(listed.lines().collect::<Vec<_>>(), names);

    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let path = dir.join("sample.cpio");
    std::fs::write(&path, cpio::newc(&sample_entries())).unwrap();
    let status = Command::new(BUSYBOX)
        .args(["cpio", "-i", "-d"])
        .current_dir(&out_dir)
        .stdin(std::fs::File::open(&path).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(std::fs::read(out_dir.join("d/odd")).unwrap(), b"12345");
    assert_eq!(std::fs::read(out_dir.join("d/four")).unwrap(), b"abcd");
    assert_eq!(std::fs::read(out_dir.join("d/empty")).unwrap(), b"");
    assert_eq!(
        std::fs::read_link(out_dir.join("link")).unwrap(),
        Path::new("d/odd")
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(out_dir.join("d/four"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The full variant cannot run on this project's hosts, so at least its
/// /init must be a script busybox's shell accepts.
#[test]
fn init_script_parses_in_busybox_sh() {
    if !Path::new(BUSYBOX).exists() {
        skip(
            "init_script_parses_in_busybox_sh",
            Resource::Busybox,
            format!("no {BUSYBOX}; apt-get install busybox-static (.ci/run does)"),
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("hugevmm-init-sh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("init");
    std::fs::write(&script, init_script()).unwrap();
    let out = Command::new(BUSYBOX)
        .args(["sh", "-n"])
        .arg(&script)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "busybox sh -n /init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn static_and_dynamic_elfs_are_told_apart() {
    if let Ok(bytes) = std::fs::read(BUSYBOX) {
        eprintln!("{BUSYBOX} static: {:?}", elf_is_static(&bytes));
    }
    // The test binary itself is dynamically linked (it has PT_INTERP).
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(elf_is_static(&me), Some(false));
    assert_eq!(elf_is_static(b"#!/bin/sh\n"), None);
    // A header with no program headers has no interpreter.
    let mut bare = vec![0u8; 64];
    bare[..5].copy_from_slice(b"\x7fELF\x02");
    assert_eq!(elf_is_static(&bare), Some(true));
}

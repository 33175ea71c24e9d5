//! `linux` (opt-in: not part of `all`): a stock Linux kernel under a
//! memory limit, per swap unit. The guest is `.ci/fetch-kernel`'s Debian
//! kernel with a busybox initramfs whose /init fills a tmpfs with files of
//! random bytes (each file's md5 taken from the stream as it is written),
//! then reads every file back and checks its sum, `passes` times, and
//! powers off. The guest's own memory layout is the point: page cache,
//! slab and tmpfs pages lie where the kernel's allocator put them, not in
//! the neat runs a payload writes, which is where a fixed 2 MiB unit was
//! expected to thrash and a fixed 4 KiB unit pays a fault per page.
//!
//! Where this host cannot run guest kernel code natively (PVM, no
//! VMX/SVM) the runs are nested: `tools/nested-full-boot` starts an outer
//! Linux in QEMU's TCG with an emulated SVM CPU and runs this same hugevmm
//! there (its store is then an unlinked file in the outer machine's
//! tmpfs). Units are interleaved, the order rotating every round; the
//! figure is the median time to completion per unit.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::hist::median;
use super::report::{fmt_f, Aim, Headline, Table};
use super::runner::{num, GIB};
use super::{interrupt, Ctx, Mode};

/// The units compared, in the first round's order.
const UNITS: [&str; 3] = ["auto", "4k", "2m"];

/// The sizes of a mode.
struct Plan {
    mem: &'static str,
    mem_limit: &'static str,
    /// Files of 1 MiB written to the tmpfs.
    tmpfs_mib: u32,
    /// Read-back-and-check passes over all files.
    passes: u32,
    rounds: usize,
    /// hugevmm's own --timeout: a run past it counts as not finished.
    run_timeout_s: u32,
}

fn plan(mode: Mode) -> Plan {
    match mode {
        Mode::Quick => Plan {
            mem: "384M",
            mem_limit: "128M",
            tmpfs_mib: 160,
            passes: 1,
            rounds: 1,
            run_timeout_s: 600,
        },
        // The limit is a third of RAM: the kernel's own hot pages then
        // lie in more 2 MiB chunks than the limit holds (at 512M held to
        // 160M a 2m run finished in about a minute; here it thrashes).
        Mode::Full => Plan {
            mem: "384M",
            mem_limit: "128M",
            tmpfs_mib: 192,
            passes: 2,
            rounds: 3,
            run_timeout_s: 900,
        },
    }
}

/// The guest's /init: busybox only. Its lines starting `HUGEVMM-TMPFS-`
/// are what the suite reads; uptimes are the guest's clock.
const INIT: &str = r#"#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs -o size=90% tmpfs /mnt
arg() { sed -n "s/.*hugevmm\.$1=\([0-9]*\).*/\1/p" /proc/cmdline; }
mib=$(arg tmpfs_mib)
passes=$(arg passes)
up() { cut -d' ' -f1 /proc/uptime; }
echo "HUGEVMM-TMPFS-START mib=$mib passes=$passes at=$(up)"
i=0
: > /sums
while [ "$i" -lt "$mib" ]; do
    # The sum comes from the bytes on their way in, not from a re-read.
    sum=$(dd if=/dev/urandom bs=1M count=1 2>/dev/null | tee /mnt/f$i | md5sum | cut -d' ' -f1)
    echo "$sum  /mnt/f$i" >> /sums
    i=$((i + 1))
done
echo "HUGEVMM-TMPFS-WRITTEN at=$(up)"
p=0
bad=0
while [ "$p" -lt "$passes" ]; do
    n=$(md5sum -c /sums 2>&1 | grep -vc ': OK$')
    bad=$((bad + n))
    p=$((p + 1))
done
echo "HUGEVMM-TMPFS-DONE bad=$bad at=$(up)"
poweroff -f
"#;

/// How the runs reach a kernel-capable KVM.
enum Route {
    /// This host runs guest kernels (VMX/SVM, no PVM).
    Native { kernel: PathBuf },
    /// Through `tools/nested-full-boot`.
    Nested { script: PathBuf },
}

impl Route {
    fn name(&self) -> &'static str {
        match self {
            Route::Native { .. } => "native",
            Route::Nested { .. } => "nested in QEMU TCG (tools/nested-full-boot)",
        }
    }
}

/// The checkout this binary was built in (`target/<profile>/hugevmm`), or
/// `HUGEVMM_REPO`: the kernel and the nesting script live there.
fn repo_root(hugevmm: &Path) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("HUGEVMM_REPO") {
        return Some(PathBuf::from(dir));
    }
    hugevmm
        .ancestors()
        .find(|d| d.join("tools/nested-full-boot").is_file())
        .map(Path::to_path_buf)
}

/// Why guest kernels cannot run natively here, if they cannot (the same
/// test as the Linux boot tests').
fn native_problem() -> Option<&'static str> {
    if Path::new("/sys/module/kvm_pvm").exists() {
        return Some("KVM here is PVM (guest CPL 0 is emulated; a stock kernel stops early)");
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hardware = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    (!hardware).then_some("the CPU shows neither vmx nor svm")
}

/// What is missing for the suite, as the SKIP reason, or the route.
fn route(ctx: &Ctx) -> Result<Route, String> {
    let Some(repo) = repo_root(&ctx.hugevmm) else {
        return Err(format!(
            "cannot find the hugevmm checkout from {} (the suite needs its target/linux-kernel and tools/): set HUGEVMM_REPO",
            ctx.hugevmm.display()
        ));
    };
    let kernel = repo.join("target/linux-kernel/vmlinuz");
    if !kernel.is_file() {
        return Err(format!(
            "no kernel at {}: run .ci/fetch-kernel in {}",
            kernel.display(),
            repo.display()
        ));
    }
    if !Path::new("/bin/busybox").is_file() {
        return Err(
            "no /bin/busybox for the guest's initramfs: apt-get install busybox-static".into(),
        );
    }
    if which("cpio").is_none() {
        return Err("no cpio to pack the initramfs: apt-get install cpio".into());
    }
    match native_problem() {
        None => Ok(Route::Native { kernel }),
        Some(_) if which("qemu-system-x86_64").is_none() => Err(format!(
            "{}, and no qemu-system-x86_64 to nest in: apt-get install qemu-system-x86",
            native_problem().unwrap_or_default()
        )),
        Some(_) => Ok(Route::Nested {
            script: repo.join("tools/nested-full-boot"),
        }),
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// Writes the initramfs (busybox and [`INIT`]) under `dir`, packed by
/// cpio; returns its path.
fn make_initramfs(dir: &Path) -> Result<PathBuf> {
    let root = dir.join("root");
    let _ = std::fs::remove_dir_all(&root);
    for sub in ["bin", "dev", "proc", "sys", "mnt"] {
        std::fs::create_dir_all(root.join(sub))
            .with_context(|| format!("cannot create {}", root.join(sub).display()))?;
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).context("cannot copy /bin/busybox")?;
    std::os::unix::fs::symlink("busybox", root.join("bin/sh"))
        .context("cannot link bin/sh to busybox")?;
    let init = root.join("init");
    std::fs::write(&init, INIT).context("cannot write the initramfs's /init")?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    let cpio_path = dir.join("tmpfs-initramfs.cpio");
    let file = std::fs::File::create(&cpio_path)
        .with_context(|| format!("cannot create {}", cpio_path.display()))?;
    // `find` output as cpio's file list: the same packing as
    // tools/nested-full-boot's outer initramfs.
    let list = Command::new("find")
        .arg(".")
        .current_dir(&root)
        .output()
        .context("cannot run find")?;
    let mut pack = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .context("cannot run cpio")?;
    use std::io::Write as _;
    pack.stdin
        .take()
        .context("cpio's stdin")?
        .write_all(&list.stdout)?;
    let status = pack.wait()?;
    if !status.success() {
        bail!("cpio failed ({status}) packing {}", root.display());
    }
    Ok(cpio_path)
}

/// One run's outcome.
struct Outcome {
    unit: &'static str,
    round: usize,
    /// hugevmm's exit status (124: its --timeout).
    status: Option<i32>,
    /// The guest's own check: files whose sum did not match, if it got
    /// that far.
    bad_files: Option<u64>,
    /// Guest uptime from /init's start to the end of the last pass.
    workload_s: Option<f64>,
    stats: Value,
}

impl Outcome {
    fn finished(&self) -> bool {
        self.status == Some(0) && self.bad_files == Some(0)
    }

    fn elapsed_s(&self) -> f64 {
        num(&self.stats, "/elapsed_s")
    }

    fn io_gib(&self) -> f64 {
        (num(&self.stats, "/swap/bytes_read") + num(&self.stats, "/swap/bytes_written")) / GIB
    }

    fn result(&self) -> String {
        match (self.status, self.bad_files) {
            (Some(0), Some(0)) => "ok".into(),
            (_, Some(n)) if n > 0 => format!("{n} files WRONG"),
            (Some(124), _) => "did not finish (timeout)".into(),
            (s, _) => format!("failed (exit {s:?})"),
        }
    }
}

/// The value after `key=` in the line that starts with `marker`.
fn marked_field(text: &str, marker: &str, key: &str) -> Option<f64> {
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.find(marker).map(|i| &l[i + marker.len()..]))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn parse_outcome(
    unit: &'static str,
    round: usize,
    console: &str,
    status: Option<i32>,
    stats: Value,
) -> Outcome {
    let start = marked_field(console, "HUGEVMM-TMPFS-START", "at");
    let end = marked_field(console, "HUGEVMM-TMPFS-DONE", "at");
    Outcome {
        unit,
        round,
        status,
        bad_files: marked_field(console, "HUGEVMM-TMPFS-DONE", "bad").map(|v| v as u64),
        workload_s: start.zip(end).map(|(s, e)| e - s),
        stats,
    }
}

fn run_args(p: &Plan, unit: &str, stats_path: &str) -> Vec<String> {
    let cmdline = format!(
        "console=ttyS0 panic=-1 rdinit=/init hugevmm.tmpfs_mib={} hugevmm.passes={}",
        p.tmpfs_mib, p.passes
    );
    [
        "--mem",
        p.mem,
        "--mem-limit",
        p.mem_limit,
        "--swap-unit",
        unit,
        "--stats-json",
        stats_path,
        "--timeout",
        &p.run_timeout_s.to_string(),
        "--cmdline",
        &cmdline,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run_one(
    ctx: &Ctx,
    route: &Route,
    p: &Plan,
    initrd: &Path,
    unit: &'static str,
    round: usize,
) -> Result<Outcome> {
    let name = format!("linux-tmpfs-{unit}-{round}");
    let console_path = ctx.raw_path(&format!("{name}.console.log"));
    let stats_path = ctx.raw_path(&format!("{name}.json"));
    let _ = std::fs::remove_file(&stats_path);
    let (console, status, stats_text) = match route {
        Route::Native { kernel } => {
            let mut cmd = Command::new(&ctx.hugevmm);
            cmd.arg("run")
                .arg("--kernel")
                .arg(kernel)
                .arg("--initrd")
                .arg(initrd)
                .args(run_args(p, unit, &stats_path.to_string_lossy()))
                .env("TMPDIR", &ctx.store_dir)
                .stdin(Stdio::null());
            let out = cmd.output().context("cannot start hugevmm")?;
            let console = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let stats = std::fs::read_to_string(&stats_path).unwrap_or_default();
            (console, out.status.code(), stats)
        }
        Route::Nested { script } => {
            let inner_stats = "/tmp/hugevmm-stats.json";
            let out = Command::new(script)
                .arg("--hugevmm")
                .arg(&ctx.hugevmm)
                .arg("--initrd")
                .arg(initrd)
                .args(["--timeout", &(p.run_timeout_s + 300).to_string()])
                .args(["--emit-file", inner_stats, "--"])
                .args(run_args(p, unit, inner_stats))
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("cannot start {}", script.display()))?;
            let console = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if out.status.code() != Some(0) {
                std::fs::write(&console_path, &console)?;
                bail!(
                    "{} could not run hugevmm in the outer machine ({}); console in {}",
                    script.display(),
                    out.status,
                    console_path.display()
                );
            }
            let status = console.lines().find_map(|l| {
                l.split_once("OUTER-HUGEVMM-EXIT: ")
                    .and_then(|(_, s)| s.trim().parse().ok())
            });
            let marker = format!("OUTER-FILE {inner_stats}: ");
            let stats = console
                .lines()
                .find_map(|l| l.split_once(&marker).map(|(_, s)| s.to_string()))
                .unwrap_or_default();
            if !stats.is_empty() {
                std::fs::write(&stats_path, &stats)?;
            }
            (console, status, stats)
        }
    };
    interrupt::check()?;
    std::fs::write(&console_path, &console)
        .with_context(|| format!("cannot write {}", console_path.display()))?;
    let stats: Value = serde_json::from_str(&stats_text).with_context(|| {
        format!(
            "run {name} left no statistics (exit {status:?}); console in {}",
            console_path.display()
        )
    })?;
    Ok(parse_outcome(unit, round, &console, status, stats))
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let p = plan(ctx.mode);
    let route = match route(ctx) {
        Ok(r) => r,
        Err(why) => {
            ctx.skip("linux suite", &why);
            return Ok(());
        }
    };
    if ctx.kvm_unusable.is_some() {
        return Ok(());
    }
    let initrd = make_initramfs(&ctx.raw_path("linux-initramfs"))?;
    ctx.progress.note(&format!(
        "guest: {} RAM held to {}, tmpfs of {} x 1 MiB random files, {} check passes; {}",
        p.mem,
        p.mem_limit,
        p.tmpfs_mib,
        p.passes,
        route.name()
    ));
    ctx.progress.plan(p.rounds * UNITS.len());
    let mut outcomes: Vec<Outcome> = Vec::new();
    // A unit that ran out of time once is not run again: another round
    // would only spend the same timeout to say the same.
    let mut timed_out: Vec<&str> = Vec::new();
    for round in 0..p.rounds {
        for k in 0..UNITS.len() {
            let unit = UNITS[(k + round) % UNITS.len()];
            let label = format!(
                "Linux tmpfs workload, --swap-unit {unit} (round {})",
                round + 1
            );
            interrupt::check()?;
            if timed_out.contains(&unit) {
                ctx.progress.note(&format!(
                    "{label}: not run (did not finish within {} s in an earlier round)",
                    p.run_timeout_s
                ));
                continue;
            }
            ctx.progress.start(&label);
            match run_one(ctx, &route, &p, &initrd, unit, round + 1) {
                Ok(o) => {
                    ctx.progress.done(&format!(
                        "{}: {:.1} s (guest workload {}), store I/O {:.2} GiB",
                        o.result(),
                        o.elapsed_s(),
                        o.workload_s.map_or("-".into(), |s| format!("{s:.1} s")),
                        o.io_gib()
                    ));
                    // A unit that does not finish in time is a figure
                    // (the table says so); a wrong file or a crash is a
                    // failure of the invocation.
                    if !o.finished() && o.status != Some(124) {
                        ctx.report.failures.push(format!("{label}: {}", o.result()));
                    }
                    if o.status == Some(124) {
                        timed_out.push(unit);
                    }
                    outcomes.push(o);
                }
                Err(e) => {
                    interrupt::check()?;
                    let msg = format!("{e:#}");
                    ctx.progress.failed(&msg);
                    ctx.report.failures.push(format!("{label}: {msg}"));
                }
            }
        }
    }
    report(ctx, &p, &route, &outcomes);
    Ok(())
}

fn report(ctx: &mut Ctx, p: &Plan, route: &Route, outcomes: &[Outcome]) {
    let mut t = Table::new(
        &format!(
            "linux: Debian kernel + busybox, {} x 1 MiB tmpfs files written then checked {} times, {} RAM held to {}, default store, {}",
            p.tmpfs_mib, p.passes, p.mem, p.mem_limit, route.name()
        ),
        &[
            "unit",
            "round",
            "result",
            "elapsed s",
            "guest workload s",
            "store I/O GiB",
            "store faults",
            "fault p50 us",
            "fault p99 us",
            "fault max us",
            "splits",
            "collapses",
        ],
    );
    let mut runs_json = Vec::new();
    for o in outcomes {
        let s = &o.stats;
        t.row(vec![
            o.unit.into(),
            o.round.to_string(),
            o.result(),
            fmt_f(o.elapsed_s(), 1),
            o.workload_s.map_or("-".into(), |v| fmt_f(v, 1)),
            fmt_f(o.io_gib(), 2),
            fmt_f(num(s, "/swap/faults/store"), 0),
            fmt_f(num(s, "/swap/fault_latency_us/p50"), 0),
            fmt_f(num(s, "/swap/fault_latency_us/p99"), 0),
            fmt_f(num(s, "/swap/fault_latency_us/max"), 0),
            fmt_f(num(s, "/swap/split/splits"), 0),
            fmt_f(num(s, "/swap/split/collapses_verified"), 0),
        ]);
        runs_json.push(json!({
            "unit": o.unit,
            "round": o.round,
            "finished": o.finished(),
            "exit_status": o.status,
            "bad_files": o.bad_files,
            "elapsed_s": o.elapsed_s(),
            "workload_s": o.workload_s,
            "store_io_gib": o.io_gib(),
            "store_faults": num(s, "/swap/faults/store"),
            "fault_latency_us": s.pointer("/swap/fault_latency_us").cloned(),
            "splits": num(s, "/swap/split/splits"),
        }));
    }
    // Median time to completion per unit, over the runs that finished
    // with every file intact; a unit none of whose runs finished has none.
    let med = |unit: &str| {
        median(
            &outcomes
                .iter()
                .filter(|o| o.unit == unit && o.finished())
                .map(Outcome::elapsed_s)
                .collect::<Vec<_>>(),
        )
    };
    let medians: Vec<(&str, Option<f64>)> = UNITS.iter().map(|&u| (u, med(u))).collect();
    t.note(&format!(
        "median time to completion: {}",
        medians
            .iter()
            .map(|(u, m)| format!(
                "{u} {}",
                m.map_or("did not finish".into(), |v| format!("{v:.1} s"))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let (auto, k4, m2) = (medians[0].1, medians[1].1, medians[2].1);
    if let (Some(a), Some(b)) = (auto, m2) {
        t.note(&format!("auto / 2m time {:.2}", a / b));
    }
    if let (Some(a), Some(b)) = (auto, k4) {
        t.note(&format!("auto / 4k time of the medians {:.2}", a / b));
        // Per round, both finished: the noise rule's values.
        let per_round: Vec<f64> = (1..=p.rounds)
            .filter_map(|round| {
                let find = |unit: &str| {
                    outcomes
                        .iter()
                        .find(|o| o.unit == unit && o.round == round && o.finished())
                        .map(Outcome::elapsed_s)
                };
                Some(find("auto")? / find("4k")?)
            })
            .collect();
        ctx.report.headline.push(Headline::new(
            "linux_tmpfs_auto_over_4k_time",
            "Linux tmpfs workload under a limit, time auto / 4k",
            per_round,
            Some(Aim::AtMost(1.0)),
            format!(
                "hugevmm elapsed of auto over 4k in the same round, {} interleaved rounds ({})",
                p.rounds,
                route.name()
            ),
        ));
    }
    ctx.report.tables.push(t);
    ctx.report.set(
        "linux",
        json!({
            "route": route.name(),
            "mem": p.mem,
            "mem_limit": p.mem_limit,
            "tmpfs_mib": p.tmpfs_mib,
            "passes": p.passes,
            "runs": runs_json,
            "median_elapsed_s": medians.iter().map(|(u, m)| (u.to_string(), json!(m))).collect::<serde_json::Map<String, Value>>(),
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_lines_give_the_outcome() {
        let console = "noise\nHUGEVMM-TMPFS-START mib=4 passes=1 at=3.50\n[ 9.0] x\n\
                       HUGEVMM-TMPFS-WRITTEN at=5.00\nHUGEVMM-TMPFS-DONE bad=0 at=10.25\n";
        let o = parse_outcome("auto", 1, console, Some(0), json!({"elapsed_s": 12.0}));
        assert_eq!(o.bad_files, Some(0));
        assert!((o.workload_s.unwrap() - 6.75).abs() < 1e-9);
        assert!(o.finished());
        let wrong = parse_outcome(
            "4k",
            1,
            "HUGEVMM-TMPFS-DONE bad=2 at=1\n",
            Some(0),
            json!({}),
        );
        assert!(!wrong.finished());
        assert_eq!(wrong.result(), "2 files WRONG");
        let cut = parse_outcome(
            "2m",
            1,
            "HUGEVMM-TMPFS-START mib=4 passes=1 at=1\n",
            Some(124),
            json!({}),
        );
        assert!(!cut.finished());
        assert_eq!(cut.workload_s, None);
        assert_eq!(cut.result(), "did not finish (timeout)");
    }

    #[test]
    fn the_run_arguments_carry_the_workload() {
        let args = run_args(&plan(Mode::Quick), "auto", "/tmp/s.json");
        let cmdline = args.last().unwrap();
        assert!(cmdline.contains("hugevmm.tmpfs_mib=160") && cmdline.contains("hugevmm.passes=1"));
        assert!(args.windows(2).any(|w| w == ["--swap-unit", "auto"]));
    }
}

//! `fault-4k`: where the time of one 4 KiB store fault goes on this host
//! (issue 33, item 1), with the care of the 2 MiB floor (`floor.rs`): each
//! part timed on its own with the engine's building blocks, the variants
//! alternated in rounds (the order rotating each round), and every figure
//! a median with its p99 and the spread (min-max) of the per-round values.
//!
//! Three kinds of figures:
//! - **In the VM** (`hugevmm run` subprocesses, `--swap-unit 4k`): randwrite
//!   over a working set four times `--mem-limit`, so three touches in four
//!   fault and, once every page was written, every fault is a store (or
//!   staging) fault. The bench follows the run through its API socket
//!   (`GET /stats`) and `/proc/PID/task/*`: after the warm-up (zero
//!   faults under 5 % of the faults, twice in a row) a window of samples
//!   gives the wall time, CPU time, run-queue wait and context switches
//!   per fault, by thread;
//!   `PUT /actions quit` then ends the run, whose `--stats-json` holds the
//!   engine's service-time histograms. Variants: 1 vCPU, 2 vCPUs with one
//!   and with two fault threads, the file store and `mem:lz4`, and a run
//!   with no limit whose every fault is a zero fault (a userfault round
//!   trip through KVM with no I/O and no eviction).
//! - **A userfault round trip without KVM** (two threads of this process):
//!   one writes to missing pages of a registered region, the other serves
//!   them as the engine's fault thread does (poll, read, install, wake);
//!   every step is stamped on one clock.
//! - **The parts of a service and of the eviction it forces**, in this
//!   process: store reads, `UFFDIO_COPY`/`MOVE`/`ZEROPAGE`/`WAKE` of one
//!   page, the eviction's move-out and page writes (one page per write; 64
//!   pages as 64 writes in one submission, as the engine writes; 64 pages
//!   as one 256 KiB write), and the host kernel's own swap-in of a page:
//!   a probe process writes the randwrite working set inside a memory
//!   cgroup of the VM runs' limit, with a swap file of the bench's, then
//!   times random touches (root; both removed afterwards). A cgroup
//!   because `MADV_PAGEOUT` leaves the pages in the swap cache, where a
//!   touch finds them without I/O.
//!
//! `HUGEVMM_BENCH_FAULT_4K_PLAN=tiny` shrinks everything to one short
//! round (the suite's test).

use anyhow::{bail, Context, Result};
use guestmem::host::range::RawRange;
use guestmem::host::AnonMapping;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use swap::store::{Codec, FileStore, MemStore, SlotId, Store, WriteRequest};
use swap::uffd::{mode, CopyOptions, MoveOptions, Uffd, UffdEvent, Userfaults};

use super::hist::{median, sample_quantile, Hist};
use super::host_pageout::SwapFile;
use super::limits::seqwrite_chunk;
use super::report::Table;
use super::runner::CHUNK_BYTES;
use super::{interrupt, Ctx, Mode};
use guestmem::addr::Hva;
use guestmem::addr::RegionOffset;
use swap::index::StoreKey;

const PAGE: u64 = 4096;
/// Pages per batch in the write comparison.
const BATCH_PAGES: usize = 64;
/// Slots of the 4 KiB file store the reads and writes use (16 MiB).
const STORE_SLOTS: usize = 4096;
/// The host kernel's swap-in through KVM, from issue 33 (key-value
/// workload, memory cgroup with a host swap file; not measured here).
const KERNEL_KVM_US_FROM_ISSUE_33: f64 = 117.0;

/// Sizes of one invocation.
struct Plan {
    name: &'static str,
    rounds: usize,
    /// Length of the measured window of a VM run, s.
    window_s: f64,
    /// Time between two samples of the window, ms.
    sample_ms: u64,
    /// Longest warm-up before the window starts anyway, s.
    warmup_cap_s: f64,
    /// Faults (or operations) per in-process variant per round.
    ops: usize,
    /// Batches of 64 pages per write variant per round.
    write_batches: usize,
    /// randwrite: `--mem`, `--mem-limit`, working set.
    rand: (&'static str, &'static str, &'static str),
    /// The zero-fault run: `--mem`, bytes written.
    zero: (&'static str, &'static str),
}

impl Plan {
    fn of(mode: Mode) -> Plan {
        if std::env::var("HUGEVMM_BENCH_FAULT_4K_PLAN").as_deref() == Ok("tiny") {
            return Plan::tiny();
        }
        match mode {
            Mode::Quick => Plan::quick(),
            Mode::Full => Plan::full(),
        }
    }

    /// The plan a results file names (its tables' notes quote its sizes).
    fn named(name: &str) -> Option<Plan> {
        match name {
            "tiny" => Some(Plan::tiny()),
            "quick" => Some(Plan::quick()),
            "full" => Some(Plan::full()),
            _ => None,
        }
    }

    fn tiny() -> Plan {
        Plan {
            name: "tiny",
            rounds: 1,
            window_s: 1.0,
            sample_ms: 200,
            warmup_cap_s: 30.0,
            ops: 64,
            write_batches: 2,
            rand: ("128M", "24M", "64M"),
            zero: ("256M", "192M"),
        }
    }

    fn quick() -> Plan {
        Plan {
            name: "quick",
            rounds: 3,
            window_s: 3.0,
            sample_ms: 250,
            warmup_cap_s: 45.0,
            ops: 400,
            write_batches: 4,
            rand: ("256M", "24M", "96M"),
            zero: ("1G", "896M"),
        }
    }

    fn full() -> Plan {
        Plan {
            name: "full",
            rounds: 5,
            window_s: 8.0,
            sample_ms: 250,
            warmup_cap_s: 60.0,
            ops: 2000,
            write_batches: 12,
            rand: ("256M", "24M", "96M"),
            zero: ("2G", "1900M"),
        }
    }
}

// ---------------------------------------------------------------------
// Samples and their statistics
// ---------------------------------------------------------------------

/// Samples of one part (µs, unless a per-fault count), with the round
/// each came from.
#[derive(Default, Clone)]
struct Samples {
    values: Vec<f64>,
    rounds: Vec<usize>,
}

impl Samples {
    fn push(&mut self, round: usize, value: f64) {
        self.values.push(value);
        self.rounds.push(round);
    }

    fn median(&self) -> f64 {
        median(&self.values).unwrap_or(0.0)
    }

    fn p99(&self) -> f64 {
        sample_quantile(&self.values, 0.99)
    }

    /// Min and max of the per-round medians.
    fn spread(&self) -> (f64, f64) {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        let last = self.rounds.iter().copied().max().unwrap_or(0);
        for r in 0..=last {
            let v: Vec<f64> = self
                .values
                .iter()
                .zip(&self.rounds)
                .filter(|(_, &round)| round == r)
                .map(|(v, _)| *v)
                .collect();
            if let Some(m) = median(&v) {
                lo = lo.min(m);
                hi = hi.max(m);
            }
        }
        if lo.is_finite() {
            (lo, hi)
        } else {
            (0.0, 0.0)
        }
    }
}

/// The 1-minute load average.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn us_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall time and the calling thread's CPU time of one operation: a store
/// read that waits for the disk and one that spins look alike by wall time
/// alone.
#[derive(Default, Clone)]
struct Timed {
    wall: Samples,
    cpu: Samples,
}

impl Timed {
    /// Times `op`, dividing both figures by `per` (pages per operation).
    fn time<T>(&mut self, round: usize, per: usize, op: impl FnOnce() -> T) -> T {
        let (t, cpu) = (Instant::now(), thread_cpu_ns());
        let out = op();
        let cpu_us = (thread_cpu_ns() - cpu) as f64 / 1e3;
        self.wall.push(round, us_since(t) / per as f64);
        self.cpu.push(round, cpu_us / per as f64);
        out
    }
}

/// Mean of an engine histogram, µs: bucket midpoints (buckets are at most
/// 12.5 % wide), the last one capped at the maximum.
fn hist_mean_us(h: &Hist) -> f64 {
    let n = h.count();
    if n == 0 {
        return 0.0;
    }
    let sum: f64 = h
        .buckets
        .iter()
        .map(|&(lo, hi, c)| ((lo + hi) as f64 / 2.0).min(h.max_us as f64) * c as f64)
        .sum();
    sum / n as f64
}

/// A deterministic permutation of `0..n` (xorshift, Fisher-Yates).
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// `(voluntary, involuntary)` context switches of the calling thread so
/// far.
fn thread_usage() -> (i64, i64) {
    // SAFETY: rusage is plain data; getrusage fills it and cannot fail for
    // RUSAGE_THREAD with a valid pointer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (ru.ru_nvcsw, ru.ru_nivcsw)
}

// ---------------------------------------------------------------------
// In the VM: randwrite and zero faults under --swap-unit 4k
// ---------------------------------------------------------------------

/// One VM variant.
struct VmVariant {
    key: &'static str,
    label: &'static str,
    /// The no-limit seqwrite whose every fault is a zero fault.
    zero: bool,
    vcpus: u32,
    store: &'static str,
    fault_threads: u32,
}

const VM_VARIANTS: [VmVariant; 5] = [
    VmVariant {
        key: "file-1v",
        label: "randwrite 4k, file store, 1 vCPU",
        zero: false,
        vcpus: 1,
        store: "default",
        fault_threads: 1,
    },
    VmVariant {
        key: "file-2v",
        label: "randwrite 4k, file store, 2 vCPUs, 1 fault thread",
        zero: false,
        vcpus: 2,
        store: "default",
        fault_threads: 1,
    },
    VmVariant {
        key: "file-2v-2t",
        label: "randwrite 4k, file store, 2 vCPUs, 2 fault threads",
        zero: false,
        vcpus: 2,
        store: "default",
        fault_threads: 2,
    },
    VmVariant {
        key: "lz4-1v",
        label: "randwrite 4k, mem:lz4 store, 1 vCPU",
        zero: false,
        vcpus: 1,
        store: "mem:lz4",
        fault_threads: 1,
    },
    VmVariant {
        key: "zero-1v",
        label: "seqwrite 4k, no limit (zero faults only), 1 vCPU",
        zero: true,
        vcpus: 1,
        store: "mem:lz4",
        fault_threads: 1,
    },
];

impl VmVariant {
    fn args(&self, plan: &Plan) -> Vec<String> {
        let (payload, payload_args, mem, limit) = if self.zero {
            (
                "seqwrite",
                format!("bytes={}", plan.zero.1),
                plan.zero.0,
                "none",
            )
        } else {
            (
                "randwrite",
                format!("bytes={} passes=1", plan.rand.2),
                plan.rand.0,
                plan.rand.1,
            )
        };
        [
            "run",
            "--payload",
            payload,
            "--payload-args",
            &payload_args,
            "--vcpus",
            &self.vcpus.to_string(),
            "--mem",
            mem,
            "--mem-limit",
            limit,
            "--swap-store",
            self.store,
            "--swap-unit",
            "4k",
            "--fault-threads",
            &self.fault_threads.to_string(),
            "--quiet",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn command_line(&self, plan: &Plan) -> String {
        let args = self.args(plan);
        let mut s = String::from("hugevmm");
        for a in &args {
            if a.contains(' ') {
                s += &format!(" \"{a}\"");
            } else {
                s += &format!(" {a}");
            }
        }
        s
    }
}

/// What one group of the run's threads used so far.
#[derive(Default, Clone, Copy, Debug)]
struct ThreadUse {
    /// On-CPU time (`/proc/PID/task/TID/schedstat`, field 1), ns.
    on_cpu_ns: u64,
    /// Time runnable but waiting for a CPU (schedstat, field 2), ns.
    runq_ns: u64,
    /// `voluntary_ctxt_switches` (`status`).
    vcsw: u64,
    /// `nonvoluntary_ctxt_switches` (`status`).
    ivcsw: u64,
}

/// The thread group of a `hugevmm run`'s thread, by its name: vCPUs,
/// fault threads, the evictor, the others.
fn group_of(comm: &str) -> usize {
    if comm.starts_with("vcpu") {
        0
    } else if comm.starts_with("swap-fault") {
        1
    } else if comm.starts_with("swap-evictor") {
        2
    } else {
        3
    }
}

/// The process's CPU time and its threads' use, at one moment.
#[derive(Default, Clone, Debug)]
struct ProcUse {
    /// utime and stime of `/proc/PID/stat` (all threads, exited ones too),
    /// clock ticks.
    user_ticks: u64,
    sys_ticks: u64,
    groups: [ThreadUse; 4],
}

fn read_proc_use(pid: u32) -> Option<ProcUse> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is the
    // first, utime the 12th, stime the 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut u = ProcUse {
        user_ticks: fields.get(11)?.parse().ok()?,
        sys_ticks: fields.get(12)?.parse().ok()?,
        ..ProcUse::default()
    };
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let dir = entry.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let g = &mut u.groups[group_of(comm.trim())];
        if let Ok(s) = std::fs::read_to_string(dir.join("schedstat")) {
            let mut it = s.split_whitespace().map(|w| w.parse::<u64>().unwrap_or(0));
            g.on_cpu_ns += it.next().unwrap_or(0);
            g.runq_ns += it.next().unwrap_or(0);
        }
        if let Ok(s) = std::fs::read_to_string(dir.join("status")) {
            for line in s.lines() {
                let value = |l: &str| l.split_whitespace().nth(1).and_then(|v| v.parse().ok());
                if line.starts_with("voluntary_ctxt_switches:") {
                    g.vcsw += value(line).unwrap_or(0);
                } else if line.starts_with("nonvoluntary_ctxt_switches:") {
                    g.ivcsw += value(line).unwrap_or(0);
                }
            }
        }
    }
    Some(u)
}

/// One sample of a running VM: its `/stats` and its threads.
#[derive(Clone, Debug)]
struct VmSample {
    /// The VM's `elapsed_s` at the answer.
    t_s: f64,
    stats: Value,
    proc_use: ProcUse,
}

impl VmSample {
    fn swap(&self, path: &str) -> f64 {
        super::runner::num(&self.stats, &format!("/swap/{path}"))
    }

    /// Faults served: store + staging + zero.
    fn served(&self) -> f64 {
        self.swap("faults/store") + self.swap("faults/staging") + self.swap("faults/zero")
    }
}

/// One request to the run's API socket; the JSON body of a 2xx answer.
fn api(socket: &Path, method: &str, path: &str, body: &str) -> Result<Value> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("cannot connect to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if !body.is_empty() {
        req += &format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
    }
    req += "\r\n";
    req += body;
    s.write_all(req.as_bytes())?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("the API's answer has no head")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("the API's answer has no status")?;
    if !(200..300).contains(&status) {
        bail!("{method} {path}: HTTP {status}: {body}");
    }
    serde_json::from_str(body).with_context(|| format!("{method} {path}: not JSON: {body}"))
}

/// A `hugevmm run` of the bench's, ended (killed) on drop if still running.
struct RunningVm {
    child: Child,
    socket: PathBuf,
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl RunningVm {
    fn sample(&self) -> Result<VmSample> {
        let stats = api(&self.socket, "GET", "/stats", "")?;
        let proc_use = read_proc_use(self.child.id()).context("the run's /proc entry is gone")?;
        Ok(VmSample {
            t_s: super::runner::num(&stats, "/elapsed_s"),
            stats,
            proc_use,
        })
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

/// One VM run: its window samples and its final statistics.
struct VmRun {
    variant: usize,
    round: usize,
    /// Whether the warm-up ended by the rule (else by its cap).
    steady: bool,
    /// The first answer of the API (the boot is over).
    first: VmSample,
    samples: Vec<VmSample>,
    stats: Value,
    raw_stats: String,
}

impl VmRun {
    /// From the first API answer to the end of the run, per fault served
    /// (store, staging, zero): the guest's time per vCPU and the engine's
    /// mean service time, µs. Both cover the same faults (but the boot's
    /// few), so their difference is what the service leaves out.
    fn whole_run(&self, vcpus: u32) -> Option<(f64, f64)> {
        let end = |path: &str| super::runner::num(&self.stats, &format!("/swap/{path}"));
        let served = end("faults/store") + end("faults/staging") + end("faults/zero");
        let faults = served - self.first.served();
        let span_s = super::runner::num(&self.stats, "/elapsed_s") - self.first.t_s;
        let (mut sum_us, mut count) = (0.0, 0u64);
        for source in ["store", "staging", "zero"] {
            let h = Hist::from_json(&self.stats["swap"]["fault_latency_by_source_us"][source]);
            sum_us += hist_mean_us(&h) * h.count() as f64;
            count += h.count();
        }
        (faults > 0.0 && count > 0)
            .then(|| (span_s * 1e6 * vcpus as f64 / faults, sum_us / count as f64))
    }
}

/// Figures of a run's window (first to last sample).
#[derive(Default, Clone, Debug)]
struct Window {
    wall_s: f64,
    served: f64,
    store: f64,
    staging: f64,
    zero: f64,
    /// Wall time per fault of each sample interval, µs.
    interval_us: Vec<f64>,
    /// Per fault: (metric, value).
    per_fault: Vec<(&'static str, f64)>,
}

fn window(run: &VmRun, vcpus: u32) -> Option<Window> {
    let (first, last) = (run.samples.first()?, run.samples.last()?);
    let served = last.served() - first.served();
    if served <= 0.0 {
        return None;
    }
    let mut w = Window {
        wall_s: last.t_s - first.t_s,
        served,
        store: last.swap("faults/store") - first.swap("faults/store"),
        staging: last.swap("faults/staging") - first.swap("faults/staging"),
        zero: last.swap("faults/zero") - first.swap("faults/zero"),
        ..Window::default()
    };
    for pair in run.samples.windows(2) {
        let faults = pair[1].served() - pair[0].served();
        if faults > 0.0 {
            w.interval_us
                .push((pair[1].t_s - pair[0].t_s) * 1e6 / faults);
        }
    }
    // SAFETY: sysconf has no preconditions.
    let tick_us = 1e6 / (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64);
    let (a, b) = (&first.proc_use, &last.proc_use);
    let per = |v: f64| v / served;
    let d = |f: &dyn Fn(&ThreadUse) -> u64, g: usize| {
        f(&b.groups[g]).saturating_sub(f(&a.groups[g])) as f64
    };
    let on_cpu = |t: &ThreadUse| t.on_cpu_ns;
    let runq = |t: &ThreadUse| t.runq_ns;
    let vcsw = |t: &ThreadUse| t.vcsw;
    let ivcsw = |t: &ThreadUse| t.ivcsw;
    let user_us = b.user_ticks.saturating_sub(a.user_ticks) as f64 * tick_us;
    let sys_us = b.sys_ticks.saturating_sub(a.sys_ticks) as f64 * tick_us;
    let all = |f: &dyn Fn(&ThreadUse) -> u64| (0..4).map(|g| d(f, g)).sum::<f64>();
    let sw = |path: &str| last.swap(path) - first.swap(path);
    w.per_fault = vec![
        ("guest_wall_us", w.wall_s * 1e6 / served),
        ("guest_per_vcpu_us", w.wall_s * 1e6 * vcpus as f64 / served),
        ("cpu_us", per(user_us + sys_us)),
        ("user_us", per(user_us)),
        ("sys_us", per(sys_us)),
        ("on_cpu_vcpu_us", per(d(&on_cpu, 0) / 1e3)),
        ("on_cpu_fault_us", per(d(&on_cpu, 1) / 1e3)),
        ("on_cpu_evictor_us", per(d(&on_cpu, 2) / 1e3)),
        ("on_cpu_other_us", per(d(&on_cpu, 3) / 1e3)),
        ("runq_vcpu_us", per(d(&runq, 0) / 1e3)),
        ("runq_fault_us", per(d(&runq, 1) / 1e3)),
        ("runq_evictor_us", per(d(&runq, 2) / 1e3)),
        ("vcsw", per(all(&vcsw))),
        ("ivcsw", per(all(&ivcsw))),
        ("vcsw_vcpu", per(d(&vcsw, 0))),
        ("vcsw_fault", per(d(&vcsw, 1))),
        ("evictions", per(sw("evictions"))),
        ("evict_waits", per(sw("evict_waits"))),
        ("units_written", per(sw("units_written"))),
        ("store_share", w.store / served),
        ("staging_share", w.staging / served),
        ("zero_share", w.zero / served),
    ];
    Some(w)
}

/// Runs one VM variant once: start, warm up, sample the window, quit.
fn run_vm(ctx: &mut Ctx, plan: &Plan, v: &VmVariant, round: usize) -> Result<VmRun> {
    let name = format!("fault4k-{}-r{round}", v.key);
    let stats_path = ctx.raw_path(&format!("{name}.json"));
    let socket =
        std::env::temp_dir().join(format!("hugevmm-bench-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&stats_path);
    let _ = std::fs::remove_file(&socket);
    if ctx.prime {
        let mem = if v.zero { plan.zero.0 } else { plan.rand.0 };
        crate::prime::prime(guestmem::parse_size(mem).unwrap_or(0));
    }
    let log_path = ctx.raw_path(&format!("{name}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let mut args = v.args(plan);
    let guard_s = plan.warmup_cap_s + plan.window_s + 120.0;
    args.extend([
        "--stats-json".to_string(),
        stats_path.display().to_string(),
        "--api-socket".to_string(),
        socket.display().to_string(),
        "--timeout".to_string(),
        format!("{guard_s}"),
    ]);
    let child = Command::new(&ctx.hugevmm)
        .args(&args)
        // The default store is an unlinked file in $TMPDIR.
        .env("TMPDIR", &ctx.store_dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {}", ctx.hugevmm.display()))?;
    let mut vm = RunningVm { child, socket };
    let log_tail = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(6)..].join("\n    ")
    };

    // The socket appears once the VM is built.
    let started = Instant::now();
    let first = loop {
        interrupt::check()?;
        if let Some(status) = vm.exited() {
            bail!(
                "`{}` ended ({status}) before its API answered:\n    {}",
                v.command_line(plan),
                log_tail(&log_path)
            );
        }
        if let Ok(s) = vm.sample() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("`{}`: no API answer after 60 s", v.command_line(plan));
        }
        std::thread::sleep(Duration::from_millis(50));
    };

    // Warm-up: randwrite until nearly every page was written once (zero
    // faults under 5 % of the faults between two samples 200 ms apart, for
    // two samples in a row: randwrite's random touches leave a tail of
    // untouched pages); the zero run until its first thousand faults (the
    // boot is over).
    let mut last = first.clone();
    let mut steady = false;
    let mut quiet_polls = 0;
    while started.elapsed().as_secs_f64() < plan.warmup_cap_s {
        interrupt::check()?;
        std::thread::sleep(Duration::from_millis(200));
        let s = vm.sample().context("the VM ended during its warm-up")?;
        let zero = s.swap("faults/zero") - last.swap("faults/zero");
        let served = s.served() - last.served();
        let done = if v.zero {
            s.swap("faults/zero") > 1000.0
        } else {
            quiet_polls = if served > 0.0 && zero < 0.05 * served {
                quiet_polls + 1
            } else {
                0
            };
            quiet_polls >= 2
        };
        last = s;
        if done {
            steady = true;
            break;
        }
    }

    let mut samples = vec![last.clone()];
    let window_start = Instant::now();
    let mut next = window_start;
    while window_start.elapsed().as_secs_f64() < plan.window_s {
        interrupt::check()?;
        next += Duration::from_millis(plan.sample_ms);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        match vm.sample() {
            Ok(s) => samples.push(s),
            // The payload finished (the zero run may): the window ends.
            Err(_) => break,
        }
    }

    if vm.exited().is_none() {
        api(&vm.socket, "PUT", "/actions", r#"{"action":"quit"}"#).context("PUT /actions quit")?;
    }
    let quit_at = Instant::now();
    let status = loop {
        if let Some(status) = vm.exited() {
            break status;
        }
        if quit_at.elapsed() > Duration::from_secs(60) {
            bail!("`{}` did not end within 60 s of quit", v.command_line(plan));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !status.success() {
        bail!(
            "`{}` failed ({status}):\n    {}",
            v.command_line(plan),
            log_tail(&log_path)
        );
    }
    let text = std::fs::read_to_string(&stats_path)
        .with_context(|| format!("run {name} wrote no stats at {}", stats_path.display()))?;
    let stats: Value = serde_json::from_str(&text)
        .with_context(|| format!("cannot parse {}", stats_path.display()))?;
    Ok(VmRun {
        variant: VM_VARIANTS.iter().position(|x| x.key == v.key).unwrap_or(0),
        round,
        steady,
        first,
        samples,
        stats,
        raw_stats: format!("runs/{name}.json"),
    })
}

// ---------------------------------------------------------------------
// In this process: the userfault round trip and the service's parts
// ---------------------------------------------------------------------

/// How the serving thread installs a page.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Install {
    Zero,
    Copy,
    Move,
}

impl Install {
    fn name(self) -> &'static str {
        match self {
            Install::Zero => "zeropage",
            Install::Copy => "copy",
            Install::Move => "move",
        }
    }
}

/// The round trip's samples for one way of installing.
#[derive(Default, Clone)]
struct RoundTrip {
    /// From the write to the write returning.
    total: Samples,
    /// From the write to the server's poll returning.
    notify: Samples,
    /// read(2) of the message.
    read: Samples,
    /// The install ioctl (not waking).
    install: Samples,
    /// UFFDIO_WAKE with the writer waiting.
    wake: Samples,
    /// From the wake's return to the write's return (negative when the
    /// writer ran on before the wake returned).
    resume: Samples,
    /// Context switches per fault: writer voluntary, writer involuntary,
    /// server voluntary, server involuntary.
    switches: [Samples; 4],
    /// CPU time per fault, µs: writer, server.
    cpu: [Samples; 2],
}

/// A region registered MISSING with a userfaultfd of its own, small pages.
struct Registered {
    uffd: Uffd,
    map: AnonMapping,
}

impl Registered {
    fn new(pages: usize) -> Result<Registered> {
        let uffd = Uffd::open(0).context("cannot open a userfaultfd")?;
        if !uffd.has_move() {
            bail!("this kernel's userfaultfd lacks UFFDIO_MOVE");
        }
        let map = AnonMapping::new(pages as u64 * PAGE).context("cannot map a region")?;
        let r = map.range();
        r.advise_nohugepage(RegionOffset::ZERO, r.len())
            .context("madvise(MADV_NOHUGEPAGE)")?;
        // SAFETY: the mapping is this measurement's own and only reached
        // through raw addresses; its missing pages are touched only by the
        // round trip's writer while a server thread serves this userfaultfd.
        unsafe { uffd.register(Hva::new(r.base()), r.len(), mode::MISSING) }
            .context("cannot register the region with the userfaultfd")?;
        Ok(Registered { uffd, map })
    }

    fn range(&self) -> &RawRange {
        self.map.range()
    }
}

/// An unregistered small-page buffer (sources of copies and moves).
fn small_buffer(pages: usize) -> Result<AnonMapping> {
    let map = AnonMapping::new(pages as u64 * PAGE).context("cannot map a buffer")?;
    map.range()
        .advise_nohugepage(RegionOffset::ZERO, map.range().len())
        .context("madvise(MADV_NOHUGEPAGE)")?;
    Ok(map)
}

/// One page of seqwrite's pattern into `dst` at `offset` (populated).
fn fill_page(dst: &RawRange, offset: u64, pattern: &[u8]) {
    // SAFETY: `dst` is an unregistered buffer of the caller's, nothing else
    // uses the page during the copy.
    let page = unsafe { dst.slice_mut(RegionOffset::new(offset), PAGE) };
    page.copy_from_slice(&pattern[..PAGE as usize]);
}

/// One round of `n` round trips: this thread writes to each missing page
/// of `reg` in turn, a second thread serves them with `how`.
fn round_trips(
    reg: &Registered,
    src: &RawRange,
    data_addr: u64,
    how: Install,
    n: usize,
    round: usize,
    out: &mut RoundTrip,
) -> Result<()> {
    let r = reg.range();
    assert!(n as u64 * PAGE <= r.len() && n as u64 * PAGE <= src.len());
    r.discard(RegionOffset::ZERO, r.len())?;
    if how == Install::Move {
        src.touch(RegionOffset::ZERO, n as u64 * PAGE);
    }
    let base = Instant::now();
    let ns = move || base.elapsed().as_nanos() as u64;
    let uffd = &reg.uffd;
    let (writer, served) = std::thread::scope(|scope| {
        let server = scope.spawn(move || {
            let before = (thread_usage(), thread_cpu_ns());
            let mut records: Vec<[u64; 4]> = Vec::with_capacity(n);
            let mut events = Vec::with_capacity(8);
            let mut error: Option<String> = None;
            while records.len() < n {
                match uffd.poll_readable(100) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        error.get_or_insert(format!("poll: {e}"));
                        break;
                    }
                }
                let t_poll = ns();
                events.clear();
                if let Err(e) = uffd.read_events(&mut events, 8) {
                    error.get_or_insert(format!("read: {e}"));
                    break;
                }
                let t_read = ns();
                for event in events.drain(..) {
                    let UffdEvent::PageFault { address, .. } = event else {
                        continue;
                    };
                    let page = address & !(PAGE - 1);
                    let i = (page - r.base()) / PAGE;
                    let done = match how {
                        Install::Zero => uffd.zeropage(Hva::new(page), PAGE, true),
                        Install::Copy => uffd.copy(
                            Hva::new(page),
                            Hva::new(data_addr),
                            PAGE,
                            CopyOptions {
                                write_protect: false,
                                dont_wake: true,
                            },
                        ),
                        // SAFETY: the source page is this round's own,
                        // populated above and moved once; the destination
                        // is the missing page the writer waits on.
                        Install::Move => unsafe {
                            uffd.move_pages(
                                Hva::new(page),
                                Hva::new(src.base() + i * PAGE),
                                PAGE,
                                MoveOptions {
                                    allow_src_holes: false,
                                    dont_wake: true,
                                },
                            )
                        },
                    };
                    if let Err(e) = done {
                        error.get_or_insert(format!("{}: {e}", how.name()));
                        // The writer must not wait for ever.
                        let _ = uffd.zeropage(Hva::new(page), PAGE, true);
                    }
                    let t_install = ns();
                    if let Err(e) = uffd.wake(Hva::new(page), PAGE) {
                        error.get_or_insert(format!("wake: {e}"));
                    }
                    records.push([t_poll, t_read, t_install, ns()]);
                }
            }
            if error.is_some() {
                // Unregistering wakes a writer still waiting and lets its
                // next writes fault as plain memory.
                let _ = uffd.unregister(Hva::new(r.base()), r.len());
            }
            let after = (thread_usage(), thread_cpu_ns());
            (records, error, before, after)
        });
        let before = (thread_usage(), thread_cpu_ns());
        let mut times = Vec::with_capacity(n);
        for i in 0..n {
            let t0 = ns();
            // SAFETY: a write into this measurement's own registered
            // region; the server thread resolves the fault it raises.
            unsafe { std::ptr::write_volatile((r.base() + i as u64 * PAGE) as *mut u8, 1) };
            times.push((t0, ns()));
        }
        let after = (thread_usage(), thread_cpu_ns());
        let served = server.join();
        ((times, before, after), served)
    });
    let (records, error, s_before, s_after) =
        served.map_err(|_| anyhow::anyhow!("the serving thread panicked"))?;
    if let Some(e) = error {
        bail!("userfault round trip ({}): {e}", how.name());
    }
    let (times, w_before, w_after) = writer;
    let us = |a: u64, b: u64| (b as f64 - a as f64) / 1e3;
    for ((t0, t1), [poll, read, install, wake]) in times.iter().zip(&records) {
        out.total.push(round, us(*t0, *t1));
        out.notify.push(round, us(*t0, *poll));
        out.read.push(round, us(*poll, *read));
        out.install.push(round, us(*read, *install));
        out.wake.push(round, us(*install, *wake));
        out.resume.push(round, us(*wake, *t1));
    }
    let per = |a: i64, b: i64| (b - a) as f64 / n as f64;
    out.switches[0].push(round, per(w_before.0 .0, w_after.0 .0));
    out.switches[1].push(round, per(w_before.0 .1, w_after.0 .1));
    out.switches[2].push(round, per(s_before.0 .0, s_after.0 .0));
    out.switches[3].push(round, per(s_before.0 .1, s_after.0 .1));
    let cpu_us = |a: u64, b: u64| (b - a) as f64 / 1e3 / n as f64;
    out.cpu[0].push(round, cpu_us(w_before.1, w_after.1));
    out.cpu[1].push(round, cpu_us(s_before.1, s_after.1));
    r.discard(RegionOffset::ZERO, r.len())?;
    src.discard(RegionOffset::ZERO, src.len())?;
    Ok(())
}

/// The install and eviction ioctls of one page, nobody waiting.
#[derive(Default, Clone)]
struct Ioctls {
    copy: Samples,
    moved: Samples,
    refill: Samples,
    zeropage: Samples,
    wake: Samples,
    move_out: Samples,
}

/// One round of `n` of each: the registered region holds four areas of
/// `n` pages (copied into, zero-filled, moved into, parking).
fn ioctl_round(
    reg: &Registered,
    src: &RawRange,
    data_addr: u64,
    n: usize,
    round: usize,
    out: &mut Ioctls,
) -> Result<()> {
    let r = reg.range();
    let u = &reg.uffd;
    let at = |area: u64, i: usize| r.base() + (area * n as u64 + i as u64) * PAGE;
    r.discard(RegionOffset::ZERO, r.len())?;
    let no_wake = CopyOptions {
        write_protect: false,
        dont_wake: true,
    };
    for i in 0..n {
        let t = Instant::now();
        u.copy(Hva::new(at(0, i)), Hva::new(data_addr), PAGE, no_wake)
            .context("UFFDIO_COPY")?;
        out.copy.push(round, us_since(t));

        let t = Instant::now();
        u.zeropage(Hva::new(at(1, i)), PAGE, true)
            .context("UFFDIO_ZEROPAGE")?;
        out.zeropage.push(round, us_since(t));

        let t = Instant::now();
        u.wake(Hva::new(at(0, i)), PAGE).context("UFFDIO_WAKE")?;
        out.wake.push(round, us_since(t));

        // A moved-in page leaves a hole in its buffer: the next read needs
        // a fresh page there, which a touch (allocate and clear) gives.
        let t = Instant::now();
        src.touch(RegionOffset::new(i as u64 * PAGE), PAGE);
        out.refill.push(round, us_since(t));

        let t = Instant::now();
        // SAFETY: the source page was populated just above and is moved
        // once; the destination is a missing page of the region.
        unsafe {
            u.move_pages(
                Hva::new(at(2, i)),
                Hva::new(src.base() + i as u64 * PAGE),
                PAGE,
                MoveOptions {
                    allow_src_holes: false,
                    dont_wake: true,
                },
            )
        }
        .context("UFFDIO_MOVE")?;
        out.moved.push(round, us_since(t));

        // The eviction takes a resident page away as the engine does: a
        // move into a parking page registered with the same userfaultfd.
        let t = Instant::now();
        // SAFETY: both pages are this measurement's; the source was
        // installed by the copy above and nobody touches it.
        unsafe {
            u.move_pages(
                Hva::new(at(3, i)),
                Hva::new(at(0, i)),
                PAGE,
                MoveOptions {
                    allow_src_holes: true,
                    dont_wake: false,
                },
            )
        }
        .context("UFFDIO_MOVE (move-out)")?;
        out.move_out.push(round, us_since(t));
    }
    r.discard(RegionOffset::ZERO, r.len())?;
    src.discard(RegionOffset::ZERO, src.len())?;
    Ok(())
}

/// Store reads and writes of 4 KiB pages.
#[derive(Default, Clone)]
struct StoreParts {
    read_file: Timed,
    read_lz4: Timed,
    write_one: Timed,
    write_64_separate: Timed,
    write_64_one: Timed,
}

/// The stores of the store parts, written full once.
struct Stores {
    file4k: FileStore,
    slots4k: Vec<SlotId>,
    lz4: MemStore,
    lz4_slots: Vec<SlotId>,
    file256k: FileStore,
    slots256k: Vec<SlotId>,
    pattern: blockio::AlignedBuf,
}

fn fill_store(store: &dyn Store, slots: usize, unit: usize, pattern: &[u8]) -> Result<Vec<SlotId>> {
    let mut out = Vec::with_capacity(slots);
    let per_chunk = CHUNK_BYTES as usize / unit;
    for batch in (0..slots).collect::<Vec<_>>().chunks(BATCH_PAGES) {
        let reqs: Vec<WriteRequest<'_>> = batch
            .iter()
            .map(|&i| {
                let off = (i % per_chunk) * unit;
                WriteRequest {
                    gpa: StoreKey::new((1 << 32) + (i * unit) as u64),
                    data: &pattern[off..off + unit],
                }
            })
            .collect();
        for r in store.write_batch(&reqs) {
            out.push(r.context("writing the store's slots")?);
        }
    }
    Ok(out)
}

impl Stores {
    fn open(dir: &Path) -> Result<Stores> {
        let pattern = seqwrite_chunk(1 << 32, 0x2545_f491_4f6c_dd1d);
        let file4k = FileStore::temporary(dir, PAGE as usize, STORE_SLOTS as u64 * PAGE)
            .context("cannot open a 4 KiB file store in --store-dir")?;
        let slots4k = fill_store(&file4k, STORE_SLOTS, PAGE as usize, &pattern)?;
        let lz4 = MemStore::new(Codec::Lz4, PAGE as usize, STORE_SLOTS as u64, None)?;
        let lz4_slots = fill_store(&lz4, STORE_SLOTS, PAGE as usize, &pattern)?;
        let big = BATCH_PAGES * PAGE as usize;
        let big_slots = STORE_SLOTS / BATCH_PAGES;
        let file256k = FileStore::temporary(dir, big, (big * big_slots) as u64)
            .context("cannot open a 256 KiB file store in --store-dir")?;
        let slots256k = fill_store(&file256k, big_slots, big, &pattern)?;
        Ok(Stores {
            file4k,
            slots4k,
            lz4,
            lz4_slots,
            file256k,
            slots256k,
            pattern,
        })
    }
}

fn store_round(s: &mut Stores, plan: &Plan, round: usize, out: &mut StoreParts) -> Result<()> {
    let mut buf = blockio::AlignedBuf::new(PAGE as usize, 4096);
    let order = permutation(STORE_SLOTS, round as u64 + 7);
    for &i in order.iter().take(plan.ops) {
        out.read_file
            .time(round, 1, || {
                s.file4k
                    .read(s.slots4k[i], StoreKey::new(1 << 32), &mut buf)
            })
            .context("4 KiB file store read")?;
        out.read_lz4
            .time(round, 1, || {
                s.lz4.read(s.lz4_slots[i], StoreKey::new(1 << 32), &mut buf)
            })
            .context("4 KiB mem:lz4 read")?;
    }
    // Writes go where the store has room after long use: slots freed at
    // random (lowest free first is the allocator's rule, so a write takes
    // exactly the slots freed for it). The three ways alternate.
    let page = |k: usize| &s.pattern[(k % 512) * PAGE as usize..(k % 512 + 1) * PAGE as usize];
    for b in 0..plan.write_batches {
        let victims = permutation(STORE_SLOTS, (round * 1000 + b) as u64 + 11);
        for way in 0..3 {
            match (way + b) % 3 {
                0 => {
                    for (k, &v) in victims[..BATCH_PAGES].iter().enumerate() {
                        s.file4k.free(s.slots4k[v]);
                        let req = [WriteRequest {
                            gpa: StoreKey::new((1 << 32) + v as u64 * PAGE),
                            data: page(k),
                        }];
                        let r = out.write_one.time(round, 1, || s.file4k.write_batch(&req));
                        s.slots4k[v] = r
                            .into_iter()
                            .next()
                            .context("no write result")?
                            .context("4 KiB write")?;
                    }
                }
                1 => {
                    let picked = &victims[BATCH_PAGES..2 * BATCH_PAGES];
                    for &v in picked {
                        s.file4k.free(s.slots4k[v]);
                    }
                    let reqs: Vec<WriteRequest<'_>> = picked
                        .iter()
                        .enumerate()
                        .map(|(k, &v)| WriteRequest {
                            gpa: StoreKey::new((1 << 32) + v as u64 * PAGE),
                            data: page(k),
                        })
                        .collect();
                    let results = out
                        .write_64_separate
                        .time(round, BATCH_PAGES, || s.file4k.write_batch(&reqs));
                    for (&v, r) in picked.iter().zip(results) {
                        s.slots4k[v] = r.context("4 KiB batch write")?;
                    }
                }
                _ => {
                    let v = victims[0] % s.slots256k.len();
                    s.file256k.free(s.slots256k[v]);
                    let big = BATCH_PAGES * PAGE as usize;
                    let req = [WriteRequest {
                        gpa: StoreKey::new(1 << 32),
                        data: &s.pattern[..big],
                    }];
                    let r = out
                        .write_64_one
                        .time(round, BATCH_PAGES, || s.file256k.write_batch(&req));
                    s.slots256k[v] = r
                        .into_iter()
                        .next()
                        .context("no write result")?
                        .context("256 KiB write")?;
                }
            }
        }
    }
    Ok(())
}

/// The host kernel's own swap-in of one page, without KVM.
#[derive(Default, Clone)]
struct KernelSwapIn {
    touch: Samples,
    /// Per round: major faults per touch.
    majflt_per_touch: Samples,
    /// Per round: the touches' total time over the major faults, µs.
    per_major_fault: Samples,
}

/// The kernel probe's source (written for this bench): write MIB of
/// anonymous memory inside a memory cgroup smaller than that, so the
/// kernel swaps the rest out, then time TOUCHES writes to random pages
/// (with replacement, as randwrite picks its words).
const KERNEL_PROBE_C: &str = r#"/* hugevmm bench fault-4k kernel probe. Usage: probe MIB TOUCHES SEED */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

static double us_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s MIB TOUCHES SEED\n", argv[0]);
        return 2;
    }
    size_t len = (size_t)strtoull(argv[1], NULL, 10) << 20;
    size_t touches = (size_t)strtoull(argv[2], NULL, 10);
    uint64_t x = strtoull(argv[3], NULL, 10) * 0x9e3779b97f4a7c15ull | 1;
    size_t pages = len / 4096;
    uint64_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    double *t = malloc(touches * sizeof *t);
    if (mem == MAP_FAILED || !t || !pages) {
        perror("mmap");
        return 1;
    }
    madvise(mem, len, MADV_NOHUGEPAGE);
    /* seqwrite's pattern: every word its address XOR a key. */
    for (size_t i = 0; i < len / 8; i++)
        mem[i] = (uint64_t)(uintptr_t)&mem[i] ^ 0x2545f4914f6cdd1dull;
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    for (size_t k = 0; k < touches; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        volatile uint8_t *at = (volatile uint8_t *)mem + (x % pages) * 4096 + 8;
        double a = us_now();
        *at = (uint8_t)k;
        t[k] = us_now() - a;
    }
    getrusage(RUSAGE_SELF, &r1);
    printf("majflt=%ld\n", r1.ru_majflt - r0.ru_majflt);
    for (size_t k = 0; k < touches; k++)
        printf("%.3f\n", t[k]);
    return 0;
}
"#;

/// A memory cgroup of the bench's with a limit; removed on drop.
struct MemCgroup {
    dir: PathBuf,
}

impl MemCgroup {
    /// v2 where the memory controller is on it, else v1.
    fn create(limit_bytes: u64) -> Result<MemCgroup> {
        let name = format!("hugevmm-bench-f4k-{}", std::process::id());
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"));
        let (dir, limit_file) = if v2 {
            (Path::new("/sys/fs/cgroup").join(name), "memory.max")
        } else if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
            (
                Path::new("/sys/fs/cgroup/memory").join(name),
                "memory.limit_in_bytes",
            )
        } else {
            bail!("no memory cgroup controller (v1 or v2)");
        };
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create the cgroup {}", dir.display()))?;
        let cg = MemCgroup { dir };
        std::fs::write(cg.dir.join(limit_file), limit_bytes.to_string())
            .with_context(|| format!("cannot set {limit_file} of {}", cg.dir.display()))?;
        Ok(cg)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The probe has exited; its charges leave with it, which may take
        // the kernel a moment.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "hugevmm bench: WARNING: cannot remove the cgroup {}; rmdir it by hand",
            self.dir.display()
        );
    }
}

/// The compiled kernel probe in a temporary directory of its own.
struct KernelProbe {
    dir: PathBuf,
    exe: PathBuf,
}

impl Drop for KernelProbe {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl KernelProbe {
    fn build() -> Result<KernelProbe> {
        let dir =
            std::env::temp_dir().join(format!("hugevmm-bench-f4k-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let probe = KernelProbe {
            exe: dir.join("swapin_probe"),
            dir,
        };
        let src = probe.dir.join("swapin_probe.c");
        std::fs::write(&src, KERNEL_PROBE_C)
            .with_context(|| format!("cannot write {}", src.display()))?;
        let out = Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&probe.exe)
            .arg(&src)
            .output()
            .context("cannot run gcc")?;
        if !out.status.success() {
            bail!(
                "gcc failed on the swap-in probe:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(probe)
    }
}

/// One round: the probe writes the randwrite working set in a cgroup of
/// the VM runs' limit, then times random touches.
fn kernel_round(
    probe: &KernelProbe,
    plan: &Plan,
    round: usize,
    out: &mut KernelSwapIn,
) -> Result<()> {
    let limit = guestmem::parse_size(plan.rand.1).context("the plan's limit")?;
    let ws_mib = guestmem::parse_size(plan.rand.2).context("the plan's working set")? >> 20;
    let cg = MemCgroup::create(limit)?;
    let procs = cg.dir.join("cgroup.procs");
    let output = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1" && exec "$2" "$3" "$4" "$5""#)
        .arg("sh")
        .arg(&procs)
        .arg(&probe.exe)
        .arg(ws_mib.to_string())
        .arg(plan.ops.to_string())
        .arg((round + 1).to_string())
        .output()
        .context("cannot run the swap-in probe")?;
    drop(cg);
    if !output.status.success() {
        bail!(
            "the swap-in probe failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let majflt: f64 = lines
        .next()
        .and_then(|l| l.strip_prefix("majflt="))
        .and_then(|v| v.trim().parse().ok())
        .context("the swap-in probe printed no majflt= line")?;
    let (mut n, mut total_us) = (0, 0.0);
    for l in lines {
        if let Ok(us) = l.trim().parse::<f64>() {
            out.touch.push(round, us);
            n += 1;
            total_us += us;
        }
    }
    if n == 0 {
        bail!("the swap-in probe printed no times");
    }
    out.majflt_per_touch.push(round, majflt / n as f64);
    if majflt > 0.0 {
        out.per_major_fault.push(round, total_us / majflt);
    }
    Ok(())
}

// ---------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------

/// Everything the rounds measured.
#[derive(Default)]
struct Measured {
    rt: [RoundTrip; 3],
    ioctls: Ioctls,
    stores: StoreParts,
    kernel: KernelSwapIn,
    kernel_note: Option<String>,
    vm: Vec<VmRun>,
}

const INSTALLS: [Install; 3] = [Install::Zero, Install::Copy, Install::Move];

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = Plan::of(ctx.mode);
    // Other work on the machine takes cores from every part: say how busy
    // it was.
    let load_at_start = loadavg();
    let vms = ctx.kvm_unusable.is_none();
    let uffd_problem = Registered::new(1).err().map(|e| format!("{e:#}"));
    if let Some(why) = &uffd_problem {
        ctx.skip("fault-4k userfault parts", why);
    }
    ctx.progress
        .plan(1 + plan.rounds * (if vms { VM_VARIANTS.len() } else { 0 } + 3));

    ctx.progress
        .start("stores: fill 4 KiB file, mem:lz4 and 256 KiB file stores");
    let mut stores = match Stores::open(&ctx.store_dir) {
        Ok(s) => {
            ctx.progress.done(&format!("{STORE_SLOTS} slots each"));
            s
        }
        Err(e) => {
            ctx.progress.failed(&format!("{e:#}"));
            return Err(e);
        }
    };
    // The kernel swap-in needs a swap file of its own and a memory
    // cgroup (root), and gcc for its probe.
    let mut m = Measured::default();
    let kernel: Option<(SwapFile, KernelProbe)> = if !ctx.is_root {
        ctx.skip("fault-4k kernel swap-in", "needs root (swapon, cgroups)");
        None
    } else {
        let ws = guestmem::parse_size(plan.rand.2).unwrap_or(0);
        match SwapFile::create(&ctx.store_dir, 2 * ws + (16 << 20))
            .and_then(|swap| Ok((swap, KernelProbe::build()?)))
        {
            Ok(k) => {
                if super::host_pageout::zswap_enabled() {
                    m.kernel_note = Some("zswap is on: swap-outs compress into RAM".into());
                }
                Some(k)
            }
            Err(e) => {
                ctx.skip("fault-4k kernel swap-in", &format!("{e:#}"));
                None
            }
        }
    };

    for round in 0..plan.rounds {
        // In-process parts, rotating.
        for step in 0..3 {
            interrupt::check()?;
            match (step + round) % 3 {
                0 => {
                    ctx.progress.start(&format!(
                        "round {}/{}: userfault round trips (zeropage, copy, move) and the ioctls, in this process",
                        round + 1,
                        plan.rounds
                    ));
                    if uffd_problem.is_some() {
                        ctx.progress.done("skipped (no userfaultfd)");
                        continue;
                    }
                    match uffd_round(&plan, &stores.pattern, round, &mut m) {
                        Ok(()) => ctx.progress.done(&format!(
                            "round trip zeropage {:.1} us, copy {:.1} us, move {:.1} us",
                            m.rt[0].total.median(),
                            m.rt[1].total.median(),
                            m.rt[2].total.median()
                        )),
                        Err(e) => {
                            ctx.progress.failed(&format!("{e:#}"));
                            return Err(e);
                        }
                    }
                }
                1 => {
                    ctx.progress.start(&format!(
                        "round {}/{}: 4 KiB store reads and page writes",
                        round + 1,
                        plan.rounds
                    ));
                    match store_round(&mut stores, &plan, round, &mut m.stores) {
                        Ok(()) => ctx.progress.done(&format!(
                            "read file {:.1} us, lz4 {:.1} us; write 1 {:.1} us, 64 separate {:.1} us/page, 64 as one {:.1} us/page",
                            m.stores.read_file.wall.median(),
                            m.stores.read_lz4.wall.median(),
                            m.stores.write_one.wall.median(),
                            m.stores.write_64_separate.wall.median(),
                            m.stores.write_64_one.wall.median()
                        )),
                        Err(e) => {
                            ctx.progress.failed(&format!("{e:#}"));
                            return Err(e);
                        }
                    }
                }
                _ => {
                    ctx.progress.start(&format!(
                        "round {}/{}: the host kernel's swap-in of a page (a process writing {} in a {} memory cgroup, then random touches)",
                        round + 1,
                        plan.rounds,
                        plan.rand.2,
                        plan.rand.1
                    ));
                    let Some((_, probe)) = &kernel else {
                        ctx.progress.done("skipped");
                        continue;
                    };
                    match kernel_round(probe, &plan, round, &mut m.kernel) {
                        Ok(()) => ctx.progress.done(&format!(
                            "{:.1} us per touch, {:.2} major faults per touch",
                            m.kernel.touch.median(),
                            m.kernel.majflt_per_touch.median()
                        )),
                        Err(e) => {
                            ctx.progress.failed(&format!("{e:#}"));
                            m.kernel_note = Some(format!("{e:#}"));
                        }
                    }
                }
            }
        }
        if !vms {
            continue;
        }
        for k in 0..VM_VARIANTS.len() {
            interrupt::check()?;
            let v = &VM_VARIANTS[(k + round) % VM_VARIANTS.len()];
            ctx.progress
                .start(&format!("round {}/{}: {}", round + 1, plan.rounds, v.label));
            match run_vm(ctx, &plan, v, round) {
                Ok(r) => {
                    let figure = match window(&r, v.vcpus) {
                        Some(w) => {
                            let source = if v.zero { "zero" } else { "store" };
                            let h = Hist::from_json(
                                &r.stats["swap"]["fault_latency_by_source_us"][source],
                            );
                            format!(
                                "{:.0} faults in {:.1} s: {:.1} us wall per fault, {} service p50 {} us{}",
                                w.served,
                                w.wall_s,
                                w.wall_s * 1e6 / w.served,
                                source,
                                h.quantile_us(0.5),
                                if r.steady { "" } else { " (warm-up cap reached)" }
                            )
                        }
                        None => "no faults in the window".into(),
                    };
                    ctx.progress.done(&figure);
                    m.vm.push(r);
                }
                Err(e) => {
                    interrupt::check()?;
                    let msg = format!("{e:#}");
                    ctx.progress.failed(&msg);
                    ctx.report
                        .failures
                        .push(format!("fault-4k {}: {msg}", v.label));
                }
            }
        }
    }
    drop(kernel);

    let rows = rows(&m);
    let per_fault = per_fault(&m);
    let load = (load_at_start, loadavg());
    csv(ctx, &rows, &per_fault);
    let rt = &m.rt[1];
    let suite = json!({
        "plan": plan.name,
        "loadavg_at_start": load.0,
        "loadavg_at_end": load.1,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "rounds": plan.rounds,
        "bare_copy_per_fault": (!rt.switches[0].values.is_empty()).then(|| json!({
            "writer_voluntary_switches": rt.switches[0].median(),
            "writer_involuntary_switches": rt.switches[1].median(),
            "writer_cpu_us": rt.cpu[0].median(),
            "server_voluntary_switches": rt.switches[2].median(),
            "server_involuntary_switches": rt.switches[3].median(),
            "server_cpu_us": rt.cpu[1].median(),
        })),
        "kernel_major_faults_per_touch": (!m.kernel.touch.values.is_empty())
            .then(|| m.kernel.majflt_per_touch.median()),
        "rows": rows.iter().map(Row::json).collect::<Vec<Value>>(),
        "per_fault": per_fault.iter().map(|(key, metrics)| json!({
            "variant": key,
            "metrics": metrics.iter().map(|(name, s)| {
                let (lo, hi) = s.spread();
                (name.to_string(), json!({"median": s.median(), "min": lo, "max": hi, "rounds": s.values.len()}))
            }).collect::<serde_json::Map<String, Value>>(),
        })).collect::<Vec<Value>>(),
        "kernel_swap_in_through_kvm_us_from_issue_33": KERNEL_KVM_US_FROM_ISSUE_33,
        "kernel_note": m.kernel_note,
        "runs": m.vm.iter().map(|r| {
            let v = &VM_VARIANTS[r.variant];
            let w = window(r, v.vcpus).unwrap_or_default();
            json!({
                "variant": v.key,
                "round": r.round,
                "command": v.command_line(&plan),
                "steady": r.steady,
                "window_s": w.wall_s,
                "faults": {"served": w.served, "store": w.store, "staging": w.staging, "zero": w.zero},
                "interval_us_per_fault": w.interval_us,
                "per_fault": w.per_fault.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<String, Value>>(),
                "raw_stats": r.raw_stats,
            })
        }).collect::<Vec<Value>>(),
    });
    ctx.report.tables.extend(tables_from_json(&suite)?);
    ctx.report.set("fault_4k", suite);
    Ok(())
}

/// One round of the userfault parts: the three round trips and the
/// ioctls, in rotating order.
fn uffd_round(plan: &Plan, pattern: &[u8], round: usize, m: &mut Measured) -> Result<()> {
    let n = plan.ops;
    let reg = Registered::new(4 * n)?;
    let src = small_buffer(n)?;
    let data = small_buffer(1)?;
    fill_page(data.range(), 0, pattern);
    let data_addr = data.range().base();
    for k in 0..4 {
        match (k + round) % 4 {
            3 => ioctl_round(&reg, src.range(), data_addr, n, round, &mut m.ioctls)?,
            i => round_trips(
                &reg,
                src.range(),
                data_addr,
                INSTALLS[i],
                n,
                round,
                &mut m.rt[i],
            )?,
        }
    }
    Ok(())
}

/// One line of the breakdown.
struct Row {
    key: String,
    part: String,
    samples: Samples,
    /// From a histogram of the engine's: p50, p99, count.
    hist: Option<(f64, f64, u64)>,
    /// The measuring thread's CPU time of the same operations.
    cpu: Option<Samples>,
    /// Min-max of other per-round figures than the samples' medians.
    spread: Option<(f64, f64)>,
    how: &'static str,
}

impl Row {
    fn new(key: &str, part: &str, samples: &Samples, how: &'static str) -> Row {
        Row {
            key: key.into(),
            part: part.into(),
            samples: samples.clone(),
            hist: None,
            cpu: None,
            spread: None,
            how,
        }
    }

    fn spread(&self) -> (f64, f64) {
        self.spread.unwrap_or_else(|| self.samples.spread())
    }

    fn timed(key: &str, part: &str, t: &Timed, how: &'static str) -> Row {
        let mut row = Row::new(key, part, &t.wall, how);
        row.cpu = Some(t.cpu.clone());
        row
    }

    fn median(&self) -> f64 {
        self.hist.map_or_else(|| self.samples.median(), |h| h.0)
    }

    fn p99(&self) -> f64 {
        self.hist.map_or_else(|| self.samples.p99(), |h| h.1)
    }

    fn n(&self) -> u64 {
        self.hist.map_or(self.samples.values.len() as u64, |h| h.2)
    }

    fn json(&self) -> Value {
        let (lo, hi) = self.spread();
        json!({
            "key": self.key,
            "part": self.part,
            "median_us": self.median(),
            "p99_us": self.p99(),
            "spread_us": [lo, hi],
            // One value (the figure from issue 33) has no spread.
            "has_spread": self.samples.values.len() > 1,
            "n": self.n(),
            "cpu_median_us": self.cpu.as_ref().map(Samples::median),
            "how": self.how,
        })
    }
}

/// The VM runs of one variant.
fn runs_of<'a>(m: &'a Measured, key: &str) -> Vec<&'a VmRun> {
    m.vm.iter()
        .filter(|r| VM_VARIANTS[r.variant].key == key)
        .collect()
}

/// The VM rows of one variant: guest-observed per fault (per sample
/// interval of the steady window), the engine's service time (its
/// histogram, the rounds merged) and, over the whole run because the
/// engine's histograms cover the whole run, the mean service time and the
/// remainder ([`VmRun::whole_run`]).
fn vm_rows(m: &Measured, key: &str, what: &str, out: &mut Vec<Row>) {
    let runs = runs_of(m, key);
    if runs.is_empty() {
        return;
    }
    let v = &VM_VARIANTS[runs[0].variant];
    let source = if v.zero { "zero" } else { "store" };
    let mut guest = Samples::default();
    let mut guest_vcpu = Samples::default();
    let mut remainder = Samples::default();
    let mut service = Samples::default();
    let mut service_mean = Samples::default();
    let mut merged = Hist::default();
    let mut window_means = Samples::default();
    for r in &runs {
        let Some(w) = window(r, v.vcpus) else {
            continue;
        };
        window_means.push(r.round, w.wall_s * 1e6 / w.served);
        for &us in &w.interval_us {
            guest.push(r.round, us);
            guest_vcpu.push(r.round, us * v.vcpus as f64);
        }
        let main = Hist::from_json(&r.stats["swap"]["fault_latency_by_source_us"][source]);
        merged.merge(&main);
        service.push(r.round, main.quantile_us(0.5) as f64);
        if let Some((guest_us, service_us)) = r.whole_run(v.vcpus) {
            service_mean.push(r.round, service_us);
            remainder.push(r.round, guest_us - service_us);
        }
    }
    let k = key.replace('-', "_");
    let per_interval = "wall / faults served, per sample interval; spread: per-run windows";
    // The spread is that of the runs' whole windows: an interval's figure
    // is a mean over its faults already.
    let (lo, hi) = window_means.spread();
    if v.vcpus > 1 {
        let n = v.vcpus as f64;
        let mut per_vcpu = Row::new(
            &format!("guest_{k}"),
            &format!("guest: per fault per vCPU, {what}"),
            &guest_vcpu,
            "vCPUs x wall / faults served, per sample interval",
        );
        per_vcpu.spread = Some((lo * n, hi * n));
        out.push(per_vcpu);
        let mut wall = Row::new(
            &format!("guest_wall_{k}"),
            &format!("guest: wall time per fault, {what}"),
            &guest,
            per_interval,
        );
        wall.spread = Some((lo, hi));
        out.push(wall);
    } else {
        let mut row = Row::new(
            &format!("guest_{k}"),
            &format!("guest: per fault, {what}"),
            &guest,
            per_interval,
        );
        row.spread = Some((lo, hi));
        out.push(row);
    }
    let mut row = Row::new(
        &format!("service_{k}"),
        &format!("  engine service, {source} faults"),
        &service,
        "--stats-json fault_latency_by_source; spread: per-run p50",
    );
    row.hist = Some((
        merged.quantile_us(0.5) as f64,
        merged.quantile_us(0.99) as f64,
        merged.count(),
    ));
    out.push(row);
    out.push(Row::new(
        &format!("service_mean_{k}"),
        "  engine service, mean over the whole run's faults",
        &service_mean,
        "per run, all sources; bucket midpoints",
    ));
    out.push(Row::new(
        &format!("remainder_{k}"),
        if v.vcpus > 1 {
            "  remainder: guest per vCPU - service mean (with waits behind the other vCPU)"
        } else {
            "  remainder: guest - service mean (KVM exit, notification, wake, vCPU return)"
        },
        &remainder,
        "per run: vCPUs x wall / faults - service mean, boot to end",
    ));
}

fn rows(m: &Measured) -> Vec<Row> {
    let mut out = Vec::new();
    vm_rows(m, "file-1v", "1 vCPU, file store", &mut out);
    vm_rows(m, "file-2v", "2 vCPUs, 1 fault thread", &mut out);
    vm_rows(m, "file-2v-2t", "2 vCPUs, 2 fault threads", &mut out);
    vm_rows(m, "lz4-1v", "1 vCPU, mem:lz4 store", &mut out);
    vm_rows(m, "zero-1v", "zero faults, no limit, no I/O", &mut out);
    let rt_how = "two threads of the bench, no KVM";
    for (i, how) in INSTALLS.iter().enumerate() {
        let rt = &m.rt[i];
        let name = how.name();
        out.push(Row::new(
            &format!("rt_{name}"),
            &format!(
                "bare userfault round trip, served by {}",
                name.to_uppercase()
            ),
            &rt.total,
            rt_how,
        ));
        if *how == Install::Copy {
            out.push(Row::new(
                "rt_notify",
                "  write -> server's poll returns (fault, message, server wake-up)",
                &rt.notify,
                "one clock for both threads",
            ));
            out.push(Row::new(
                "rt_read",
                "  uffd read of the message",
                &rt.read,
                "read(2) of the uffd",
            ));
            out.push(Row::new(
                "rt_install",
                "  install (UFFDIO_COPY, not waking)",
                &rt.install,
                "",
            ));
            out.push(Row::new(
                "rt_wake",
                "  UFFDIO_WAKE, writer waiting",
                &rt.wake,
                "",
            ));
            out.push(Row::new(
                "rt_resume",
                "  wake returned -> write returns",
                &rt.resume,
                "negative: the writer ran first",
            ));
        } else {
            out.push(Row::new(
                &format!("rt_install_{name}"),
                &format!("  install (UFFDIO_{}, not waking)", name.to_uppercase()),
                &rt.install,
                "",
            ));
            out.push(Row::new(
                &format!("rt_resume_{name}"),
                "  wake returned -> write returns",
                &rt.resume,
                "",
            ));
        }
    }
    let s = &m.stores;
    out.push(Row::timed(
        "read_file",
        "store read 4 KiB, file (O_DIRECT, crc32)",
        &s.read_file,
        "FileStore::read, random slots of 16 MiB, idle disk",
    ));
    out.push(Row::timed(
        "read_lz4",
        "store read 4 KiB, mem:lz4 (decompress, crc32)",
        &s.read_lz4,
        "MemStore::read, seqwrite's pattern",
    ));
    let io = &m.ioctls;
    out.push(Row::new(
        "copy",
        "UFFDIO_COPY 4 KiB",
        &io.copy,
        "no waiter, DONTWAKE",
    ));
    out.push(Row::new(
        "move",
        "UFFDIO_MOVE 4 KiB",
        &io.moved,
        "no waiter, DONTWAKE",
    ));
    out.push(Row::new(
        "refill",
        "  + refill the moved-out buffer page",
        &io.refill,
        "touch: the kernel allocates and clears a page",
    ));
    out.push(Row::new(
        "zeropage",
        "UFFDIO_ZEROPAGE 4 KiB",
        &io.zeropage,
        "no waiter, DONTWAKE",
    ));
    out.push(Row::new(
        "wake",
        "UFFDIO_WAKE, nobody waiting",
        &io.wake,
        "one page",
    ));
    out.push(Row::new(
        "move_out",
        "eviction: move a page out to parking",
        &io.move_out,
        "UFFDIO_MOVE, no KVM mapping to invalidate",
    ));
    out.push(Row::timed(
        "write_1",
        "eviction: write one page per write",
        &s.write_one,
        "FileStore::write_batch of 1, slot freed at random",
    ));
    out.push(Row::timed(
        "write_64_separate",
        "eviction: 64 pages as 64 writes, one submission (per page)",
        &s.write_64_separate,
        "FileStore::write_batch of 64 scattered slots (the engine's way)",
    ));
    out.push(Row::timed(
        "write_64_one",
        "eviction: 64 pages as one 256 KiB write (per page)",
        &s.write_64_one,
        "FileStore::write_batch of one 256 KiB unit (log-structured)",
    ));
    let k = &m.kernel;
    if !k.touch.values.is_empty() {
        out.push(Row::new(
            "kernel_swap_in",
            "kernel swap-in of a page, host process (per touch)",
            &k.touch,
            "memory cgroup of the limit, swap file, random writes, no KVM",
        ));
        out.push(Row::new(
            "kernel_per_major_fault",
            "  mean per major fault (all touches' time / major faults)",
            &k.per_major_fault,
            "per round",
        ));
    }
    let mut issue = Samples::default();
    issue.push(0, KERNEL_KVM_US_FROM_ISSUE_33);
    let mut row = Row::new(
        "kernel_kvm_issue_33",
        "kernel swap-in through KVM (from issue 33, not measured here)",
        &issue,
        "key-value workload in a memory cgroup, wall / swap-ins",
    );
    row.hist = Some((KERNEL_KVM_US_FROM_ISSUE_33, f64::NAN, 0));
    out.push(row);
    // Parts that could not be measured here (said once as a SKIP) have no
    // samples.
    out.retain(|r| r.hist.is_some() || !r.samples.values.is_empty());
    out
}

/// Per-fault resources of each VM variant: per-round window values.
fn per_fault(m: &Measured) -> Vec<(&'static str, Vec<(&'static str, Samples)>)> {
    let mut out = Vec::new();
    for v in &VM_VARIANTS {
        let mut metrics: Vec<(&'static str, Samples)> = Vec::new();
        for r in runs_of(m, v.key) {
            let Some(w) = window(r, v.vcpus) else {
                continue;
            };
            for (name, value) in w.per_fault {
                match metrics.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, s)) => s.push(r.round, value),
                    None => {
                        let mut s = Samples::default();
                        s.push(r.round, value);
                        metrics.push((name, s));
                    }
                }
            }
        }
        if !metrics.is_empty() {
            out.push((v.key, metrics));
        }
    }
    out
}

fn fmt_us(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

const PER_FAULT_ROWS: [(&str, &str); 21] = [
    ("guest_wall_us", "wall time per fault, us"),
    ("cpu_us", "CPU per fault, all threads (user+sys), us"),
    ("user_us", "  user (guest time included), us"),
    ("sys_us", "  sys, us"),
    ("on_cpu_vcpu_us", "  vCPU threads on CPU, us"),
    ("on_cpu_fault_us", "  fault threads on CPU, us"),
    ("on_cpu_evictor_us", "  evictor on CPU, us"),
    ("on_cpu_other_us", "  other threads on CPU, us"),
    ("runq_vcpu_us", "run-queue wait, vCPU threads, us"),
    ("runq_fault_us", "run-queue wait, fault threads, us"),
    ("runq_evictor_us", "run-queue wait, evictor, us"),
    ("vcsw", "voluntary context switches, all threads"),
    ("ivcsw", "involuntary context switches, all threads"),
    ("vcsw_vcpu", "  voluntary, vCPU threads"),
    ("vcsw_fault", "  voluntary, fault threads"),
    ("evictions", "evictions"),
    ("evict_waits", "claims that waited for an eviction"),
    ("units_written", "pages written"),
    ("store_share", "share of store faults"),
    ("staging_share", "share of staging faults"),
    ("zero_share", "share of zero faults"),
];

/// The figures of the tables, as CSV rows of the report.
fn csv(ctx: &mut Ctx, rows: &[Row], per_fault: &[(&'static str, Vec<(&'static str, Samples)>)]) {
    for row in rows {
        for (metric, v) in [("p50_us", row.median()), ("p99_us", row.p99())] {
            if v.is_finite() {
                ctx.report.csv("fault-4k", &row.key, "", 0, metric, v, "us");
            }
        }
    }
    for (metric, _) in PER_FAULT_ROWS {
        for (key, metrics) in per_fault {
            if let Some((_, s)) = metrics.iter().find(|(n, _)| *n == metric) {
                ctx.report
                    .csv("fault-4k", metric, key, 0, "per_fault", s.median(), "");
            }
        }
    }
}

/// A number of the suite's entry; a missing one (JSON has no NaN) is NaN,
/// which the tables print as "-".
fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The suite's two tables from its entry in a results file: the run
/// prints them, and `hugevmm bench report --render` writes them into
/// docs/BENCHMARKS.md, so the published breakdown is always a run's.
pub fn tables_from_json(suite: &Value) -> Result<Vec<Table>> {
    let plan_name = suite["plan"].as_str().unwrap_or_default();
    let plan = Plan::named(plan_name)
        .with_context(|| format!("the fault_4k entry names no known plan ({plan_name:?})"))?;
    let rows = suite["rows"]
        .as_array()
        .context("the fault_4k entry has no rows")?;
    let mut t = Table::new(
        "fault-4k: where a 4 KiB store fault's time goes (us)",
        &["part", "median", "p99", "spread", "n", "cpu", "how"],
    );
    for row in rows {
        let spread = if row["has_spread"].as_bool().unwrap_or(false) {
            format!(
                "{}-{}",
                fmt_us(num(&row["spread_us"][0])),
                fmt_us(num(&row["spread_us"][1]))
            )
        } else {
            String::new()
        };
        let cpu = &row["cpu_median_us"];
        t.row(vec![
            row["part"].as_str().unwrap_or_default().to_string(),
            fmt_us(num(&row["median_us"])),
            fmt_us(num(&row["p99_us"])),
            spread,
            row["n"].as_u64().unwrap_or(0).to_string(),
            if cpu.is_null() {
                String::new()
            } else {
                fmt_us(num(cpu))
            },
            row["how"].as_str().unwrap_or_default().to_string(),
        ]);
    }
    t.note(&format!(
        "{} rounds ({} plan), variants alternated, order rotating; spread: min-max of the per-round medians (guest rows: of the per-run windows' wall time per fault)",
        suite["rounds"].as_u64().unwrap_or(0),
        plan.name
    ));
    t.note(&format!(
        "guest rows: randwrite over {} under --mem-limit {} (--mem {}), --swap-unit 4k, a {:.0} s window after the warm-up sampled every {} ms through the API socket; the zero run writes {} with no limit",
        plan.rand.2, plan.rand.1, plan.rand.0, plan.window_s, plan.sample_ms, plan.zero.1
    ));
    t.note(&format!(
        "1-minute load average {:.1} at the start, {:.1} at the end ({} cores)",
        num(&suite["loadavg_at_start"]),
        num(&suite["loadavg_at_end"]),
        suite["cores"].as_u64().unwrap_or(0)
    ));
    t.note("service: the engine's histogram (bucket upper edges, <= 12.5 % wide), from the fault thread taking up the message to the wake; its mean and the remainder (guest per vCPU minus it) cover the whole run from the first API answer, warm-up included, since the histograms do: bucket-midpoint means");
    let bare = &suite["bare_copy_per_fault"];
    if bare.is_object() {
        t.note(&format!(
            "bare round trip (COPY), per fault: writer {:.2} voluntary + {:.2} involuntary context switches and {:.1} us CPU, server {:.2} + {:.2} and {:.1} us CPU",
            num(&bare["writer_voluntary_switches"]),
            num(&bare["writer_involuntary_switches"]),
            num(&bare["writer_cpu_us"]),
            num(&bare["server_voluntary_switches"]),
            num(&bare["server_involuntary_switches"]),
            num(&bare["server_cpu_us"])
        ));
    }
    let majflt = &suite["kernel_major_faults_per_touch"];
    if !majflt.is_null() {
        t.note(&format!(
            "kernel swap-in: a process of its own writes {} in a memory cgroup of {} (swap file on --store-dir), then times random 4 KiB writes: {:.2} major faults per touch (the others found the page resident or read ahead){}",
            plan.rand.2,
            plan.rand.1,
            num(majflt),
            suite["kernel_note"]
                .as_str()
                .map(|n| format!("; {n}"))
                .unwrap_or_default()
        ));
    }
    let mut tables = vec![t];

    let per_fault = suite["per_fault"].as_array().cloned().unwrap_or_default();
    if per_fault.is_empty() {
        return Ok(tables);
    }
    let mut headers = vec!["per fault (median of rounds)"];
    headers.extend(
        per_fault
            .iter()
            .map(|v| v["variant"].as_str().unwrap_or("?")),
    );
    let mut t = Table::new(
        "fault-4k: what one fault costs the hugevmm process",
        &headers,
    );
    for (metric, label) in PER_FAULT_ROWS {
        let mut cells = vec![label.to_string()];
        for variant in &per_fault {
            let value = &variant["metrics"][metric]["median"];
            cells.push(if value.is_null() {
                String::new()
            } else {
                fmt_us(num(value))
            });
        }
        t.row(cells);
    }
    t.note("over the window, per fault served (store + staging + zero); CPU from /proc/PID/stat, by thread from /proc/PID/task/*/schedstat and status (vCPU user time includes guest time)");
    tables.push(t);
    Ok(tables)
}

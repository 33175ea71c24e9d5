//! `vhost-user`: swapping to a vhost-user-blk backend against the
//! O_DIRECT file store on the same file, and fio's io_uring engine on
//! that file.
//!
//! One file on `--store-dir` is the store of every variant:
//! qemu-storage-daemon serves it (`driver=file`, `cache.direct=on`,
//! `aio=io_uring`, one queue, the daemon's defaults otherwise: what a user
//! would start) to `--swap-store vhost-user-blk:SOCKET`; the file store
//! opens it itself (`--swap-store file:PATH,overwrite`); fio runs the
//! engine's I/O shape on it ([`fio::reader_and_writer_on`]). The file is
//! written through before each variant, so every one of them overwrites
//! allocated blocks and reads data, never holes.
//!
//! Two workloads, each under the default unit (`auto`): seqwrite (a guest
//! working set several times the memory limit, written in passes: 2 MiB
//! store traffic) and key-value (hot objects scattered over the heap:
//! chunks split, and 4 KiB page traffic). Rounds alternate the order of
//! the two stores; a round's ratios are of its own pair, and each figure
//! is the median of the rounds with its min-max.
//!
//! Host CPU per GiB moved is the `hugevmm run` process's user + system
//! time (vCPUs, engine, store workers) plus, for the vhost-user store, the
//! daemon's over the same run (its `/proc/PID/stat` before it is stopped;
//! a daemon is started for each run), over the store bytes read plus
//! written.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::fio::{self, EngineShape, Pattern};
use super::hist::median;
use super::report::{fmt_f, Aim, Headline, Table};
use super::runner::{RunResult, RunSpec, GIB};
use super::{interrupt, Ctx};

/// The aim for seqwrite: the vhost-user store at least as fast as
/// the file store on the same file (guest MiB/s).
const SEQWRITE_AIM: f64 = 1.0;

/// The aim for CPU: host CPU per GiB moved no higher than the
/// file store's, on every workload.
const CPU_AIM: f64 = 1.0;

/// The two stores, in the order of even rounds.
const STORES: [&str; 2] = ["vhost-user", "file"];

/// One workload of the suite.
struct Workload {
    name: &'static str,
    payload: &'static str,
    args: &'static str,
    mem: &'static str,
    limit: &'static str,
    timeout_s: f64,
}

/// Sizes and repetitions of a mode.
struct Plan {
    rounds: usize,
    vcpus: u32,
    /// Seconds per writer depth of each fio measurement.
    fio_seconds: u64,
    workloads: [Workload; 2],
}

fn plan(quick: bool) -> Plan {
    if quick {
        Plan {
            rounds: 3,
            vcpus: 2,
            fio_seconds: 5,
            workloads: [
                Workload {
                    name: "seqwrite",
                    payload: "seqwrite",
                    args: "bytes=768M passes=3",
                    mem: "1G",
                    limit: "256M",
                    timeout_s: 300.0,
                },
                Workload {
                    name: "key-value",
                    payload: "kv",
                    args: "heap=256M ops=300000",
                    mem: "512M",
                    limit: "96M",
                    timeout_s: 300.0,
                },
            ],
        }
    } else {
        Plan {
            rounds: 5,
            vcpus: 2,
            fio_seconds: 10,
            workloads: [
                Workload {
                    name: "seqwrite",
                    payload: "seqwrite",
                    args: "bytes=1536M passes=3",
                    mem: "2G",
                    limit: "512M",
                    timeout_s: 900.0,
                },
                Workload {
                    name: "key-value",
                    payload: "kv",
                    args: "heap=512M ops=1000000",
                    mem: "1G",
                    limit: "160M",
                    timeout_s: 900.0,
                },
            ],
        }
    }
}

/// A qemu-storage-daemon serving the store file, stopped when dropped.
struct Daemon {
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Starts the daemon on `file`, exporting it on `socket`; returns once
    /// the socket is there (the daemon creates it when it listens, and a
    /// probe connection is not made: it serves one frontend at a time).
    fn start(file: &Path, socket: &Path, log: &Path) -> Result<Daemon> {
        let _ = std::fs::remove_file(socket);
        let stderr = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new("qemu-storage-daemon")
            .args(daemon_args(file, socket))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("cannot start qemu-storage-daemon")?;
        let mut daemon = Daemon { child };
        let started = Instant::now();
        while !socket.exists() {
            if let Some(status) = daemon.child.try_wait()? {
                bail!(
                    "qemu-storage-daemon exited ({status}) before listening: {}",
                    std::fs::read_to_string(log).unwrap_or_default().trim()
                );
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!(
                    "qemu-storage-daemon did not listen on {} within 30 s",
                    socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(daemon)
    }

    /// The daemon's user + system CPU seconds so far.
    fn cpu_s(&self) -> Result<f64> {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("cannot read /proc/{pid}/stat of qemu-storage-daemon"))?;
        process_cpu_s(&stat).with_context(|| format!("cannot parse /proc/{pid}/stat: {stat:?}"))
    }
}

/// qemu-storage-daemon's arguments: the file, direct I/O through io_uring,
/// exported writable as a vhost-user-blk device with one queue.
fn daemon_args(file: &Path, socket: &Path) -> Vec<String> {
    vec![
        "--blockdev".into(),
        format!(
            "driver=file,node-name=file0,filename={},cache.direct=on,aio=io_uring",
            file.display()
        ),
        "--export".into(),
        format!(
            "type=vhost-user-blk,id=export0,node-name=file0,addr.type=unix,addr.path={},writable=on,num-queues=1",
            socket.display()
        ),
    ]
}

/// utime + stime of a `/proc/PID/stat` line, in seconds. The command name
/// (field 2) is in parentheses and may hold spaces, so fields are counted
/// from the last `)`.
fn process_cpu_s(stat: &str) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name; utime and stime are
    // fields 14 and 15.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_s > 0).then(|| ticks as f64 / per_s as f64)
}

/// The store file, removed when dropped.
struct StoreFile(PathBuf);

impl Drop for StoreFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// 2 MiB hugetlb pages the store's shared buffers take (its 24 MiB of
/// data buffers and its rings), with room to spare.
const SHARED_HUGE_PAGES: u64 = 16;

/// Makes sure the pool has the store's hugetlb pages free, growing it (as
/// root) for the suite if not, given back when the returned value drops;
/// and what the suite's shared buffers are in, as the results say it: the
/// store takes hugetlb pages where the pool has them, else 4 KiB pages
/// (slower: blockio's `SharedArea`).
fn shared_huge_pages(pages: u64) -> (Option<test_resources::hugetlb::HugetlbPages>, String) {
    match test_resources::hugetlb::reserve(pages) {
        Ok(reserved) if reserved.added_pages() == 0 => (
            Some(reserved),
            "2 MiB hugetlb pages (the host's pool had them free)".to_string(),
        ),
        Ok(reserved) => {
            let note = format!(
                "2 MiB hugetlb pages (the suite grew the host's pool by {} pages for it and shrank it back after)",
                reserved.added_pages()
            );
            (Some(reserved), note)
        }
        Err(why) => (
            None,
            format!("4 KiB pages ({why}: the store falls back to them, and each 2 MiB request is slower)"),
        ),
    }
}

/// Writes the first `bytes` of `file` through once with fio.
fn fill(file: &Path, bytes: u64) -> Result<()> {
    let target = [
        "--ioengine=io_uring".to_string(),
        "--direct=1".into(),
        format!("--filename={}", file.display()),
    ];
    fio::run(&target, Pattern::Fill, &bytes.to_string(), None)
        .map(drop)
        .with_context(|| format!("writing {} through with fio", file.display()))
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    for (program, package) in [
        ("qemu-storage-daemon", "qemu-system-common"),
        ("fio", "fio"),
    ] {
        if !super::have_program(program) {
            ctx.skip(
                "vhost-user",
                &format!("{program} is not installed (Debian: apt-get install {package})"),
            );
            return Ok(());
        }
    }
    if let Some(why) = ctx.kvm_unusable.clone() {
        ctx.skip("vhost-user", &why);
        return Ok(());
    }
    let plan = plan(ctx.quick());
    let file_bytes = plan
        .workloads
        .iter()
        .map(|w| guestmem::parse_size(w.mem))
        .collect::<Result<Vec<u64>, _>>()
        .context("a workload's --mem is not a size")?
        .into_iter()
        .max()
        .unwrap_or(0);
    let store_file = StoreFile(ctx.store_dir.join(format!(
        "hugevmm-bench-vhost-user-{}.img",
        std::process::id()
    )));
    std::fs::File::create(&store_file.0)
        .and_then(|f| f.set_len(file_bytes))
        .with_context(|| format!("cannot create the store file {}", store_file.0.display()))?;
    let socket = ctx.raw_path("vhost-user.sock");
    let shape = EngineShape::of_engine();
    let (_huge_pages, shared_pages) = shared_huge_pages(SHARED_HUGE_PAGES);
    ctx.progress
        .plan(plan.rounds * (plan.workloads.len() * STORES.len() + 1));

    let mut runs = Vec::new();
    let mut fio_runs = Vec::new();
    for round in 0..plan.rounds {
        let mut order = STORES;
        if round % 2 == 1 {
            order.reverse();
        }
        for workload in &plan.workloads {
            for store in order {
                interrupt::check()?;
                fill(&store_file.0, file_bytes)?;
                if let Some(run) =
                    run_one(ctx, &plan, workload, store, round, &store_file.0, &socket)?
                {
                    runs.push(run);
                }
            }
        }
        interrupt::check()?;
        ctx.progress.start(&format!(
            "fio io_uring, the engine's shape, on the store file, round {}",
            round + 1
        ));
        match fio::reader_and_writer_on(&store_file.0, file_bytes, plan.fio_seconds, shape) {
            Ok(c) => {
                let (read, write) = (c.read_bytes_per_s() / GIB, c.write_bytes_per_s() / GIB);
                ctx.progress
                    .done(&format!("read {read:.2} GiB/s, write {write:.2} GiB/s"));
                fio_runs.push(json!({
                    "round": round + 1,
                    "read_gibs": read,
                    "write_gibs": write,
                    "commands": c.runs.iter().map(|(_, r)| r.command.clone()).collect::<Vec<_>>(),
                }));
            }
            Err(e) => {
                let msg = format!("{e:#}");
                ctx.progress.failed(&msg);
                ctx.report
                    .failures
                    .push(format!("vhost-user fio round {}: {msg}", round + 1));
            }
        }
    }
    let suite = json!({
        "rounds_planned": plan.rounds,
        "vcpus": plan.vcpus,
        "daemon": format!("qemu-storage-daemon {}", daemon_args(Path::new("FILE"), Path::new("SOCKET")).join(" ")),
        "fio_shape": shape.text(),
        "shared_pages": shared_pages,
        "workloads": plan.workloads.iter().map(|w| json!({
            "name": w.name, "payload": w.payload, "args": w.args, "mem": w.mem, "limit": w.limit,
        })).collect::<Vec<_>>(),
        "runs": runs,
        "fio": fio_runs,
    });
    ctx.report.tables.extend(tables_from_json(&suite));
    ctx.report.headline.extend(headlines(&suite));
    ctx.report.set("vhost_user", suite);
    Ok(())
}

/// One VM run of `workload` on `store`; `None` when it failed (reported).
fn run_one(
    ctx: &mut Ctx,
    plan: &Plan,
    workload: &Workload,
    store: &str,
    round: usize,
    file: &Path,
    socket: &Path,
) -> Result<Option<Value>> {
    let vhost = store == "vhost-user";
    let daemon = if vhost {
        match Daemon::start(file, socket, &ctx.raw_path("vhost-user-daemon.log")) {
            Ok(d) => Some(d),
            Err(e) => {
                let msg = format!("{e:#}");
                ctx.progress.failed(&msg);
                ctx.report.failures.push(format!("vhost-user: {msg}"));
                return Ok(None);
            }
        }
    } else {
        None
    };
    let spec = RunSpec {
        name: format!("vhost-user-{}-{store}-{}", workload.name, round + 1),
        payload: workload.payload,
        payload_args: workload.args.into(),
        vcpus: plan.vcpus,
        mem: workload.mem.into(),
        mem_limit: Some(workload.limit.into()),
        store: if vhost {
            format!("vhost-user-blk:{}", socket.display())
        } else {
            format!("file:{},overwrite", file.display())
        },
        unit: "auto",
        pageout: false,
        timeline_ms: None,
        timeout_s: workload.timeout_s,
        allow_timeout: false,
        extra_args: Vec::new(),
        encrypt: false,
    };
    let daemon_cpu_before_s = daemon.as_ref().map(Daemon::cpu_s).transpose()?;
    let label = format!(
        "{} on the {store} store, round {}",
        workload.name,
        round + 1
    );
    let Some(r) = ctx.run_vm(&spec, &label, |r| {
        format!("{:.2} s, {:.2} GiB/s store I/O", r.elapsed_s(), r.io_gibs())
    })?
    else {
        return Ok(None);
    };
    let daemon_cpu_s = match (&daemon, daemon_cpu_before_s) {
        (Some(d), Some(before)) => d.cpu_s()? - before,
        _ => 0.0,
    };
    drop(daemon);
    Ok(Some(run_json(
        &r,
        workload.name,
        store,
        round,
        daemon_cpu_s,
    )))
}

fn run_json(r: &RunResult, workload: &str, store: &str, round: usize, daemon_cpu_s: f64) -> Value {
    json!({
        "round": round + 1,
        "workload": workload,
        "store": store,
        "elapsed_s": r.elapsed_s(),
        "guest_mibs": r.throughput_mibs(),
        "read_bytes": r.swap("bytes_read"),
        "write_bytes": r.swap("bytes_written"),
        "hugevmm_cpu_s": r.cpu_s,
        "daemon_cpu_s": daemon_cpu_s,
        "command": r.spec.command_line(),
    })
}

/// A run as the suite's JSON holds it.
struct Run<'a>(&'a Value);

impl Run<'_> {
    fn num(&self, key: &str) -> f64 {
        self.0.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
    }
    fn is(&self, workload: &str, store: &str) -> bool {
        self.0["workload"] == workload && self.0["store"] == store
    }
    fn round(&self) -> u64 {
        self.0["round"].as_u64().unwrap_or(0)
    }
    fn moved_gib(&self) -> f64 {
        (self.num("read_bytes") + self.num("write_bytes")) / GIB
    }
    fn cpu_s(&self) -> f64 {
        self.num("hugevmm_cpu_s") + self.num("daemon_cpu_s")
    }
    fn cpu_s_per_gib(&self) -> f64 {
        self.cpu_s() / self.moved_gib()
    }
    fn gibs(&self, key: &str) -> f64 {
        self.num(key) / GIB / self.num("elapsed_s")
    }
}

fn runs_of<'a>(suite: &'a Value, workload: &'a str, store: &'a str) -> Vec<Run<'a>> {
    suite["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(Run)
        .filter(|r| r.is(workload, store))
        .collect()
}

/// Per round that has both stores' run of `workload`, `f(vhost, file)`.
fn per_round(suite: &Value, workload: &str, f: impl Fn(&Run, &Run) -> f64) -> Vec<f64> {
    let files = runs_of(suite, workload, "file");
    runs_of(suite, workload, "vhost-user")
        .iter()
        .filter_map(|v| {
            let file = files.iter().find(|f| f.round() == v.round())?;
            Some(f(v, file))
        })
        .collect()
}

fn med(values: Vec<f64>) -> String {
    let finite: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    match (
        median(&finite),
        finite.iter().copied().reduce(f64::min),
        finite.iter().copied().reduce(f64::max),
    ) {
        (Some(m), Some(lo), Some(hi)) => {
            format!("{} ({}-{})", fmt_f(m, 2), fmt_f(lo, 2), fmt_f(hi, 2))
        }
        _ => "-".into(),
    }
}

/// The suite's table from its JSON alone: per workload and store, the
/// medians (min-max) of the rounds; then fio's rates on the same file.
pub fn tables_from_json(suite: &Value) -> Vec<Table> {
    let mut t = Table::new(
        &format!(
            "vhost-user: the vhost-user-blk store (qemu-storage-daemon) against the file store on the same file, --swap-unit auto, {} vCPUs, {} alternated rounds; medians (min-max)",
            suite["vcpus"], suite["rounds_planned"]
        ),
        &[
            "workload",
            "store",
            "wall s",
            "guest MiB/s",
            "store read GiB/s",
            "store write GiB/s",
            "host CPU s per GiB moved",
            "of it the daemon's",
            "rounds ok",
        ],
    );
    for w in suite["workloads"].as_array().into_iter().flatten() {
        let name = w["name"].as_str().unwrap_or("");
        for store in STORES {
            let runs = runs_of(suite, name, store);
            let col = |f: &dyn Fn(&Run) -> f64| med(runs.iter().map(f).collect());
            t.row(vec![
                format!(
                    "{name} (`{} {}`, --mem {} --mem-limit {})",
                    w["payload"].as_str().unwrap_or(""),
                    w["args"].as_str().unwrap_or(""),
                    w["mem"].as_str().unwrap_or(""),
                    w["limit"].as_str().unwrap_or("")
                ),
                store.into(),
                col(&|r| r.num("elapsed_s")),
                // key-value's lines carry no byte count: its figure is
                // its wall time.
                if runs.iter().any(|r| r.num("guest_mibs") > 0.0) {
                    col(&|r| r.num("guest_mibs"))
                } else {
                    "-".into()
                },
                col(&|r| r.gibs("read_bytes")),
                col(&|r| r.gibs("write_bytes")),
                col(&|r| r.cpu_s_per_gib()),
                if store == "vhost-user" {
                    col(&|r| r.num("daemon_cpu_s") / r.moved_gib())
                } else {
                    "-".into()
                },
                format!("{} of {}", runs.len(), suite["rounds_planned"]),
            ]);
        }
    }
    let fio: Vec<&Value> = suite["fio"].as_array().into_iter().flatten().collect();
    let fio_col = |key: &str| med(fio.iter().filter_map(|f| f[key].as_f64()).collect());
    t.row(vec![
        "fio io_uring, the engine's shape".into(),
        "same file".into(),
        "-".into(),
        "-".into(),
        fio_col("read_gibs"),
        fio_col("write_gibs"),
        "-".into(),
        "-".into(),
        format!("{} of {}", fio.len(), suite["rounds_planned"]),
    ]);
    t.note(&format!(
        "backend: {}; file store: file:FILE,overwrite; before each variant fio writes the file through, so every variant overwrites allocated blocks",
        suite["daemon"].as_str().unwrap_or("")
    ));
    if let Some(pages) = suite["shared_pages"].as_str() {
        t.note(&format!(
            "the vhost-user store's buffers shared with the daemon: {pages}"
        ));
    }
    t.note(&format!(
        "host CPU: user + system seconds of `hugevmm run` (vCPUs included) plus the daemon's over the same run, over store bytes read + written; {}",
        suite["fio_shape"].as_str().unwrap_or("")
    ));
    vec![t]
}

/// The suite's figures, per round, from its JSON alone.
pub fn headlines(suite: &Value) -> Vec<Headline> {
    let rounds = format!("{} alternated rounds", suite["rounds_planned"]);
    vec![
        Headline::new(
            "vhost_user_seqwrite_over_file",
            "vhost-user store / file store, seqwrite guest MiB/s, same file",
            per_round(suite, "seqwrite", |v, f| {
                v.num("guest_mibs") / f.num("guest_mibs")
            }),
            Some(Aim::AtLeast(SEQWRITE_AIM)),
            format!("each round's vhost-user seqwrite MiB/s over its file-store run's; {rounds}"),
        ),
        Headline::new(
            "vhost_user_seqwrite_cpu_over_file",
            "vhost-user store / file store, seqwrite host CPU per GiB moved",
            per_round(suite, "seqwrite", |v, f| {
                v.cpu_s_per_gib() / f.cpu_s_per_gib()
            }),
            Some(Aim::AtMost(CPU_AIM)),
            format!("hugevmm's CPU plus the daemon's, per GiB of store I/O; {rounds}"),
        ),
        Headline::new(
            "vhost_user_kv_speed_over_file",
            "vhost-user store / file store, key-value speed (file wall s / vhost-user wall s)",
            per_round(suite, "key-value", |v, f| {
                f.num("elapsed_s") / v.num("elapsed_s")
            }),
            None,
            format!("fixed work, each round's pair; {rounds}"),
        ),
        Headline::new(
            "vhost_user_kv_cpu_over_file",
            "vhost-user store / file store, key-value host CPU per GiB moved",
            per_round(suite, "key-value", |v, f| {
                v.cpu_s_per_gib() / f.cpu_s_per_gib()
            }),
            Some(Aim::AtMost(CPU_AIM)),
            format!("hugevmm's CPU plus the daemon's, per GiB of store I/O; {rounds}"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_past_a_name_with_spaces() {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let stat =
            "4242 (qemu storage) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1 2 3";
        assert_eq!(process_cpu_s(stat), Some(300.0 / hz));
        assert_eq!(process_cpu_s("4242 (x) S 1"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(process_cpu_s(&own).is_some(), "{own}");
    }

    fn run(round: u64, workload: &str, store: &str, elapsed_s: f64, cpu_s: f64) -> Value {
        json!({
            "round": round, "workload": workload, "store": store, "elapsed_s": elapsed_s,
            "guest_mibs": 1000.0 / elapsed_s, "read_bytes": GIB, "write_bytes": GIB,
            "hugevmm_cpu_s": cpu_s, "daemon_cpu_s": if store == "file" { 0.0 } else { 1.0 },
        })
    }

    #[test]
    fn ratios_pair_each_round_and_a_missed_aim_says_so() {
        let suite = json!({
            "rounds_planned": 2, "vcpus": 2, "daemon": "d", "fio_shape": "s",
            "workloads": [{"name": "seqwrite", "payload": "seqwrite", "args": "", "mem": "1G", "limit": "256M"},
                          {"name": "key-value", "payload": "kv", "args": "", "mem": "512M", "limit": "96M"}],
            "runs": [
                run(1, "seqwrite", "vhost-user", 2.0, 3.0), run(1, "seqwrite", "file", 1.0, 2.0),
                run(2, "seqwrite", "file", 1.0, 2.0), run(2, "seqwrite", "vhost-user", 4.0, 3.0),
                // Round 2's key-value pair lacks its vhost-user run: no ratio.
                run(1, "key-value", "vhost-user", 10.0, 3.0), run(1, "key-value", "file", 20.0, 4.0),
                run(2, "key-value", "file", 20.0, 4.0),
            ],
            "fio": [{"round": 1, "read_gibs": 1.0, "write_gibs": 2.0}],
        });
        let h = headlines(&suite);
        assert_eq!(h[0].values, [0.5, 0.25]);
        assert_eq!(h[0].verdict(), "missed");
        assert_eq!(
            h[1].values,
            [2.0, 2.0],
            "(3 + 1) s / 2 GiB over 2 s / 2 GiB"
        );
        assert_eq!(h[1].met(), Some(false));
        assert_eq!(h[2].values, [2.0]);
        assert_eq!(h[3].values, [1.0], "(3 + 1) s over 4 s, per 2 GiB");
        assert_eq!(h[3].met(), Some(true));
        let md = tables_from_json(&suite)[0].markdown();
        assert!(md.contains("| 1 of 2 |"), "{md}");
        assert!(
            md.contains("| 1.00 (1.00-1.00) | 2.00 (2.00-2.00) |"),
            "{md}"
        );
    }
}

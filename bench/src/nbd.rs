//! `nbd`: swapping to an NBD store over loopback, against what the same
//! server does for fio's nbd engine.
//!
//! One nbdkit memory server on a loopback TCP port serves both sides, so
//! the comparison is of clients, not servers. The hugevmm side is the
//! seqwrite workload of `swap-w-seq` (4 vCPUs writing a working set
//! several times the memory limit) with `--swap-store nbd://127.0.0.1:PORT/`:
//! its figure is the store traffic, bytes read plus written over the run's
//! wall time. The fio side is the same traffic pattern as the engine's at
//! steady state: 2 MiB requests, half reads half writes, at the engine's
//! queue depth (one eviction batch of 8 units; faults add to it), on one
//! connection (`--ioengine=nbd`, one job). fio's writes carry no FUA and
//! are never flushed, while the store's writes are FUA (nbdkit's memory
//! plugin offers it): what the durability costs is inside the ratio.
//! The export is written once before the first fio run, so that fio's
//! reads are of data, as the store's are, and not of never-written (and
//! cheaper) holes. Runs interleave (hugevmm, fio, hugevmm, fio, ...) so
//! that drift hits both alike; the figures are medians.

use anyhow::{bail, Context, Result};
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::fio::{self, Pattern, QUEUE_DEPTH};
use super::hist::median;
use super::report::{fmt_f, Aim, Headline, Table};
use super::runner::{RunSpec, GIB};
use super::{interrupt, Ctx};

/// The aim for the ratio (the issue's): the store reaches at least this
/// fraction of what the server does for fio.
const AIM: f64 = 0.8;

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nbdkit's memory plugin on a free loopback port, ready to serve.
fn start_server(size: &str, log: &Path) -> Result<Server> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("no free loopback port")?
        .port();
    let stderr = std::fs::File::create(log).context("cannot create the nbdkit log")?;
    let child = Command::new("nbdkit")
        .args([
            "--foreground",
            "--exit-with-parent",
            "-i",
            "127.0.0.1",
            "-p",
        ])
        .arg(port.to_string())
        .args(["memory", &format!("size={size}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("cannot start nbdkit")?;
    let mut server = Server { child, port };
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = server.child.try_wait()? {
            bail!(
                "nbdkit exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("nbdkit did not listen within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(server)
}

/// One fio run on the export; returns (read + write bytes/s, the command).
fn fio(uri: &str, pattern: Pattern, size: &str, runtime_s: Option<u32>) -> Result<(f64, String)> {
    let target = ["--ioengine=nbd".to_string(), format!("--uri={uri}")];
    let run = fio::run(&target, pattern, size, runtime_s.map(u64::from))?;
    Ok((run.rate.total_bytes_per_s(), run.command))
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    for (program, package) in [("nbdkit", "nbdkit"), ("fio", "fio")] {
        if !super::have_program(program) {
            ctx.skip(
                "nbd",
                &format!("{program} is not installed (Debian: apt-get install {package})"),
            );
            return Ok(());
        }
    }
    let (mem, limit, runs, fio_runtime_s) = if ctx.quick() {
        ("1G", "256M", 1, 10)
    } else {
        ("2G", "512M", 3, 20)
    };
    let server = start_server(mem, &ctx.raw_path("nbd-nbdkit.log"))?;
    let uri = format!("nbd://127.0.0.1:{}/", server.port);
    // Written once, so that fio reads data (see the module docs).
    fio(&uri, Pattern::Fill, mem, None).context("prefilling the export with fio")?;

    let mut store_gibs = Vec::new();
    let mut fio_gibs = Vec::new();
    let mut fio_command = String::new();
    let mut per_run = Vec::new();
    // Each pair's (store, fio) GiB/s, for the per-pair ratio.
    let mut pairs: Vec<(Option<f64>, Option<f64>)> = Vec::new();
    for i in 0..runs {
        interrupt::check()?;
        pairs.push((None, None));
        let spec = RunSpec {
            name: format!("nbd-seqwrite-{i}"),
            payload: "seqwrite",
            payload_args: "passes=4".into(),
            vcpus: 4,
            mem: mem.into(),
            mem_limit: Some(limit.into()),
            store: uri.clone(),
            unit: "2m",
            pageout: false,
            timeline_ms: None,
            timeout_s: 900.0,
            allow_timeout: false,
            extra_args: Vec::new(),
            encrypt: false,
        };
        let label = format!("seqwrite on {uri}, run {}", i + 1);
        if let Some(r) = ctx.run_vm(&spec, &label, |r| {
            format!("{:.2} GiB/s store I/O", r.io_gibs())
        })? {
            store_gibs.push(r.io_gibs());
            pairs[i].0 = Some(r.io_gibs());
            ctx.report.csv(
                "nbd",
                "seqwrite",
                "store",
                i + 1,
                "io_gibs",
                r.io_gibs(),
                "GiB/s",
            );
            per_run.push(json!({"run": i + 1, "side": "hugevmm", "io_gibs": r.io_gibs(), "elapsed_s": r.elapsed_s()}));
        }
        ctx.progress.start(&format!(
            "fio randrw 2M qd{QUEUE_DEPTH} on {uri}, run {}",
            i + 1
        ));
        match fio(&uri, Pattern::Mixed, mem, Some(fio_runtime_s)) {
            Ok((bytes_per_s, command)) => {
                let gibs = bytes_per_s / GIB;
                ctx.progress.done(&format!("{gibs:.2} GiB/s"));
                fio_gibs.push(gibs);
                pairs[i].1 = Some(gibs);
                fio_command = command;
                ctx.report
                    .csv("nbd", "randrw-2m", "fio", i + 1, "io_gibs", gibs, "GiB/s");
                per_run.push(json!({"run": i + 1, "side": "fio", "io_gibs": gibs}));
            }
            Err(e) => {
                let msg = format!("{e:#}");
                ctx.progress.failed(&msg);
                ctx.report
                    .failures
                    .push(format!("nbd fio run {}: {msg}", i + 1));
            }
        }
    }
    drop(server);
    let (Some(store), Some(fio_median)) = (median(&store_gibs), median(&fio_gibs)) else {
        bail!("no complete pair of runs (see the failures)");
    };
    let ratio = store / fio_median.max(1e-9);
    let mut t = Table::new(
        &format!("nbd: swap store traffic over loopback vs fio's nbd engine on the same nbdkit memory server (medians of {runs})"),
        &["side", "pattern", "GiB/s (read + write)"],
    );
    t.row(vec![
        "hugevmm store".into(),
        format!("seqwrite, 4 vCPUs, --mem {mem} --mem-limit {limit}, 2 MiB units, FUA writes"),
        fmt_f(store, 2),
    ]);
    t.row(vec![
        "fio".into(),
        format!("randrw 50/50, bs 2M, iodepth {QUEUE_DEPTH}, 1 connection"),
        fmt_f(fio_median, 2),
    ]);
    t.row(vec!["ratio".into(), "store / fio".into(), fmt_f(ratio, 2)]);
    t.note(&format!("fio command: {fio_command}"));
    ctx.report.tables.push(t);
    ctx.report.headline.push(Headline::new(
        "nbd_store_over_fio",
        "NBD store traffic / fio nbd engine, same server",
        pairs
            .iter()
            .filter_map(|&(store, fio)| Some(store? / fio?))
            .collect(),
        Some(Aim::AtLeast(AIM)),
        format!(
            "store read+write GiB/s of seqwrite over fio's 2M qd{QUEUE_DEPTH} read+write GiB/s of the same pair, {runs} interleaved pairs"
        ),
    ));
    ctx.report.set(
        "nbd",
        json!({
            "store_io_gibs": store,
            "fio_io_gibs": fio_median,
            "ratio": ratio,
            "queue_depth": QUEUE_DEPTH,
            "fio_command": fio_command,
            "runs": per_run,
        }),
    );
    Ok(())
}

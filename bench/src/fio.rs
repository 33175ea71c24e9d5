//! Reference ceilings from `fio` (Debian's package), run in the same
//! invocation as the VM runs they judge, interleaved with them.
//!
//! The store file's ceilings ([`reader_and_writer_on_file`]) have the
//! shape a swapping VM gives its store ([`EngineShape`]): two streams at
//! once on the same file, a reader with as many 2 MiB reads in flight as
//! the engine has fault-service threads (each reads one chunk at a time)
//! and a writer with 2 MiB writes in flight, both walking the file's slots
//! in order (the engine writes evicted chunks to the lowest free slots in
//! batches of adjacent ones and a guest's passes read them back in the
//! order they went out), `O_DIRECT`, through io_uring. The evictor has
//! from one write in flight (a flush of one chunk, its usual one while
//! swapping) to a whole batch, so fio runs both ends: a deep writer takes
//! the disk from a one-deep reader (on this project's disk the reader got
//! less than half its rate beside a writer 8 deep than beside one 1 deep),
//! so the read ceiling is the reader's best rate over the two runs and the
//! write ceiling the writer's best. fio reports each job's rate, so the
//! read and the write ceilings are separate figures and the engine's read
//! and write rates are each held to their own. (The earlier ceiling, one
//! job doing ordered reads and writes half each with 8 in flight, paced
//! reads and writes alike, which the engine's two streams are not.)
//! `limits` measures its
//! own ceilings through `blockio`, the code under test; fio is an
//! independent tool, so a figure divided by it cannot flatter the engine's
//! own I/O path.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Requests in flight of the single-job patterns ([`run`]; the NBD
/// suite's): the engine's eviction batch of 2 MiB units.
pub const QUEUE_DEPTH: usize = 8;

/// The I/O a swapping VM with 2 MiB units gives its file store, read from
/// the engine's own defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineShape {
    /// Bytes per request: one chunk.
    pub block_bytes: u64,
    /// Reads in flight: one per fault-service thread (the default count;
    /// each reads one chunk at a time on the fault path).
    pub read_depth: usize,
    /// Most writes in flight: the evictor's batch (all of a batch's
    /// writes are submitted together through one io_uring ring); a flush
    /// of one chunk has one.
    pub write_depth_max: usize,
}

impl EngineShape {
    /// The defaults of `hugevmm run --swap-unit 2m`.
    pub fn of_engine() -> EngineShape {
        let config = swap::engine::EngineConfig {
            unit: swap::engine::SwapUnit::Huge2M,
            ..Default::default()
        };
        EngineShape {
            block_bytes: guestmem::CHUNK_BYTES,
            read_depth: config.fault_threads.max(1),
            write_depth_max: config.batch_units_or_default(),
        }
    }

    /// The writer's depths fio runs: one write in flight, and a batch.
    pub fn write_depths(&self) -> Vec<usize> {
        let mut d = vec![1, self.write_depth_max.max(1)];
        d.dedup();
        d
    }

    /// One line for tables and progress.
    pub fn text(&self) -> String {
        format!(
            "fio: one reader ({} x {} MiB in flight) and one writer ({} x {} MiB in flight) at once on the same file, in slot order, O_DIRECT, io_uring; read ceiling the reader's best, write ceiling the writer's best",
            self.read_depth,
            self.block_bytes >> 20,
            self.write_depths()
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" or "),
            self.block_bytes >> 20
        )
    }
}

/// One round of [`reader_and_writer_on_file`]: a run per writer depth.
#[derive(Debug, Clone)]
pub struct Ceilings {
    /// `(writer depth, run)`.
    pub runs: Vec<(usize, FioRun)>,
}

impl Ceilings {
    /// The reader's best rate, bytes/s.
    pub fn read_bytes_per_s(&self) -> f64 {
        self.runs
            .iter()
            .map(|(_, r)| r.rate.read_bytes_per_s)
            .fold(0.0, f64::max)
    }

    /// The writer's best rate, bytes/s.
    pub fn write_bytes_per_s(&self) -> f64 {
        self.runs
            .iter()
            .map(|(_, r)| r.rate.write_bytes_per_s)
            .fold(0.0, f64::max)
    }
}

/// What one fio run moved.
#[derive(Debug, Clone, Copy)]
pub struct FioRate {
    /// Read bandwidth, bytes/s.
    pub read_bytes_per_s: f64,
    /// Write bandwidth, bytes/s.
    pub write_bytes_per_s: f64,
}

impl FioRate {
    /// Reads and writes together, bytes/s: what a swapping VM's store I/O
    /// (bytes read plus written over the time it swapped) is divided by.
    pub fn total_bytes_per_s(&self) -> f64 {
        self.read_bytes_per_s + self.write_bytes_per_s
    }
}

/// `None` with the reason when there is no usable fio here.
pub fn unavailable() -> Option<String> {
    match Command::new("fio").arg("--version").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "fio --version failed ({}); install Debian's fio",
            out.status
        )),
        Err(e) => Some(format!("no fio ({e}); install it: apt-get install fio")),
    }
}

/// What a fio run does: write the target once (sequentially, laying out
/// data so that later reads read data, not holes), or the mixed pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Sequential 2 MiB writes over the whole size, once.
    Fill,
    /// 2 MiB reads and writes, half each, on consecutive offsets
    /// (fio's sequential `rw`).
    Mixed,
}

/// One fio run: its rates and the command, for the report.
#[derive(Debug, Clone)]
pub struct FioRun {
    /// What it moved.
    pub rate: FioRate,
    /// The command line, as a user would type it.
    pub command: String,
}

/// Runs fio on `target` (the engine and where: `--ioengine=nbd
/// --uri=...`, or `--ioengine=io_uring --direct=1 --filename=...`) over
/// `size` bytes (fio's size syntax), for `seconds` when given (else once
/// over the size).
pub fn run(
    target: &[String],
    pattern: Pattern,
    size: &str,
    seconds: Option<u64>,
) -> Result<FioRun> {
    let mut args = vec![
        "--name=hugevmm-2m".to_string(),
        "--bs=2M".into(),
        format!("--iodepth={QUEUE_DEPTH}"),
        "--numjobs=1".into(),
        format!("--size={size}"),
        "--output-format=json".into(),
    ];
    match pattern {
        Pattern::Fill => args.push("--rw=write".into()),
        Pattern::Mixed => {
            args.push("--rw=rw".into());
            args.push("--rwmixread=50".into());
        }
    }
    if let Some(s) = seconds {
        args.push("--time_based".into());
        args.push(format!("--runtime={s}"));
    }
    args.extend(target.iter().cloned());
    fio(args)
}

/// Runs fio with `args` (which ask for JSON output).
fn fio(args: Vec<String>) -> Result<FioRun> {
    let command = format!("fio {}", args.join(" "));
    let out = Command::new("fio")
        .args(&args)
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!(
            "{command} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(FioRun {
        rate: parse(&out.stdout)?,
        command,
    })
}

/// The engine's shape on a file of `file_bytes` in `dir`, `seconds` per
/// writer depth: a reader job and a writer job at once on the same file
/// (see the module docs), once with the writer one deep and once a batch
/// deep. The file is written once first, outside the measurement, and
/// removed after. Each run's read rate is the reader's, its write rate
/// the writer's, over the same seconds.
pub fn reader_and_writer_on_file(
    dir: &Path,
    file_bytes: u64,
    seconds: u64,
    shape: EngineShape,
) -> Result<Ceilings> {
    let file = Scratch(dir.join(format!("hugevmm-bench-fio-{}.img", std::process::id())));
    reader_and_writer_on(&file.0, file_bytes, seconds, shape)
}

/// [`reader_and_writer_on_file`] on a file that is there (a store's,
/// whose first `file_bytes` it overwrites, once before the measured runs).
pub fn reader_and_writer_on(
    file: &Path,
    file_bytes: u64,
    seconds: u64,
    shape: EngineShape,
) -> Result<Ceilings> {
    let target = [
        "--ioengine=io_uring".to_string(),
        "--direct=1".into(),
        format!("--filename={}", file.display()),
    ];
    let size = file_bytes.to_string();
    run(&target, Pattern::Fill, &size, None).context("writing fio's file once")?;
    let mut runs = Vec::new();
    for depth in shape.write_depths() {
        runs.push((
            depth,
            fio(reader_writer_args(&target, &size, seconds, shape, depth))?,
        ));
    }
    Ok(Ceilings { runs })
}

/// Global options first (they apply to both jobs), then each job's.
fn reader_writer_args(
    target: &[String],
    size: &str,
    seconds: u64,
    shape: EngineShape,
    write_depth: usize,
) -> Vec<String> {
    let mut args = vec![
        format!("--bs={}", shape.block_bytes),
        format!("--size={size}"),
        "--time_based".into(),
        format!("--runtime={seconds}"),
        "--output-format=json".into(),
    ];
    args.extend(target.iter().cloned());
    args.extend([
        "--name=reader".into(),
        "--rw=read".into(),
        format!("--iodepth={}", shape.read_depth),
        "--name=writer".into(),
        "--rw=write".into(),
        format!("--iodepth={write_depth}"),
    ]);
    args
}

/// The rates of fio's JSON output: reads and writes summed over its jobs
/// (one job, or a reader and a writer that ran at the same time).
fn parse(stdout: &[u8]) -> Result<FioRate> {
    // fio may print notes before the JSON object.
    let text = String::from_utf8_lossy(stdout);
    let start = text.find('{').context("no JSON in fio's output")?;
    let v: Value = serde_json::from_str(&text[start..]).context("fio's JSON output")?;
    let jobs = v
        .get("jobs")
        .and_then(Value::as_array)
        .filter(|j| !j.is_empty())
        .context("fio's JSON output has no job")?;
    let rate = |dir: &str| -> Result<f64> {
        jobs.iter()
            .map(|job| {
                job.pointer(&format!("/{dir}/bw_bytes"))
                    .and_then(Value::as_f64)
                    .with_context(|| format!("fio's JSON output has no {dir}/bw_bytes"))
            })
            .sum()
    };
    Ok(FioRate {
        read_bytes_per_s: rate("read")?,
        write_bytes_per_s: rate("write")?,
    })
}

/// A scratch file removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_rates_of_fio_json() {
        let out = br#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"fio version": "fio-3.33", "jobs": [{"jobname": "x", "read": {"bw_bytes": 1048576}, "write": {"bw_bytes": 2097152}}]}"#;
        let r = parse(out).unwrap();
        assert_eq!(r.read_bytes_per_s, 1048576.0);
        assert_eq!(r.total_bytes_per_s(), 3145728.0);
        assert!(parse(b"{\"jobs\": []}").is_err());
        let two = br#"{"jobs": [{"read": {"bw_bytes": 5}, "write": {"bw_bytes": 0}}, {"read": {"bw_bytes": 0}, "write": {"bw_bytes": 7}}]}"#;
        let r = parse(two).unwrap();
        assert_eq!((r.read_bytes_per_s, r.write_bytes_per_s), (5.0, 7.0));
    }

    #[test]
    fn the_shape_is_the_engines() {
        let shape = EngineShape::of_engine();
        assert_eq!(shape.block_bytes, 2 << 20);
        assert_eq!(
            shape.write_depth_max, 8,
            "the evictor's batch of 2 MiB units"
        );
        assert_eq!(shape.write_depths(), [1, 8]);
        assert_eq!(shape.read_depth, 1, "one fault-service thread by default");
        let args = reader_writer_args(&["--filename=f".into()], "64M", 3, shape, 8);
        let reader = args.iter().position(|a| a == "--name=reader").unwrap();
        let writer = args.iter().position(|a| a == "--name=writer").unwrap();
        assert_eq!(&args[reader + 1..writer], ["--rw=read", "--iodepth=1"]);
        assert_eq!(&args[writer + 1..], ["--rw=write", "--iodepth=8"]);
        assert!(args[..reader].contains(&"--bs=2097152".to_string()));
        assert!(args[..reader].contains(&"--filename=f".to_string()));
    }

    #[test]
    fn measures_a_file_when_fio_is_here() {
        if let Some(why) = unavailable() {
            test_resources::skip(
                "measures_a_file_when_fio_is_here",
                test_resources::Resource::Fio,
                why,
            );
            return;
        }
        let dir = std::env::temp_dir();
        let c = reader_and_writer_on_file(&dir, 64 << 20, 1, EngineShape::of_engine()).unwrap();
        assert_eq!(c.runs.iter().map(|(d, _)| *d).collect::<Vec<_>>(), [1, 8]);
        for (depth, run) in &c.runs {
            assert!(
                run.rate.read_bytes_per_s > 0.0 && run.rate.write_bytes_per_s > 0.0,
                "both jobs ran at once, writer {depth} deep: {:?} ({})",
                run.rate,
                run.command
            );
        }
        assert!(c.read_bytes_per_s() >= c.runs[0].1.rate.read_bytes_per_s);
    }
}

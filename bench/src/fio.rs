//! Reference ceilings from `fio` (Debian's package), run in the same
//! invocation as the VM runs they judge, interleaved with them.
//!
//! The pattern is the one a swapping VM gives its store: 2 MiB requests,
//! reads and writes at once (half each), walking the file's 2 MiB slots in
//! order, `O_DIRECT`, through io_uring with as many in flight as the
//! engine's eviction batch. In order, not at random: the engine writes
//! evicted chunks to the lowest free slots in batches of adjacent ones and
//! a guest's passes read them back in the order they went out. On this
//! project's virtual disk the ordered pattern is the faster one (3 s runs
//! alternated: 1.8-2.0 GiB/s against 1.6-1.7 for `randrw`), so a
//! `randrw` ceiling would flatter the engine. `limits` measures its own
//! ceilings through `blockio`, the code under test; fio is an independent
//! tool, so a figure divided by it cannot flatter the engine's own I/O
//! path.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Requests in flight: the engine's eviction batch (8 units of 2 MiB).
pub const QUEUE_DEPTH: usize = 8;

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

/// The mixed pattern on a file of `file_bytes` in `dir` for `seconds`:
/// the file is written once first (outside the measurement: a store's
/// slots hold data once it swaps, and first writes to a file's unwritten
/// extents cost the filesystem more) and removed after.
pub fn mixed_2m_on_file(dir: &Path, file_bytes: u64, seconds: u64) -> Result<FioRun> {
    let file = Scratch(dir.join(format!("hugevmm-bench-fio-{}.img", std::process::id())));
    let target = [
        "--ioengine=io_uring".to_string(),
        "--direct=1".into(),
        format!("--filename={}", file.0.display()),
    ];
    let size = file_bytes.to_string();
    run(&target, Pattern::Fill, &size, None).context("writing fio's file once")?;
    run(&target, Pattern::Mixed, &size, Some(seconds))
}

/// The rates of fio's JSON output (its first job).
fn parse(stdout: &[u8]) -> Result<FioRate> {
    // fio may print notes before the JSON object.
    let text = String::from_utf8_lossy(stdout);
    let start = text.find('{').context("no JSON in fio's output")?;
    let v: Value = serde_json::from_str(&text[start..]).context("fio's JSON output")?;
    let job = v
        .pointer("/jobs/0")
        .context("fio's JSON output has no job")?;
    let rate = |dir: &str| {
        job.pointer(&format!("/{dir}/bw_bytes"))
            .and_then(Value::as_f64)
            .with_context(|| format!("fio's JSON output has no {dir}/bw_bytes"))
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
        let r = mixed_2m_on_file(&dir, 64 << 20, 1).unwrap().rate;
        assert!(
            r.read_bytes_per_s > 0.0 && r.write_bytes_per_s > 0.0,
            "{r:?}"
        );
    }
}

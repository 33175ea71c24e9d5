//! `limits`: the machine's own ceilings, measured in the same invocation as
//! the suites that are judged against them.
//!
//! - O_DIRECT sequential write and read of 2 MiB blocks through
//!   `blockio` (io_uring, 8 in flight like the engine's eviction
//!   batches) on the store directory's filesystem, plus one-at-a-time reads
//!   (what a single fault thread does);
//! - memcpy of 2 MiB blocks from a buffer far larger than the caches;
//! - lz4 and zstd (`swap::store::Codec`, the memory store's code) on a
//!   guest-like chunk and on the chunk the benchmark's own payload writes.

use anyhow::{Context, Result};
use blockio::{AlignedBuf, BlockFile, BlockOp, BlockOptions};
use serde_json::{json, Value};
use std::time::Instant;
use swap::store::Codec;

use super::hist::median;
use super::report::{fmt_f, Table};
use super::runner::{CHUNK_BYTES, GIB};
use super::{interrupt, plots, Ctx, Mode};

/// Requests per batch for the bandwidth passes: the engine's eviction batch.
const QUEUE_DEPTH: usize = 8;

/// The ceilings the other suites divide by.
#[derive(Debug, Clone)]
pub struct Limits {
    /// O_DIRECT 2 MiB sequential write, GiB/s (the better of a pass that
    /// grows the file and one that overwrites it).
    pub disk_write_gibs: f64,
    /// O_DIRECT 2 MiB sequential read, GiB/s, 8 in flight.
    pub disk_read_gibs: f64,
    /// O_DIRECT 2 MiB reads one at a time, GiB/s.
    pub disk_read_qd1_gibs: f64,
    /// Reads and writes at the same time (one stream each, 8 in flight,
    /// as a swapping VM does): each stream's rate while both ran, GiB/s.
    pub disk_mixed_read_gibs: f64,
    /// See `disk_mixed_read_gibs`.
    pub disk_mixed_write_gibs: f64,
    /// memcpy of 2 MiB blocks, GiB/s.
    pub memcpy_gibs: f64,
    /// Compression GiB/s of uncompressed bytes on the seqwrite payload's
    /// chunk content, per codec `[lz4, zstd]`.
    pub compress_gibs: [f64; 2],
    /// Decompression GiB/s of uncompressed bytes, same content.
    pub decompress_gibs: [f64; 2],
}

impl Limits {
    /// Seconds the disk needs, at its measured ceilings, to read and write
    /// these bytes: both streams at once at the rates of the mixed test
    /// until the shorter one is done, the rest of the other alone at its own
    /// ceiling. Divided by a run's wall time this is the fraction of the
    /// disk the run used. (A swapping VM reads and writes at the same time,
    /// and this disk serves the two partly in parallel, so adding the two
    /// alone-times would overstate what it can do.)
    pub fn disk_seconds(&self, read_bytes: f64, written_bytes: f64) -> f64 {
        let (r, w) = (read_bytes / GIB, written_bytes / GIB);
        let (rm, wm) = (
            self.disk_mixed_read_gibs.max(1e-9),
            self.disk_mixed_write_gibs.max(1e-9),
        );
        if r / rm <= w / wm {
            let both = r / rm;
            both + (w - wm * both).max(0.0) / self.disk_write_gibs
        } else {
            let both = w / wm;
            both + (r - rm * both).max(0.0) / self.disk_read_gibs
        }
    }

    /// As [`Limits::disk_seconds`] for a compressed memory store: seconds of
    /// one core's compression and decompression.
    pub fn codec_seconds(&self, codec: Codec, read_bytes: f64, written_bytes: f64) -> f64 {
        let i = codec_index(codec);
        read_bytes / GIB / self.decompress_gibs[i] + written_bytes / GIB / self.compress_gibs[i]
    }

    /// The busy fraction of the store's medium for a run on `store`
    /// (`default`/`file:` → disk, `mem:lz4`/`mem:zstd` → codec).
    pub fn store_fraction(
        &self,
        store: &str,
        read_bytes: f64,
        written_bytes: f64,
        elapsed_s: f64,
    ) -> f64 {
        let seconds = match store {
            "mem:lz4" => self.codec_seconds(Codec::Lz4, read_bytes, written_bytes),
            "mem:zstd" => self.codec_seconds(Codec::Zstd, read_bytes, written_bytes),
            _ => self.disk_seconds(read_bytes, written_bytes),
        };
        seconds / elapsed_s.max(1e-9)
    }
}

fn codec_index(codec: Codec) -> usize {
    match codec {
        Codec::Lz4 => 0,
        Codec::Zstd => 1,
    }
}

/// The chunk the seqwrite payload leaves in guest memory: every 8-byte word
/// is its own guest address XOR a per-pass key. This is what the stores see
/// in every VM run of the bench.
pub fn seqwrite_chunk(gpa: u64, key: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::new(CHUNK_BYTES as usize, 4096);
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&((gpa + 8 * i as u64) ^ key).to_le_bytes());
    }
    buf
}

/// A chunk that looks like an idle Linux guest's memory to a compressor:
/// per 4 KiB page, half are zero, a quarter hold text, a quarter random
/// bytes (xorshift). Deterministic in `seed`.
pub fn guest_like_chunk(seed: u64) -> AlignedBuf {
    const TEXT: &[u8] =
        b"static int init_module(void) { return page_alloc(GFP_KERNEL, order); } /* swap */\n";
    let mut buf = AlignedBuf::new(CHUNK_BYTES as usize, 4096);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (i, page) in buf.chunks_exact_mut(4096).enumerate() {
        match i % 4 {
            0 | 2 => {}
            1 => {
                let skew = (next() % TEXT.len() as u64) as usize;
                for (j, b) in page.iter_mut().enumerate() {
                    *b = TEXT[(j + skew) % TEXT.len()];
                }
            }
            _ => {
                for word in page.chunks_exact_mut(8) {
                    word.copy_from_slice(&next().to_le_bytes());
                }
            }
        }
    }
    buf
}

struct DiskResult {
    engine: &'static str,
    write_grow_gibs: f64,
    write_overwrite_gibs: f64,
    read_gibs: f64,
    read_qd1_gibs: f64,
    read_qd1_ms: Vec<f64>,
    mixed_read_gibs: f64,
    mixed_write_gibs: f64,
}

/// One reader and one writer thread on the same file at once, each 8
/// requests in flight over its own half of it; the rates are taken when
/// the first of the two finishes (after that the other would run alone).
fn mixed(file: &BlockFile, blocks: usize) -> Result<(f64, f64)> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let half = blocks / 2;
    let read_done = AtomicU64::new(0);
    let written_done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let first_end: std::sync::Mutex<Option<(f64, u64, u64)>> = std::sync::Mutex::new(None);
    let start = Instant::now();
    let finish = || {
        let mut end = first_end.lock().unwrap_or_else(|e| e.into_inner());
        if end.is_none() {
            *end = Some((
                start.elapsed().as_secs_f64(),
                read_done.load(Ordering::SeqCst),
                written_done.load(Ordering::SeqCst),
            ));
        }
        stop.store(true, Ordering::SeqCst);
    };
    let result: Result<()> = std::thread::scope(|scope| {
        let reader = scope.spawn(|| -> Result<()> {
            let mut bufs: Vec<AlignedBuf> = (0..QUEUE_DEPTH)
                .map(|_| AlignedBuf::new(CHUNK_BYTES as usize, 4096))
                .collect();
            for first in (0..half).step_by(QUEUE_DEPTH) {
                if stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let n = (first + QUEUE_DEPTH).min(half) - first;
                read_blocks(file, &mut bufs[..n], first, "O_DIRECT read (mixed) failed")?;
                read_done.fetch_add(n as u64 * CHUNK_BYTES, Ordering::SeqCst);
            }
            finish();
            Ok(())
        });
        let writer = scope.spawn(|| -> Result<()> {
            let bufs: Vec<AlignedBuf> = (0..QUEUE_DEPTH)
                .map(|i| seqwrite_chunk(i as u64 * CHUNK_BYTES, 0x0bad_cafe))
                .collect();
            for first in (half..2 * half).step_by(QUEUE_DEPTH) {
                if stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let n = (first + QUEUE_DEPTH).min(2 * half) - first;
                let mut ops: Vec<BlockOp<'_>> = (0..n)
                    .map(|i| BlockOp::Write {
                        offset: (first + i) as u64 * CHUNK_BYTES,
                        buf: &bufs[i],
                    })
                    .collect();
                for r in file.submit(&mut ops) {
                    r.context("O_DIRECT write (mixed) failed")?;
                }
                written_done.fetch_add(n as u64 * CHUNK_BYTES, Ordering::SeqCst);
            }
            finish();
            Ok(())
        });
        reader
            .join()
            .map_err(|_| anyhow::anyhow!("mixed-I/O reader panicked"))??;
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("mixed-I/O writer panicked"))??;
        Ok(())
    });
    result?;
    let (t, r, w) = first_end
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or((1.0, 0, 0));
    Ok((r as f64 / GIB / t.max(1e-9), w as f64 / GIB / t.max(1e-9)))
}

fn disk(ctx: &Ctx, total_bytes: u64) -> Result<DiskResult> {
    let file =
        BlockFile::temporary_in(&ctx.store_dir, &BlockOptions::default()).with_context(|| {
            format!(
                "cannot open an O_DIRECT file in --store-dir {}; give a directory on a real disk",
                ctx.store_dir.display()
            )
        })?;
    let blocks = (total_bytes / CHUNK_BYTES) as usize;
    // Distinct content per buffer so nothing below could deduplicate.
    let mut bufs: Vec<AlignedBuf> = (0..QUEUE_DEPTH)
        .map(|i| seqwrite_chunk(i as u64 * CHUNK_BYTES, 0x5bd1_e995))
        .collect();
    let write_pass = |file: &BlockFile, bufs: &[AlignedBuf]| -> Result<f64> {
        let t = Instant::now();
        for first in (0..blocks).step_by(QUEUE_DEPTH) {
            let mut ops: Vec<BlockOp<'_>> = (first..(first + QUEUE_DEPTH).min(blocks))
                .map(|b| BlockOp::Write {
                    offset: b as u64 * CHUNK_BYTES,
                    buf: &bufs[b % QUEUE_DEPTH],
                })
                .collect();
            for r in file.submit(&mut ops) {
                r.context("O_DIRECT write in the store directory failed")?;
            }
        }
        Ok(blocks as f64 * CHUNK_BYTES as f64 / GIB / t.elapsed().as_secs_f64())
    };
    let write_grow_gibs = write_pass(&file, &bufs)?;
    interrupt::check()?;
    let write_overwrite_gibs = write_pass(&file, &bufs)?;
    interrupt::check()?;
    let t = Instant::now();
    for first in (0..blocks).step_by(QUEUE_DEPTH) {
        let n = (first + QUEUE_DEPTH).min(blocks) - first;
        read_blocks(
            &file,
            &mut bufs[..n],
            first,
            "O_DIRECT read in the store directory failed",
        )?;
    }
    let read_gibs = blocks as f64 * CHUNK_BYTES as f64 / GIB / t.elapsed().as_secs_f64();
    interrupt::check()?;
    let mut read_qd1_ms = Vec::with_capacity(blocks);
    let t = Instant::now();
    for b in 0..blocks {
        let one = Instant::now();
        file.read_at(b as u64 * CHUNK_BYTES, &mut bufs[0])
            .context("O_DIRECT read failed")?;
        read_qd1_ms.push(one.elapsed().as_secs_f64() * 1e3);
    }
    let read_qd1_gibs = blocks as f64 * CHUNK_BYTES as f64 / GIB / t.elapsed().as_secs_f64();
    interrupt::check()?;
    let (mixed_read_gibs, mixed_write_gibs) = mixed(&file, blocks)?;
    Ok(DiskResult {
        engine: file.engine_name(),
        write_grow_gibs,
        write_overwrite_gibs,
        read_gibs,
        read_qd1_gibs,
        read_qd1_ms,
        mixed_read_gibs,
        mixed_write_gibs,
    })
}

fn memcpy_gibs(total_bytes: u64, min_seconds: f64) -> f64 {
    let src = guest_like_chunk_repeated(total_bytes);
    let mut dst = AlignedBuf::new(total_bytes as usize, 4096);
    // Touch the destination first so page faults are not timed.
    dst.fill(1);
    let chunk = CHUNK_BYTES as usize;
    let mut copied = 0f64;
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < min_seconds {
        for (d, s) in dst.chunks_exact_mut(chunk).zip(src.chunks_exact(chunk)) {
            d.copy_from_slice(s);
        }
        copied += total_bytes as f64;
        std::hint::black_box(&dst[..]);
    }
    copied / GIB / t.elapsed().as_secs_f64()
}

fn guest_like_chunk_repeated(total_bytes: u64) -> AlignedBuf {
    let one = guest_like_chunk(7);
    let mut buf = AlignedBuf::new(total_bytes as usize, 4096);
    for c in buf.chunks_exact_mut(CHUNK_BYTES as usize) {
        c.copy_from_slice(&one);
    }
    buf
}

struct CodecResult {
    compress_gibs: f64,
    decompress_gibs: f64,
    ratio: f64,
}

fn codec_speed(codec: Codec, chunk: &[u8], min_seconds: f64) -> Result<CodecResult> {
    let packed = codec
        .compress(chunk)
        .with_context(|| format!("{codec} compression failed"))?;
    let mut rounds = 0u64;
    let t = Instant::now();
    while rounds < 3 || t.elapsed().as_secs_f64() < min_seconds {
        std::hint::black_box(codec.compress(std::hint::black_box(chunk))?);
        rounds += 1;
    }
    let compress_gibs = rounds as f64 * chunk.len() as f64 / GIB / t.elapsed().as_secs_f64();
    let mut out = vec![0u8; chunk.len()];
    let mut rounds = 0u64;
    let t = Instant::now();
    while rounds < 3 || t.elapsed().as_secs_f64() < min_seconds {
        codec.decompress_into(std::hint::black_box(&packed), &mut out)?;
        rounds += 1;
    }
    let decompress_gibs = rounds as f64 * chunk.len() as f64 / GIB / t.elapsed().as_secs_f64();
    anyhow::ensure!(out[..] == chunk[..], "{codec} round trip changed the data");
    Ok(CodecResult {
        compress_gibs,
        decompress_gibs,
        ratio: chunk.len() as f64 / packed.len() as f64,
    })
}

/// Measures the ceilings with `mode`'s sizes, adding them to the report.
pub fn measure(ctx: &mut Ctx, mode: Mode) -> Result<Limits> {
    let z = Sizes::of(mode);
    ctx.progress.plan(2 + z.disk_reps);
    let d = best_disk(ctx, &z)?;
    interrupt::check()?;
    let memcpy = measure_memcpy(ctx, &z);
    interrupt::check()?;
    let codecs = measure_codecs(ctx, z.min_s)?;
    let limits = Limits {
        disk_write_gibs: d.write_grow_gibs.max(d.write_overwrite_gibs),
        disk_read_gibs: d.read_gibs,
        disk_read_qd1_gibs: d.read_qd1_gibs,
        disk_mixed_read_gibs: d.mixed_read_gibs,
        disk_mixed_write_gibs: d.mixed_write_gibs,
        memcpy_gibs: memcpy,
        compress_gibs: codecs.compress_gibs,
        decompress_gibs: codecs.decompress_gibs,
    };

    let qd1_median_ms = median(&d.read_qd1_ms).unwrap_or(0.0);
    report_json(ctx, mode, &z, &d, &limits, qd1_median_ms, codecs.json);
    let t = table(ctx, &z, &d, &limits, qd1_median_ms, &codecs.rows);
    ctx.report.tables.push(t);
    report_csv(ctx, &d, memcpy, &codecs.rows);
    plot(ctx, &d, memcpy, &codecs.rows)?;
    Ok(limits)
}

/// Sizes of the measurements in one mode.
struct Sizes {
    disk_bytes: u64,
    memcpy_bytes: u64,
    /// Shortest time a rate is measured over, s.
    min_s: f64,
    /// Disk rounds, the best of which is the ceiling.
    disk_reps: usize,
}

impl Sizes {
    fn of(mode: Mode) -> Sizes {
        let (disk_bytes, memcpy_bytes, min_s) = match mode {
            Mode::Quick => (256u64 << 20, 128u64 << 20, 0.3),
            Mode::Full => (1u64 << 30, 512u64 << 20, 1.0),
        };
        // The disk of a virtual machine varies from second to second; a
        // ceiling is the best it did, so full mode takes the best of three.
        let disk_reps = if mode == Mode::Quick { 1 } else { 3 };
        Sizes {
            disk_bytes,
            memcpy_bytes,
            min_s,
            disk_reps,
        }
    }
}

/// The disk rounds, one progress step each; the best of them.
fn best_disk(ctx: &mut Ctx, z: &Sizes) -> Result<DiskResult> {
    let (disk_bytes, disk_reps) = (z.disk_bytes, z.disk_reps);
    let mut d: Option<DiskResult> = None;
    for rep in 1..=disk_reps {
        ctx.progress.start(&format!(
            "O_DIRECT 2 MiB sequential write/read, {} MiB, {QUEUE_DEPTH} in flight #{rep}/{disk_reps}",
            disk_bytes >> 20
        ));
        let r = disk(ctx, disk_bytes)?;
        ctx.progress.done(&format!(
            "write {:.2} GiB/s (growing the file) / {:.2} (overwriting), read {:.2} GiB/s, one-at-a-time read {:.2} GiB/s, both at once {:.2} + {:.2} GiB/s ({} engine)",
            r.write_grow_gibs, r.write_overwrite_gibs, r.read_gibs, r.read_qd1_gibs, r.mixed_read_gibs, r.mixed_write_gibs, r.engine
        ));
        d = Some(match d {
            None => r,
            Some(best) => DiskResult {
                engine: r.engine,
                // The better round as a pair: the two rates of one round
                // belong together.
                mixed_read_gibs: if r.mixed_read_gibs + r.mixed_write_gibs
                    > best.mixed_read_gibs + best.mixed_write_gibs
                {
                    r.mixed_read_gibs
                } else {
                    best.mixed_read_gibs
                },
                mixed_write_gibs: if r.mixed_read_gibs + r.mixed_write_gibs
                    > best.mixed_read_gibs + best.mixed_write_gibs
                {
                    r.mixed_write_gibs
                } else {
                    best.mixed_write_gibs
                },
                write_grow_gibs: best.write_grow_gibs.max(r.write_grow_gibs),
                write_overwrite_gibs: best.write_overwrite_gibs.max(r.write_overwrite_gibs),
                read_gibs: best.read_gibs.max(r.read_gibs),
                read_qd1_gibs: best.read_qd1_gibs.max(r.read_qd1_gibs),
                read_qd1_ms: best.read_qd1_ms.into_iter().chain(r.read_qd1_ms).collect(),
            },
        });
        interrupt::check()?;
    }
    Ok(d.expect("at least one disk round"))
}

/// memcpy of 2 MiB blocks, one progress step.
fn measure_memcpy(ctx: &mut Ctx, z: &Sizes) -> f64 {
    let memcpy_bytes = z.memcpy_bytes;
    ctx.progress.start(&format!(
        "memcpy of 2 MiB blocks over {} MiB",
        memcpy_bytes >> 20
    ));
    let memcpy = memcpy_gibs(memcpy_bytes, z.min_s);
    ctx.progress.done(&format!("{memcpy:.2} GiB/s"));
    memcpy
}

/// lz4 and zstd on the two kinds of chunk.
struct Codecs {
    /// Per codec, per content: the rates and ratio.
    json: serde_json::Map<String, Value>,
    rows: Vec<(Codec, &'static str, CodecResult)>,
    /// On the seqwrite chunk, per codec (`codec_index`).
    compress_gibs: [f64; 2],
    decompress_gibs: [f64; 2],
}

/// The codecs on a guest-like chunk and on the seqwrite payload's chunk,
/// one progress step.
fn measure_codecs(ctx: &mut Ctx, min_s: f64) -> Result<Codecs> {
    ctx.progress
        .start("lz4/zstd on a guest-like chunk and on the seqwrite payload's chunk");
    let contents = [
        ("guest-like", guest_like_chunk(1)),
        ("seqwrite", seqwrite_chunk(1 << 32, 0x2545_f491_4f6c_dd1d)),
    ];
    let mut codec_json = serde_json::Map::new();
    let mut codec_rows = Vec::new();
    let mut compress_gibs = [0.0; 2];
    let mut decompress_gibs = [0.0; 2];
    for codec in [Codec::Lz4, Codec::Zstd] {
        let mut per_content = serde_json::Map::new();
        for (name, chunk) in &contents {
            let r = codec_speed(codec, chunk, min_s / 2.0)?;
            if *name == "seqwrite" {
                compress_gibs[codec_index(codec)] = r.compress_gibs;
                decompress_gibs[codec_index(codec)] = r.decompress_gibs;
            }
            per_content.insert(
                name.to_string(),
                json!({"compress_gibs": r.compress_gibs, "decompress_gibs": r.decompress_gibs, "ratio": r.ratio}),
            );
            codec_rows.push((codec, *name, r));
        }
        codec_json.insert(codec.name().to_string(), Value::Object(per_content));
    }
    ctx.progress.done(&format!(
        "lz4 {:.2}/{:.2} GiB/s, zstd {:.2}/{:.2} GiB/s (compress/decompress, seqwrite chunk)",
        compress_gibs[0], decompress_gibs[0], compress_gibs[1], decompress_gibs[1]
    ));
    Ok(Codecs {
        json: codec_json,
        rows: codec_rows,
        compress_gibs,
        decompress_gibs,
    })
}

/// The suite's key in `results.json`.
fn report_json(
    ctx: &mut Ctx,
    mode: Mode,
    z: &Sizes,
    d: &DiskResult,
    limits: &Limits,
    qd1_median_ms: f64,
    codec_json: serde_json::Map<String, Value>,
) {
    let (disk_bytes, memcpy_bytes, disk_reps, memcpy) = (
        z.disk_bytes,
        z.memcpy_bytes,
        z.disk_reps,
        limits.memcpy_gibs,
    );
    ctx.report.set(
        "limits",
        json!({
            "sizes": {"disk_bytes": disk_bytes, "memcpy_bytes": memcpy_bytes, "mode": if mode == Mode::Quick { "quick" } else { "full" }},
            "store_dir": ctx.store_dir.display().to_string(),
            "disk": {
                "engine": d.engine,
                "queue_depth": QUEUE_DEPTH,
                "rounds_best_of": disk_reps,
                "write_grow_gibs": d.write_grow_gibs,
                "write_overwrite_gibs": d.write_overwrite_gibs,
                "write_gibs": limits.disk_write_gibs,
                "read_gibs": d.read_gibs,
                "read_qd1_gibs": d.read_qd1_gibs,
                "read_qd1_2m_ms_p50": qd1_median_ms,
                "mixed_read_gibs": d.mixed_read_gibs,
                "mixed_write_gibs": d.mixed_write_gibs,
            },
            "memcpy_2m_gibs": memcpy,
            "codecs": Value::Object(codec_json),
        }),
    );
}

/// The table of the ceilings.
fn table(
    ctx: &Ctx,
    z: &Sizes,
    d: &DiskResult,
    limits: &Limits,
    qd1_median_ms: f64,
    codec_rows: &[(Codec, &'static str, CodecResult)],
) -> Table {
    let (memcpy_bytes, disk_reps, memcpy) = (z.memcpy_bytes, z.disk_reps, limits.memcpy_gibs);
    let mut t = Table::new(
        "limits: this machine's ceilings",
        &["what", "GiB/s", "note"],
    );
    t.row(vec![
        "O_DIRECT write 2 MiB, growing the file".into(),
        fmt_f(d.write_grow_gibs, 2),
        format!("{QUEUE_DEPTH} in flight, {}", d.engine),
    ]);
    t.row(vec![
        "O_DIRECT write 2 MiB, overwriting".into(),
        fmt_f(d.write_overwrite_gibs, 2),
        format!("{QUEUE_DEPTH} in flight"),
    ]);
    t.row(vec![
        "O_DIRECT read 2 MiB".into(),
        fmt_f(d.read_gibs, 2),
        format!("{QUEUE_DEPTH} in flight"),
    ]);
    t.row(vec![
        "O_DIRECT read 2 MiB, one at a time".into(),
        fmt_f(d.read_qd1_gibs, 2),
        format!("p50 {qd1_median_ms:.2} ms per 2 MiB"),
    ]);
    t.row(vec![
        "O_DIRECT read + write 2 MiB at once".into(),
        fmt_f(d.mixed_read_gibs + d.mixed_write_gibs, 2),
        format!(
            "read {:.2} + write {:.2}, one stream each",
            d.mixed_read_gibs, d.mixed_write_gibs
        ),
    ]);
    t.row(vec![
        "memcpy 2 MiB blocks".into(),
        fmt_f(memcpy, 2),
        format!("{} MiB working set", memcpy_bytes >> 20),
    ]);
    for (codec, content, r) in codec_rows {
        t.row(vec![
            format!("{codec} compress, {content} chunk"),
            fmt_f(r.compress_gibs, 2),
            format!("ratio {:.2}", r.ratio),
        ]);
        t.row(vec![
            format!("{codec} decompress, {content} chunk"),
            fmt_f(r.decompress_gibs, 2),
            "one core".into(),
        ]);
    }
    t.note(&format!(
        "store directory {}; disk figures are the best of {disk_reps} round(s); the other suites time their store I/O with these: both streams at once at {:.2} (read) and {:.2} (write) GiB/s, the rest alone at {:.2} (read) or {:.2} (write) GiB/s",
        ctx.store_dir.display(),
        limits.disk_mixed_read_gibs,
        limits.disk_mixed_write_gibs,
        limits.disk_read_gibs,
        limits.disk_write_gibs
    ));
    t
}

/// One CSV line per measured value.
fn report_csv(
    ctx: &mut Ctx,
    d: &DiskResult,
    memcpy: f64,
    codec_rows: &[(Codec, &'static str, CodecResult)],
) {
    for (codec, content, r) in codec_rows {
        for (metric, v) in [
            ("compress_gibs", r.compress_gibs),
            ("decompress_gibs", r.decompress_gibs),
            ("ratio", r.ratio),
        ] {
            ctx.report.csv(
                "limits",
                &format!("{codec}"),
                content,
                0,
                metric,
                v,
                if metric == "ratio" { "x" } else { "GiB/s" },
            );
        }
    }
    for (metric, v) in [
        ("disk_write_grow_gibs", d.write_grow_gibs),
        ("disk_write_overwrite_gibs", d.write_overwrite_gibs),
        ("disk_read_gibs", d.read_gibs),
        ("disk_read_qd1_gibs", d.read_qd1_gibs),
        ("disk_mixed_read_gibs", d.mixed_read_gibs),
        ("disk_mixed_write_gibs", d.mixed_write_gibs),
        ("memcpy_2m_gibs", memcpy),
    ] {
        ctx.report
            .csv("limits", "machine", "", 0, metric, v, "GiB/s");
    }
}

/// `limits.svg`.
fn plot(
    ctx: &mut Ctx,
    d: &DiskResult,
    memcpy: f64,
    codec_rows: &[(Codec, &'static str, CodecResult)],
) -> Result<()> {
    let mut bars: Vec<plots::Bar> = [
        ("disk write (growing)", d.write_grow_gibs),
        ("disk write (overwriting)", d.write_overwrite_gibs),
        ("disk read", d.read_gibs),
        ("disk read, one at a time", d.read_qd1_gibs),
        (
            "disk read + write at once",
            d.mixed_read_gibs + d.mixed_write_gibs,
        ),
    ]
    .into_iter()
    .map(|(label, value)| plots::Bar {
        label: label.into(),
        value,
        series: 0,
    })
    .collect();
    bars.push(plots::Bar {
        label: "memcpy 2 MiB".into(),
        value: memcpy,
        series: 1,
    });
    for (codec, _, r) in codec_rows.iter().filter(|r| r.1 == "seqwrite") {
        bars.push(plots::Bar {
            label: format!("{codec} compress"),
            value: r.compress_gibs,
            series: 2,
        });
        bars.push(plots::Bar {
            label: format!("{codec} decompress"),
            value: r.decompress_gibs,
            series: 2,
        });
    }
    let path = ctx.out_dir.join("limits.svg");
    plots::hbars(
        &path,
        "Ceilings of this machine",
        "GiB/s",
        &bars,
        &[
            "disk, O_DIRECT 2 MiB",
            "memcpy",
            "codec, one core (seqwrite chunk)",
        ],
        false,
    )?;
    ctx.report.plots.push("limits.svg".into());
    Ok(())
}

/// The `limits` suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let l = measure(ctx, ctx.mode)?;
    ctx.limits = Some(l);
    Ok(())
}

/// Reads consecutive 2 MiB blocks starting at block `first` into `bufs`,
/// submitted together.
fn read_blocks(
    file: &BlockFile,
    bufs: &mut [AlignedBuf],
    first: usize,
    what: &'static str,
) -> Result<()> {
    let mut ops: Vec<BlockOp<'_>> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, buf)| BlockOp::Read {
            offset: (first + i) as u64 * CHUNK_BYTES,
            buf,
        })
        .collect();
    for r in file.submit(&mut ops) {
        r.context(what)?;
    }
    Ok(())
}

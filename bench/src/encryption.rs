//! `encryption`: what `--swap-encrypt` costs (docs/ENCRYPTION.md). The
//! strict sequential-write workload of `swap-w-seq` (1 vCPU) on the file store (the
//! default store: an unlinked O_DIRECT file on --store-dir), with
//! encryption off and on, interleaved (off, on, on, off, ...) so that drift
//! of the machine hits both alike; the headline is the ratio of the median
//! guest throughputs, on / off. Beside it, the cipher's own throughput on
//! this machine: AES-256-GCM sealing and opening 2 MiB buffers in this
//! process with the store's own [`swap::store::Sealer`], the ceiling the
//! runs' store I/O is judged against.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::time::Instant;
use swap::store::seal::Place;
use swap::store::{Sealer, SlotId};

use super::hist::median;
use super::report::{fmt_f, Aim, Headline, Table};
use super::runner::{RunResult, RunSpec, CHUNK_BYTES, GIB};
use swap::index::StoreKey;

/// One 2 MiB unit, as a length.
const UNIT: usize = CHUNK_BYTES as usize;
use super::{interrupt, Ctx, Mode};

/// The workload: `swap-w-seq`'s seqwrite, sized per mode.
struct Plan {
    vcpus: u32,
    mem: &'static str,
    mem_limit: &'static str,
    bytes: &'static str,
    passes: u32,
    /// Pairs of runs (one off, one on).
    pairs: usize,
    /// 2 MiB buffers sealed and opened for the cipher's figure.
    cipher_buffers: usize,
}

fn plan(mode: Mode) -> Plan {
    // One vCPU: every pass really swaps the whole working set out and in
    // (swap-w-seq's strict case), so every byte of it goes through the
    // cipher both ways; with 4 vCPUs on 2 cores the vCPUs take turns and a
    // run swaps in only a fifth of that, with 2x spread between runs.
    match mode {
        Mode::Quick => Plan {
            vcpus: 1,
            mem: "256M",
            mem_limit: "128M",
            bytes: "192M",
            passes: 2,
            pairs: 2,
            cipher_buffers: 128,
        },
        Mode::Full => Plan {
            vcpus: 1,
            mem: "1G",
            mem_limit: "512M",
            bytes: "768M",
            passes: 3,
            pairs: 5,
            cipher_buffers: 1024,
        },
    }
}

fn spec(p: &Plan, encrypt: bool, pair: usize) -> RunSpec {
    RunSpec {
        name: format!("encryption-{}-{pair}", if encrypt { "on" } else { "off" }),
        payload: "seqwrite",
        payload_args: format!("bytes={} passes={}", p.bytes, p.passes),
        vcpus: p.vcpus,
        mem: p.mem.into(),
        mem_limit: Some(p.mem_limit.into()),
        store: "default".into(),
        unit: "2m",
        pageout: false,
        encrypt,
        timeline_ms: None,
        timeout_s: 1800.0,
        allow_timeout: false,
        extra_args: Vec::new(),
    }
}

/// The cipher alone: GiB/s of sealing, of opening, and of both in turn
/// (what one unit costs on its way out and back in), over `buffers` 2 MiB
/// buffers of the seqwrite payload's content.
#[derive(Debug, Clone, Copy)]
struct Cipher {
    seal_gibs: f64,
    open_gibs: f64,
    seal_open_gibs: f64,
}

fn measure_cipher(buffers: usize) -> Result<Cipher> {
    let sealer = Sealer::random().context("cannot make a sealing key")?;
    let mut buf = vec![0u8; UNIT];
    // What seqwrite leaves in a chunk: each word its address xor a key.
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&((i as u64 * 8) ^ 0x5eed_0000_0000_0001).to_le_bytes());
    }
    let (mut seal_s, mut open_s) = (0.0, 0.0);
    for i in 0..buffers {
        if i % 64 == 0 {
            interrupt::check()?;
        }
        let at = Place::unit(SlotId::new(i as u32), StoreKey::new((i * UNIT) as u64));
        let t = Instant::now();
        let seal = sealer.seal(at, &mut buf)?;
        seal_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        sealer.open(at, seal, &mut buf)?;
        open_s += t.elapsed().as_secs_f64();
    }
    let gib = (buffers * UNIT) as f64 / GIB;
    Ok(Cipher {
        seal_gibs: gib / seal_s.max(1e-9),
        open_gibs: gib / open_s.max(1e-9),
        seal_open_gibs: gib / (seal_s + open_s).max(1e-9),
    })
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let p = plan(ctx.mode);
    ctx.progress.plan(1 + 2 * p.pairs);
    ctx.progress.start(&format!(
        "AES-256-GCM seal + open of {} x 2 MiB in-process",
        p.cipher_buffers
    ));
    let cipher = measure_cipher(p.cipher_buffers)?;
    ctx.progress.done(&format!(
        "seal {:.2} GiB/s, open {:.2} GiB/s, seal+open {:.2} GiB/s",
        cipher.seal_gibs, cipher.open_gibs, cipher.seal_open_gibs
    ));
    let mut off: Vec<RunResult> = Vec::new();
    let mut on: Vec<RunResult> = Vec::new();
    // Each pair's (off, on) guest MiB/s, for the per-pair ratio.
    let mut pairs: Vec<(Option<f64>, Option<f64>)> = Vec::new();
    for pair in 0..p.pairs {
        pairs.push((None, None));
        // off, on, then on, off: neither always runs first.
        let order = if pair % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for encrypt in order {
            let spec = spec(&p, encrypt, pair);
            let label = format!(
                "seqwrite {} on the file store, encryption {} (pair {})",
                p.bytes,
                if encrypt { "on" } else { "off" },
                pair + 1
            );
            let figure = |r: &RunResult| {
                format!(
                    "{:.0} MiB/s guest, store I/O {:.2} GiB/s",
                    r.throughput_mibs(),
                    r.io_gibs()
                )
            };
            if let Some(r) = ctx.run_vm(&spec, &label, figure)? {
                let last = pairs.last_mut().expect("pushed above");
                if encrypt { &mut last.1 } else { &mut last.0 }.replace(r.throughput_mibs());
                if encrypt { &mut on } else { &mut off }.push(r);
            }
        }
    }
    let mut t = Table::new(
        &format!(
            "encryption: seqwrite {} x {} passes, {} vCPUs, {} RAM held to {}, 2 MiB units, file store (default), interleaved",
            p.bytes, p.passes, p.vcpus, p.mem, p.mem_limit
        ),
        &[
            "encryption",
            "run",
            "guest MiB/s",
            "elapsed s",
            "store faults",
            "evictions",
            "store I/O GiB/s",
            "of cipher seal+open",
        ],
    );
    let mut runs_json: Vec<Value> = Vec::new();
    for (name, runs) in [("off", &off), ("on", &on)] {
        for (i, r) in runs.iter().enumerate() {
            let io = r.io_gibs();
            t.row(vec![
                name.into(),
                (i + 1).to_string(),
                fmt_f(r.throughput_mibs(), 0),
                fmt_f(r.elapsed_s(), 2),
                fmt_f(r.swap("faults/store"), 0),
                fmt_f(r.swap("evictions"), 0),
                fmt_f(io, 2),
                if name == "on" {
                    fmt_f(io / cipher.seal_open_gibs, 2)
                } else {
                    "-".into()
                },
            ]);
            runs_json.push(json!({
                "encryption": name,
                "run": i + 1,
                "throughput_mibs": r.throughput_mibs(),
                "elapsed_s": r.elapsed_s(),
                "store_faults": r.swap("faults/store"),
                "evictions": r.swap("evictions"),
                "io_gibs": io,
                "command": r.spec.command_line(),
            }));
        }
    }
    t.note(&format!(
        "cipher on this machine (AES-256-GCM, ring, 2 MiB buffers, one thread): seal {:.2} GiB/s, open {:.2} GiB/s, seal+open {:.2} GiB/s",
        cipher.seal_gibs, cipher.open_gibs, cipher.seal_open_gibs
    ));
    let med = |runs: &[RunResult]| {
        median(&runs.iter().map(|r| r.throughput_mibs()).collect::<Vec<_>>()).unwrap_or(0.0)
    };
    let ratio = (!off.is_empty() && !on.is_empty()).then(|| med(&on) / med(&off).max(1e-9));
    if let Some(ratio) = ratio {
        t.note(&format!(
            "median guest throughput, on / off: {:.0} / {:.0} MiB/s = {ratio:.3}",
            med(&on),
            med(&off)
        ));
        let per_pair: Vec<f64> = pairs
            .iter()
            .filter_map(|&(off, on)| Some(on? / off?))
            .collect();
        ctx.report.headline.push(Headline::new(
            "encrypt_over_plain",
            "seqwrite on the file store, --swap-encrypt on / off",
            per_pair,
            Some(Aim::AtLeast(0.9)),
            format!(
                "guest MiB/s on over off within each of {} interleaved pairs; cipher seal+open {:.2} GiB/s here",
                p.pairs, cipher.seal_open_gibs
            ),
        ));
    }
    ctx.report.tables.push(t);
    ctx.report.set(
        "encryption",
        json!({
            "cipher": {
                "algorithm": "AES-256-GCM (ring)",
                "buffer_bytes": CHUNK_BYTES,
                "buffers": p.cipher_buffers,
                "seal_gibs": cipher.seal_gibs,
                "open_gibs": cipher.open_gibs,
                "seal_open_gibs": cipher.seal_open_gibs,
            },
            "runs": runs_json,
            "median_off_mibs": (!off.is_empty()).then(|| med(&off)),
            "median_on_mibs": (!on.is_empty()).then(|| med(&on)),
            "ratio_on_over_off": ratio,
        }),
    );
    Ok(())
}

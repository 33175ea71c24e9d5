//! `swap-w-seq`: seed 000 (vm-scalability case-swap-w-seq) inside the
//! guest. Four vCPUs write a working set 1.5x the memory limit
//! sequentially, several passes, so every pass after the first swaps the
//! whole working set out and in again. The same work runs with 2 MiB and
//! 4 KiB swap units, interleaved (2m, 4k, 2m, 4k, ...) so that drift of
//! the machine hits both alike; the figures are medians. The same is done
//! once per unit with the compressed memory store, and for randwrite
//! (case-swap-w-rand).

use anyhow::Result;
use serde_json::{json, Value};

use super::figures::{self, SEED_CASE};
use super::fio::{self, Ceilings, EngineShape};
use super::hist::median;
use super::limits::Limits;
use super::plots::{self, Bar, TimePoint};
use super::report::{fmt_f, Aim, Headline, Table};
use super::runner::{num, RunResult, RunSpec, CHUNK_BYTES, GIB, MIB};
use super::{Ctx, Mode};

/// Sizes of one workload.
#[derive(Debug, Clone)]
struct Workload {
    payload: &'static str,
    vcpus: u32,
    mem: &'static str,
    mem_limit: &'static str,
    bytes: &'static str,
    passes: u32,
    /// Interleaved runs per unit on the file store.
    runs: usize,
    /// Bound on one run, s, if reaching it is a result (randwrite: with
    /// 2 MiB units a random write over more than memory can thrash).
    time_bound_s: Option<f64>,
    /// The payload's arguments when they are not `bytes= passes=` (mixed:
    /// `bytes` is then the guest work for the planned throughput).
    args: Option<&'static str>,
}

impl Workload {
    fn args(&self) -> String {
        match self.args {
            Some(args) => args.into(),
            None => format!("bytes={} passes={}", self.bytes, self.passes),
        }
    }

    fn spec(&self, name: String, unit: &'static str, store: &str, timeline_ms: u64) -> RunSpec {
        RunSpec {
            name,
            payload: self.payload,
            payload_args: self.args(),
            vcpus: self.vcpus,
            mem: self.mem.into(),
            mem_limit: Some(self.mem_limit.into()),
            store: store.into(),
            unit,
            pageout: false,
            encrypt: false,
            timeline_ms: Some(timeline_ms),
            // Generous: a 4 KiB run of the full size takes about two
            // minutes here; a hang must still end.
            timeout_s: self.time_bound_s.unwrap_or(1800.0),
            allow_timeout: self.time_bound_s.is_some(),
            extra_args: Vec::new(),
        }
    }

    fn work_text(&self) -> String {
        format!(
            "{} {} vCPU(s), {} working set split over them, {} passes, --mem {} --mem-limit {}",
            self.payload, self.vcpus, self.bytes, self.passes, self.mem, self.mem_limit
        ) + &self.args.map(|a| format!(" ({a})")).unwrap_or_default()
    }
}

/// Restores from the store a sequential writer needs when nothing it wrote
/// stays in memory from one pass to the next (the working set is larger
/// than the limit): every unit, every pass after the first.
fn ideal_store_faults(w: &Workload, unit: &str) -> f64 {
    let bytes = guestmem::parse_size(w.bytes).unwrap_or(0) as f64;
    let unit_bytes = if unit == "4k" {
        4096.0
    } else {
        CHUNK_BYTES as f64
    };
    (bytes / unit_bytes).floor() * f64::from(w.passes.saturating_sub(1))
}

struct Plan {
    seq: Workload,
    /// seqwrite with one vCPU: nothing competes with it for the two cores,
    /// so every pass really swaps the whole working set (with four vCPUs on
    /// two cores, vCPUs take turns and part of the work runs on memory that
    /// stayed resident).
    strict: Workload,
    rand: Workload,
    /// Scattered hot pages beside a stream (the granularity policy's case).
    mixed: Workload,
    /// Seed 000's own configuration at full size (full mode only; 2m and
    /// auto: a 4 KiB run of it would take about half an hour here).
    seed: Option<Workload>,
    warmup: bool,
    timeline_ms: u64,
}

fn plan(mode: Mode) -> Plan {
    match mode {
        // About 4 min here: 4 KiB runs dominate (~130 us per fault through
        // nested KVM). Three rounds of the seqwrite and mixed cases: their
        // 2m and auto runs last a quarter of a second to a few seconds,
        // and one run of each decided auto over 2m at 1.25 in one report
        // and 0.53 in the next with nothing changed on their path (by
        // hand, alternated, either unit took 0.17-0.67 s: with 4 vCPUs on
        // 2 cores, how much is swapped at all depends on how the vCPUs
        // take turns, 44 to 290 MiB read for the same unit). Randwrite's
        // 2m and 4k runs end at their 20 s bound, so one round.
        Mode::Quick => Plan {
            seq: Workload {
                payload: "seqwrite",
                vcpus: 4,
                mem: "512M",
                mem_limit: "256M",
                bytes: "384M",
                passes: 2,
                runs: 3,
                time_bound_s: None,
                args: None,
            },
            strict: Workload {
                payload: "seqwrite",
                vcpus: 1,
                mem: "256M",
                mem_limit: "128M",
                bytes: "192M",
                passes: 2,
                runs: 3,
                time_bound_s: None,
                args: None,
            },
            rand: Workload {
                payload: "randwrite",
                vcpus: 4,
                mem: "128M",
                mem_limit: "64M",
                bytes: "96M",
                passes: 1,
                runs: 1,
                time_bound_s: Some(20.0),
                args: None,
            },
            mixed: Workload {
                payload: "mixed",
                vcpus: 2,
                mem: "512M",
                mem_limit: "96M",
                // Per vCPU: 64 rounds of 2 MiB of stream + 32 hot pages.
                bytes: "272M",
                passes: 1,
                runs: 3,
                time_bound_s: Some(30.0),
                args: Some("hot=64 stream=128M passes=2"),
            },
            seed: None,
            warmup: false,
            timeline_ms: 50,
        },
        // The seed's 6 GiB over 4 GiB, scaled to this machine: 1.5 GiB over
        // 1 GiB. A 4 KiB run of it takes about two minutes.
        Mode::Full => Plan {
            seq: Workload {
                payload: "seqwrite",
                vcpus: 4,
                mem: "2G",
                mem_limit: "1G",
                bytes: "1536M",
                passes: 4,
                runs: 3,
                time_bound_s: None,
                args: None,
            },
            strict: Workload {
                payload: "seqwrite",
                vcpus: 1,
                mem: "1G",
                mem_limit: "512M",
                bytes: "768M",
                passes: 3,
                runs: 3,
                time_bound_s: None,
                args: None,
            },
            rand: Workload {
                payload: "randwrite",
                vcpus: 4,
                mem: "256M",
                mem_limit: "128M",
                bytes: "192M",
                passes: 1,
                runs: 3,
                time_bound_s: Some(45.0),
                args: None,
            },
            // The split-chunk issue's measurement: 128 hot chunks beside a
            // 512 MiB stream written twice, 2 vCPUs, 1 GiB at 192 MiB.
            mixed: Workload {
                payload: "mixed",
                vcpus: 2,
                mem: "1G",
                mem_limit: "192M",
                bytes: "1152M",
                passes: 1,
                runs: 3,
                time_bound_s: Some(90.0),
                args: Some("hot=128 stream=512M passes=2"),
            },
            // Seed 000: 4 vCPUs writing 6 GiB over a 4 GiB limit, 8 passes
            // (on its own hardware the seed reports 2,408.9 MiB/s for the
            // kernel with PMD swap entries, 584.3 MiB/s without, medians of
            // five; it has no figure for hugevmm).
            seed: Some(Workload {
                payload: "seqwrite",
                vcpus: 4,
                mem: "8G",
                mem_limit: "4G",
                bytes: "6G",
                passes: 8,
                runs: 3,
                time_bound_s: None,
                args: None,
            }),
            warmup: true,
            timeline_ms: 100,
        },
    }
}

/// The figures of one run, as reported.
#[derive(Clone)]
struct RunFigures {
    /// The run reached its time bound: `throughput_mibs` is an upper
    /// bound (the whole work divided by the bound).
    timed_out: bool,
    case: &'static str,
    unit: &'static str,
    store: String,
    run: usize,
    throughput_mibs: f64,
    elapsed_s: f64,
    faults: f64,
    store_faults: f64,
    evictions: f64,
    io_gibs: f64,
    store_fraction: f64,
    /// As `store_fraction`, over the part of the run that swapped: from
    /// the first timeline sample with store I/O to the end. The first pass
    /// fills memory up to the limit without any I/O; that is the
    /// workload's time, not a measure of how well the engine uses the disk.
    swapping_fraction: f64,
    /// Seconds of the run with store I/O.
    swapping_s: f64,
    /// Store bytes read over those seconds.
    swapping_bytes_read: f64,
    /// Store bytes written over those seconds.
    swapping_bytes_written: f64,
    pages_2m_coverage: f64,
    store_p99_ms: f64,
    /// Restores from the store over `ideal_store_faults` (seqwrite only).
    swapped_share: Option<f64>,
    /// Store bytes moved (read + written) per byte of guest work.
    amplification: f64,
    /// Fault latency p50 / p99 / max, us (seed 004: the worst case too).
    fault_p50_us: f64,
    fault_p99_us: f64,
    fault_max_us: f64,
}

/// `(seconds, read bytes, written bytes)` of the run after its first
/// store I/O (the whole run without a timeline).
fn swapping_window(r: &RunResult) -> (f64, f64, f64) {
    let (end_s, end_r, end_w) = (r.elapsed_s(), r.swap("bytes_read"), r.swap("bytes_written"));
    // The sample before the first one with I/O: the I/O started in
    // between, so the window starts there (never later than the I/O).
    let first = r
        .timeline
        .iter()
        .position(|s| num(s, "/swap/bytes_read") + num(s, "/swap/bytes_written") > 0.0);
    match first {
        Some(i) if i > 0 => {
            let s = &r.timeline[i - 1];
            (
                end_s - num(s, "/t_s"),
                end_r - num(s, "/swap/bytes_read"),
                end_w - num(s, "/swap/bytes_written"),
            )
        }
        _ => (end_s, end_r, end_w),
    }
}

impl RunFigures {
    fn of(
        r: &RunResult,
        case: &'static str,
        run: usize,
        limits: &Limits,
        w: &Workload,
    ) -> RunFigures {
        let planned_mib = guest_mib(w) as f64;
        let (swapping_s, win_r, win_w) = swapping_window(r);
        let ideal = ideal_store_faults(w, r.spec.unit);
        RunFigures {
            swapped_share: (w.payload == "seqwrite" && ideal > 0.0)
                .then(|| r.swap("faults/store") / ideal),
            timed_out: r.timed_out,
            swapping_fraction: limits.store_fraction(&r.spec.store, win_r, win_w, swapping_s),
            swapping_s,
            swapping_bytes_read: win_r,
            swapping_bytes_written: win_w,
            case,
            unit: r.spec.unit,
            store: store_name(&r.spec.store).into(),
            run,
            throughput_mibs: if r.timed_out {
                planned_mib / r.elapsed_s().max(1e-9)
            } else {
                r.throughput_mibs()
            },
            elapsed_s: r.elapsed_s(),
            faults: r.swap("faults/total"),
            store_faults: r.swap("faults/store"),
            evictions: r.swap("evictions"),
            io_gibs: r.io_gibs(),
            store_fraction: limits.store_fraction(
                &r.spec.store,
                r.swap("bytes_read"),
                r.swap("bytes_written"),
                r.elapsed_s(),
            ),
            pages_2m_coverage: r.pages_2m_coverage(),
            store_p99_ms: r.source_hist("store").quantile_us(0.99) as f64 / 1000.0,
            // A stopped run reports no guest bytes: no ratio for it.
            amplification: if r.guest_bytes() > 0 {
                r.io_bytes() / r.guest_bytes() as f64
            } else {
                f64::NAN
            },
            fault_p50_us: r.swap("fault_latency_us/p50"),
            fault_p99_us: r.swap("fault_latency_us/p99"),
            fault_max_us: r.swap("fault_latency_us/max"),
        }
    }

    fn json(&self, r: &RunResult) -> Value {
        json!({
            "case": self.case,
            "unit": self.unit,
            "store": self.store,
            "run": self.run,
            "timed_out": self.timed_out,
            "command": r.spec.command_line(),
            "guest_bytes": r.guest_bytes(),
            "throughput_mibs": self.throughput_mibs,
            "elapsed_s": self.elapsed_s,
            "userfaults": self.faults,
            "faults": r.stats["swap"]["faults"],
            "evictions": self.evictions,
            "bytes_read": r.swap("bytes_read"),
            "bytes_written": r.swap("bytes_written"),
            "swap_io_gibs": self.io_gibs,
            "store_busy_fraction": self.store_fraction,
            "store_busy_fraction_while_swapping": self.swapping_fraction,
            "swapping_s": self.swapping_s,
            "swapping_bytes_read": self.swapping_bytes_read,
            "swapping_bytes_written": self.swapping_bytes_written,
            "pages_2m": num(&r.stats, "/kvm/pages_2m"),
            "pages_4k": num(&r.stats, "/kvm/pages_4k"),
            "pages_2m_coverage": self.pages_2m_coverage,
            "restored_huge": r.swap("restored_huge"),
            "restored_split": r.swap("restored_split"),
            "fault_latency_us": r.stats["swap"]["fault_latency_us"],
            "store_fault_p99_ms": self.store_p99_ms,
            "store_faults": self.store_faults,
            "swapped_in_share_of_ideal": self.swapped_share,
            "raw_stats": format!("runs/{}.json", r.spec.name),
        })
    }

    fn csv(&self, ctx: &mut Ctx) {
        let variant = format!("{} {}", self.unit, self.store);
        for (metric, v, unit) in [
            ("throughput_mibs", self.throughput_mibs, "MiB/s"),
            ("elapsed_s", self.elapsed_s, "s"),
            ("userfaults", self.faults, "count"),
            ("store_faults", self.store_faults, "count"),
            ("evictions", self.evictions, "count"),
            ("swap_io_gibs", self.io_gibs, "GiB/s"),
            ("store_busy_fraction", self.store_fraction, "fraction"),
            (
                "store_busy_fraction_while_swapping",
                self.swapping_fraction,
                "fraction",
            ),
            ("pages_2m_coverage", self.pages_2m_coverage, "fraction"),
            ("store_fault_p99_ms", self.store_p99_ms, "ms"),
            (
                "swapped_in_share_of_ideal",
                self.swapped_share.unwrap_or(0.0),
                "fraction",
            ),
        ] {
            ctx.report
                .csv("swap-w-seq", self.case, &variant, self.run, metric, v, unit);
        }
    }

    fn cells(&self) -> Vec<String> {
        vec![
            format!("{} {} {} #{}", self.case, self.unit, self.store, self.run),
            if self.timed_out {
                format!("<{}", fmt_f(self.throughput_mibs, 1))
            } else {
                fmt_f(self.throughput_mibs, 1)
            },
            fmt_f(self.elapsed_s, 2),
            format!("{:.0}", self.faults),
            format!("{:.0}", self.evictions),
            self.swapped_share
                .map(|v| format!("{:.0}%", v * 100.0))
                .unwrap_or_else(|| "-".into()),
            fmt_f(self.io_gibs, 3),
            fmt_f(self.store_fraction, 2),
            fmt_f(self.swapping_fraction, 2),
            format!("{:.0}%", self.pages_2m_coverage * 100.0),
        ]
    }
}

fn store_name(spec: &str) -> &str {
    if spec == "default" {
        "file"
    } else {
        spec
    }
}

fn key_figure(r: &RunResult) -> String {
    if r.timed_out {
        return format!(
            "did not finish in {:.0} s (thrashing: {:.0} restores from the store); throughput below the work / {:.0} s",
            r.spec.timeout_s,
            r.swap("faults/store"),
            r.spec.timeout_s
        );
    }
    format!(
        "{:.1} MiB/s, {:.2} s, {:.0} userfaults, swap I/O {:.2} GiB/s",
        r.throughput_mibs(),
        r.elapsed_s(),
        r.swap("faults/total"),
        r.io_gibs()
    )
}

fn timeline_points(r: &RunResult) -> Vec<TimePoint> {
    r.timeline
        .iter()
        .map(|s| TimePoint {
            t_s: num(s, "/t_s"),
            resident_mib: num(s, "/swap/resident_bytes") / MIB,
            faults: num(s, "/swap/faults/total"),
            store_faults: num(s, "/swap/faults/store"),
            io_mib: (num(s, "/swap/bytes_read") + num(s, "/swap/bytes_written")) / MIB,
        })
        .collect()
}

/// Medians of a group of runs (same case, unit, store).
struct Group {
    case: &'static str,
    unit: &'static str,
    store: String,
    runs: usize,
    timed_out: usize,
    throughput_mibs: f64,
    elapsed_s: f64,
    faults: f64,
    io_gibs: f64,
    store_fraction: f64,
    swapping_fraction: f64,
    coverage: f64,
    swapped_share: Option<f64>,
    amplification: f64,
    fault_p50_us: f64,
    fault_p99_us: f64,
    /// The worst fault of all the group's runs.
    fault_max_us: f64,
}

fn groups(figs: &[RunFigures]) -> Vec<Group> {
    let mut keys: Vec<(&'static str, &'static str, String)> = Vec::new();
    for f in figs {
        let k = (f.case, f.unit, f.store.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(case, unit, store)| {
            let g: Vec<&RunFigures> = figs
                .iter()
                .filter(|f| f.case == case && f.unit == unit && f.store == store)
                .collect();
            let m = |f: fn(&RunFigures) -> f64| {
                median(&g.iter().map(|x| f(x)).collect::<Vec<_>>()).unwrap_or(0.0)
            };
            Group {
                case,
                unit,
                store,
                runs: g.len(),
                timed_out: g.iter().filter(|f| f.timed_out).count(),
                throughput_mibs: m(|f| f.throughput_mibs),
                elapsed_s: m(|f| f.elapsed_s),
                faults: m(|f| f.faults),
                io_gibs: m(|f| f.io_gibs),
                store_fraction: m(|f| f.store_fraction),
                swapping_fraction: m(|f| f.swapping_fraction),
                coverage: m(|f| f.pages_2m_coverage),
                swapped_share: median(
                    &g.iter().filter_map(|f| f.swapped_share).collect::<Vec<_>>(),
                ),
                amplification: median(
                    &g.iter()
                        .map(|f| f.amplification)
                        .filter(|a| a.is_finite())
                        .collect::<Vec<_>>(),
                )
                .unwrap_or(f64::NAN),
                fault_p50_us: m(|f| f.fault_p50_us),
                fault_p99_us: m(|f| f.fault_p99_us),
                fault_max_us: g.iter().map(|f| f.fault_max_us).fold(0.0, f64::max),
            }
        })
        .collect()
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let limits = ctx.limits()?;
    let p = plan(ctx.mode);
    // Asked once: it decides both the planned steps and the fio runs.
    let fio_missing = fio::unavailable();
    let same_work = announce(ctx, &p, fio_missing.is_none());
    let (results, fio_runs) = run_all(ctx, &p, &limits, fio_missing)?;
    if results.is_empty() {
        // Nothing ran (no KVM here, said at the start): no empty tables.
        return Ok(());
    }
    let runs_table = runs_table(ctx, &p, &results, &same_work);
    let figs: Vec<RunFigures> = results.iter().map(|(f, _)| f.clone()).collect();
    let groups = groups(&figs);
    let medians_table = medians_table(ctx, &groups, &limits);
    let suite = suite_json(&p, &same_work, &groups, &results, &fio_runs);
    // The figures come from the suite's JSON, as a results file holds it,
    // so that the docs rendered from that file show the same.
    let headlines = figures::swap_w_seq(&suite);
    let granularity = granularity_table(&groups, &headlines);
    let fio_table = fio_table(&fio_runs, &figs);
    report_headlines(ctx, headlines);
    ctx.report.tables.push(granularity);
    if let Some(t) = fio_table {
        ctx.report.tables.push(t);
    }
    ctx.report.tables.push(medians_table);
    ctx.report.tables.push(runs_table);
    plot(ctx, &p, &results, &groups)?;
    ctx.report.set("swap_w_seq", suite);
    Ok(())
}

/// Plans the progress steps and says what work both units run; returns
/// that sentence (also a note of the tables and a key of the JSON).
fn announce(ctx: &mut Ctx, p: &Plan, with_fio: bool) -> String {
    let units = UNITS.len();
    let seq_runs = units * p.seq.runs + units + usize::from(p.warmup) + units * p.strict.runs;
    let rand_runs = units * p.rand.runs
        + units * p.mixed.runs
        + p.seed.as_ref().map_or(0, |w| SEED_UNITS.len() * w.runs);
    // One fio ceiling before each round of the file-store seqwrite runs.
    let fio_steps = if with_fio { p.seq.runs } else { 0 };
    ctx.progress.plan(seq_runs + rand_runs + fio_steps);
    let same_work = format!(
        "every unit runs the same work: {} (= {} MiB of guest writes per run); seqwrite 1 vCPU: {}; randwrite: {}; mixed: {}",
        p.seq.work_text(),
        guest_mib(&p.seq),
        p.strict.work_text(),
        p.rand.work_text(),
        p.mixed.work_text()
    );
    ctx.progress.note(&same_work);
    same_work
}

/// The units every case runs, interleaved: the two fixed baselines and the
/// granularity policy.
const UNITS: [&str; 3] = ["2m", "4k", "auto"];

/// Every VM run of the suite, in order: the warm-up (full mode), seqwrite
/// on the file store, seqwrite on the compressed memory store, seqwrite
/// with one vCPU, randwrite; units interleaved within each. The fio
/// ceilings come with the round of file-store seqwrite runs they precede.
fn run_all(
    ctx: &mut Ctx,
    p: &Plan,
    limits: &Limits,
    fio_missing: Option<String>,
) -> Result<(Vec<RunOutcome>, Vec<FioRound>)> {
    let mut results: Vec<RunOutcome> = Vec::new();
    let mut fio_runs = Vec::new();
    if let Some(why) = &fio_missing {
        ctx.skip("fio ceilings of swap-w-seq", why);
    }
    let ms = p.timeline_ms;
    if p.warmup {
        // The seed's one warm-up run: the store file's first blocks get
        // allocated, the page cache and THP pool settle. Not counted.
        let mut w = p.seq.clone();
        w.passes = 1;
        let spec = w.spec("swsq-warmup".into(), "2m", "default", ms);
        ctx.run_vm(
            &spec,
            "warm-up: seqwrite 2m file, 1 pass (not counted)",
            key_figure,
        )?;
    }
    let file = Store {
        spec: "default",
        label: "file",
        tag: "file",
    };
    let lz4 = Store {
        spec: "mem:lz4",
        label: "mem:lz4",
        tag: "lz4",
    };
    let mut series = vec![
        ("seqwrite", "seq", &p.seq, &file, p.seq.runs, &UNITS[..]),
        ("seqwrite", "seq", &p.seq, &lz4, 1, &UNITS[..]),
        (
            "seqwrite 1 vCPU",
            "seq1",
            &p.strict,
            &file,
            p.strict.runs,
            &UNITS[..],
        ),
        ("randwrite", "rand", &p.rand, &file, p.rand.runs, &UNITS[..]),
        ("mixed", "mixed", &p.mixed, &file, p.mixed.runs, &UNITS[..]),
    ];
    if let Some(seed) = &p.seed {
        series.push((
            SEED_CASE,
            "seed000",
            seed,
            &file,
            seed.runs,
            &SEED_UNITS[..],
        ));
    }
    for (case, tag, w, store, runs, units) in series {
        for i in 1..=runs {
            if case == "seqwrite" && store.tag == "file" && fio_missing.is_none() {
                // Interleaved with the runs it judges: the disk of a
                // virtual machine varies from minute to minute.
                if let Some(run) = fio_step(ctx, p, i, runs)? {
                    fio_runs.push(FioRound { round: i, run });
                }
            }
            for unit in round_order(units, i) {
                let spec = w.spec(
                    format!("swsq-{tag}-{unit}-{}-{i}", store.tag),
                    unit,
                    store.spec,
                    ms,
                );
                let label = format!("{case} {unit} {} #{i}/{runs}", store.label);
                if let Some(r) = ctx.run_vm(&spec, &label, key_figure)? {
                    results.push((RunFigures::of(&r, case, i, limits, w), r));
                }
            }
        }
    }
    Ok((results, fio_runs))
}

/// The units of round `round` (from 1), rotated one place per round so
/// that each unit leads a round (the one right after a fio measurement or
/// another case's runs). What ran just before a run also matters through
/// the host's memory (see `prime`), which the priming evens out.
fn round_order<'a>(units: &[&'a str], round: usize) -> Vec<&'a str> {
    let mut order = units.to_vec();
    if !units.is_empty() {
        order.rotate_left(round.saturating_sub(1) % units.len());
    }
    order
}

/// The units the seed 000 row runs.
const SEED_UNITS: [&str; 2] = ["2m", "auto"];

/// A VM run: its figures and its raw result.
type RunOutcome = (RunFigures, RunResult);

/// Seconds of each fio run.
fn fio_seconds(p: &Plan) -> u64 {
    if p.warmup {
        10
    } else {
        3
    }
}

/// fio's ceilings, and the round of seqwrite runs they came before.
struct FioRound {
    round: usize,
    run: Ceilings,
}

/// One fio measurement of the store's filesystem as a progress step;
/// `None` (reported as a failure) when fio fails.
fn fio_step(ctx: &mut Ctx, p: &Plan, i: usize, runs: usize) -> Result<Option<Ceilings>> {
    let seconds = fio_seconds(p);
    let shape = EngineShape::of_engine();
    ctx.progress
        .start(&format!("{}, {seconds} s each #{i}/{runs}", shape.text()));
    // A file of the size of the store the runs use (guest RAM), so that
    // the offsets spread as the engine's slots do.
    let file_bytes = guestmem::parse_size(p.seq.mem).unwrap_or(2 << 30);
    match fio::reader_and_writer_on_file(&ctx.store_dir, file_bytes, seconds, shape) {
        Ok(run) => {
            ctx.progress.done(
                &run.runs
                    .iter()
                    .map(|(depth, r)| {
                        format!(
                            "writer {depth} deep: read {:.2} + write {:.2} GiB/s",
                            r.rate.read_bytes_per_s / GIB,
                            r.rate.write_bytes_per_s / GIB
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            );
            Ok(Some(run))
        }
        Err(e) => {
            let msg = format!("{e:#}");
            ctx.progress.failed(&msg);
            ctx.report.failures.push(format!("fio ceiling #{i}: {msg}"));
            Ok(None)
        }
    }
}

/// Per round: fio's read and write ceilings, and each unit's store read
/// and write rates while it swapped in the seqwrite runs (file store) of
/// that round.
fn fio_table(fio_runs: &[FioRound], figs: &[RunFigures]) -> Option<Table> {
    if fio_runs.is_empty() {
        return None;
    }
    let shape = EngineShape::of_engine();
    let mut t = Table::new(
        "swap-w-seq: fio's read and write ceilings and the engine's rates while swapping (seqwrite 4 vCPUs, file store, GiB/s)",
        &[
            "round",
            "fio read ceiling",
            "fio write ceiling",
            "2m read",
            "2m write",
            "auto read",
            "auto write",
        ],
    );
    for f in fio_runs {
        let mut row = vec![
            f.round.to_string(),
            fmt_f(f.run.read_bytes_per_s() / GIB, 2),
            fmt_f(f.run.write_bytes_per_s() / GIB, 2),
        ];
        for unit in ["2m", "auto"] {
            let run = figs.iter().find(|r| {
                r.case == "seqwrite" && r.store == "file" && r.unit == unit && r.run == f.round
            });
            for bytes in [
                run.map(|r| r.swapping_bytes_read),
                run.map(|r| r.swapping_bytes_written),
            ] {
                row.push(match (bytes, run) {
                    (Some(b), Some(r)) => fmt_f(b / r.swapping_s.max(1e-9) / GIB, 2),
                    _ => "-".into(),
                });
            }
        }
        t.row(row);
    }
    t.note(&shape.text());
    t.note("engine: store bytes read and written per second from the run's first store I/O to its end; each direction is held to fio's rate for the same direction");
    Some(t)
}

/// A store as the runs name it: `--swap-store` value, label in progress
/// lines, tag in run names.
struct Store {
    spec: &'static str,
    label: &'static str,
    tag: &'static str,
}

/// The table of every run (and its CSV lines).
fn runs_table(
    ctx: &mut Ctx,
    p: &Plan,
    results: &[(RunFigures, RunResult)],
    same_work: &str,
) -> Table {
    // Tables, JSON, CSV.
    let mut t = Table::new(
        "swap-w-seq: every run",
        &[
            "run",
            "MiB/s",
            "elapsed s",
            "userfaults",
            "evictions",
            "swapped in",
            "swap I/O GiB/s",
            "of ceiling, run",
            "of ceiling, swapping",
            "2M coverage",
        ],
    );
    for (f, _) in results {
        t.row(f.cells());
        f.csv(ctx);
    }
    t.note(same_work);
    t.note(&format!(
        "randwrite runs stop at {:.0} s: with 2 MiB units a random write to a chunk that is out costs a 2 MiB read and a 2 MiB write, and when the four vCPUs run at once they thrash; a stopped run's MiB/s (<) is the whole work over the bound, an upper bound",
        p.rand.time_bound_s.unwrap_or(0.0)
    ));
    t.note("of ceiling: the store reads and writes timed at the ceilings `limits` measured (disk, or one core's codec), over the run's wall time (run) or over the part after the first store I/O (swapping; the first pass fills memory up to the limit without I/O)");
    t.note("2M coverage: KVM 2 MiB stage-2 mappings per resident 2 MiB chunk at the end");
    t.note("swapped in: restores from the store over what a sequential writer needs when nothing survives from one pass to the next (every unit, every pass after the first); with 4 vCPUs on 2 cores the vCPUs take turns and part of each pass runs on memory still resident");
    t
}

/// The table of the medians per case, unit and store (and their CSV
/// lines).
fn medians_table(ctx: &mut Ctx, groups: &[Group], limits: &Limits) -> Table {
    let mut s = Table::new(
        "swap-w-seq: medians (2m vs 4k, same work)",
        &[
            "case",
            "unit",
            "store",
            "runs",
            "MiB/s",
            "elapsed s",
            "userfaults",
            "swapped in",
            "swap I/O GiB/s",
            "of ceiling, run",
            "of ceiling, swapping",
            "2M coverage",
        ],
    );
    for g in groups {
        s.row(vec![
            g.case.into(),
            g.unit.into(),
            g.store.clone(),
            if g.timed_out > 0 {
                format!("{} ({} stopped)", g.runs, g.timed_out)
            } else {
                g.runs.to_string()
            },
            if g.timed_out > 0 {
                format!("<{}", fmt_f(g.throughput_mibs, 1))
            } else {
                fmt_f(g.throughput_mibs, 1)
            },
            fmt_f(g.elapsed_s, 2),
            format!("{:.0}", g.faults),
            g.swapped_share
                .map(|v| format!("{:.0}%", v * 100.0))
                .unwrap_or_else(|| "-".into()),
            fmt_f(g.io_gibs, 3),
            fmt_f(g.store_fraction, 2),
            fmt_f(g.swapping_fraction, 2),
            format!("{:.0}%", g.coverage * 100.0),
        ]);
        for (metric, v) in [
            ("median_throughput_mibs", g.throughput_mibs),
            ("median_elapsed_s", g.elapsed_s),
            ("median_store_busy_fraction", g.store_fraction),
            (
                "median_store_busy_fraction_while_swapping",
                g.swapping_fraction,
            ),
        ] {
            ctx.report.csv(
                "swap-w-seq",
                g.case,
                &format!("{} {}", g.unit, g.store),
                0,
                metric,
                v,
                if metric.ends_with("_s") {
                    "s"
                } else if metric.ends_with("mibs") {
                    "MiB/s"
                } else {
                    "fraction"
                },
            );
        }
    }
    s.note(&format!(
        "ceilings from limits: disk write {:.2} GiB/s, read {:.2} GiB/s (one at a time {:.2}); lz4 on one core {:.2}/{:.2} GiB/s; memcpy {:.2} GiB/s",
        limits.disk_write_gibs, limits.disk_read_gibs, limits.disk_read_qd1_gibs, limits.compress_gibs[0], limits.decompress_gibs[0], limits.memcpy_gibs
    ));
    s
}

/// The figures (auto against the fixed units, 2m against 4k, the engine
/// against fio's ceilings) and each group's fault latency, as a table.
fn granularity_table(groups: &[Group], headlines: &[Headline]) -> Table {
    let mut t = Table::new(
        "swap-w-seq: the figures (file store; median of the rounds, min-max)",
        &["figure", "median", "min-max", "rounds", "aim", "met"],
    );
    for h in headlines {
        t.row(vec![
            h.what.clone(),
            fmt_f(h.median(), 2),
            format!("{}-{}", fmt_f(h.min(), 2), fmt_f(h.max(), 2)),
            h.values.len().to_string(),
            h.aim.map(Aim::text).unwrap_or_default(),
            h.verdict().into(),
        ]);
    }
    for case in ["seqwrite", "randwrite", "mixed"] {
        for unit in UNITS {
            if let Some(g) = groups
                .iter()
                .find(|g| g.case == case && g.unit == unit && g.store == "file")
            {
                t.row(vec![
                    format!("{case} {unit}: fault p50 / p99 / max us, store bytes per guest byte"),
                    format!(
                        "{:.0} / {:.0} / {:.0}, {}",
                        g.fault_p50_us,
                        g.fault_p99_us,
                        g.fault_max_us,
                        if g.amplification.is_finite() {
                            format!("{:.2}", g.amplification)
                        } else {
                            "- (stopped)".into()
                        }
                    ),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
        }
    }
    t.note("a ratio pairs the runs of one round (the units alternate, one run each per round); the aim is met only when the median of the rounds meets it");
    t.note("fault max is the worst fault of all the runs of the group (seed 004: the worst case, not only the average)");
    t
}

/// The suite's headline figures, their CSV lines and the top-level
/// `ratio_2m_over_4k`.
fn report_headlines(ctx: &mut Ctx, headlines: Vec<Headline>) {
    for h in headlines {
        if h.key == "ratio_2m_over_4k" {
            ctx.report.ratio_2m_over_4k = Some(h.median());
        }
        for (i, v) in h.values.iter().enumerate() {
            ctx.report
                .csv("swap-w-seq", "figure", &h.key, i + 1, &h.key, *v, "x");
        }
        ctx.report
            .csv("swap-w-seq", "figure", &h.key, 0, &h.key, h.median(), "x");
        ctx.report.headline.push(h);
    }
}

/// Plots: throughput per unit and store; one timeline per unit.
fn plot(
    ctx: &mut Ctx,
    p: &Plan,
    results: &[(RunFigures, RunResult)],
    groups: &[Group],
) -> Result<()> {
    let bars: Vec<Bar> = groups
        .iter()
        .map(|g| Bar {
            label: format!("{} {} {}", g.case, g.store, g.unit),
            value: g.throughput_mibs,
            series: UNITS.iter().position(|&u| u == g.unit).unwrap_or(0),
        })
        .collect();
    if !bars.is_empty() {
        plots::hbars(
            &ctx.out_dir.join("throughput.svg"),
            "swap-w-seq: guest writes, median MiB/s (same work per unit)",
            "MiB/s",
            &bars,
            &["2 MiB unit", "4 KiB unit", "auto"],
            true,
        )?;
        ctx.report.plots.push("throughput.svg".into());
    }
    for (case, file_tag, w) in [
        ("seqwrite", "", &p.seq),
        ("seqwrite 1 vCPU", "_1vcpu", &p.strict),
    ] {
        let limit_mib = parse_mib(w.mem_limit);
        for unit in UNITS {
            if let Some((_, r)) = results
                .iter()
                .find(|(f, _)| f.case == case && f.unit == unit && f.store == "file")
            {
                let file = format!("timeline_seqwrite{file_tag}_{unit}.svg");
                plots::timeline(
                    &ctx.out_dir.join(&file),
                    &format!(
                        "{case}, {unit} unit, file store, run #1: memory and faults over time"
                    ),
                    &timeline_points(r),
                    limit_mib,
                )?;
                ctx.report.plots.push(file);
            }
        }
    }

    Ok(())
}

/// The suite's key in `results.json`: the plan, the medians and every
/// run and fio ceiling (what [`figures::swap_w_seq`] derives the figures
/// from).
fn suite_json(
    p: &Plan,
    same_work: &str,
    groups: &[Group],
    results: &[(RunFigures, RunResult)],
    fio_runs: &[FioRound],
) -> Value {
    let shape = EngineShape::of_engine();
    json!({
        "same_work": same_work,
        "seqwrite": {"payload_args": p.seq.args(), "mem": p.seq.mem, "mem_limit": p.seq.mem_limit, "vcpus": p.seq.vcpus, "runs_per_unit": p.seq.runs},
        "randwrite": {"payload_args": p.rand.args(), "mem": p.rand.mem, "mem_limit": p.rand.mem_limit, "vcpus": p.rand.vcpus, "runs_per_unit": p.rand.runs},
        "seqwrite_one_vcpu": {"payload_args": p.strict.args(), "mem": p.strict.mem, "mem_limit": p.strict.mem_limit, "vcpus": 1, "runs_per_unit": p.strict.runs},
        "mixed": {"payload_args": p.mixed.args(), "mem": p.mixed.mem, "mem_limit": p.mixed.mem_limit, "vcpus": p.mixed.vcpus, "runs_per_unit": p.mixed.runs},
        "seed000": p.seed.as_ref().map(|w| json!({"payload_args": w.args(), "mem": w.mem, "mem_limit": w.mem_limit, "vcpus": w.vcpus, "runs_per_unit": w.runs})),
        "medians": groups.iter().map(|g| json!({
            "case": g.case, "unit": g.unit, "store": g.store, "runs": g.runs, "runs_stopped_at_time_bound": g.timed_out,
            "throughput_mibs": g.throughput_mibs, "elapsed_s": g.elapsed_s, "userfaults": g.faults,
            "swap_io_gibs": g.io_gibs, "store_busy_fraction": g.store_fraction,
            "store_busy_fraction_while_swapping": g.swapping_fraction, "pages_2m_coverage": g.coverage,
            "swapped_in_share_of_ideal": g.swapped_share,
        })).collect::<Vec<_>>(),
        "runs": results.iter().map(|(f, r)| f.json(r)).collect::<Vec<_>>(),
        "fio_shape": {
            "text": shape.text(),
            "block_bytes": shape.block_bytes,
            "read_depth": shape.read_depth,
            "write_depths": shape.write_depths(),
        },
        "fio": fio_runs.iter().map(|f| json!({
            "round": f.round,
            "read_bytes_per_s": f.run.read_bytes_per_s(),
            "write_bytes_per_s": f.run.write_bytes_per_s(),
            "runs": f.run.runs.iter().map(|(depth, r)| json!({
                "write_depth": depth,
                "read_bytes_per_s": r.rate.read_bytes_per_s,
                "write_bytes_per_s": r.rate.write_bytes_per_s,
                "command": r.command,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn guest_mib(w: &Workload) -> u64 {
    parse_mib(w.bytes).unwrap_or(0.0) as u64 * u64::from(w.passes)
}

fn parse_mib(size: &str) -> Option<f64> {
    guestmem::parse_size(size).ok().map(|b| b as f64 / MIB)
}

#[cfg(test)]
mod tests {
    use super::round_order;

    #[test]
    fn every_unit_leads_one_round() {
        let units = ["2m", "4k", "auto"];
        let rounds: Vec<Vec<&str>> = (1..=3).map(|i| round_order(&units, i)).collect();
        assert_eq!(rounds[0], ["2m", "4k", "auto"]);
        for round in &rounds {
            let mut sorted = round.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, ["2m", "4k", "auto"], "each unit once per round");
        }
        let firsts: Vec<&str> = rounds.iter().map(|r| r[0]).collect();
        assert_eq!(firsts, ["2m", "4k", "auto"]);
        assert_eq!(
            round_order(&units, 4),
            units,
            "the fourth round starts over"
        );
        assert_eq!(round_order(&["2m", "auto"], 2), ["auto", "2m"]);
    }
}

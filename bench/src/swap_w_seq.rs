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

use super::fio::{self, FioRate};
use super::hist::median;
use super::limits::Limits;
use super::plots::{self, Bar, TimePoint};
use super::report::{fmt_f, Headline, Table};
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
        // About 45 s here: 4 KiB runs dominate (~130 us per fault through
        // nested KVM).
        Mode::Quick => Plan {
            seq: Workload {
                payload: "seqwrite",
                vcpus: 4,
                mem: "512M",
                mem_limit: "256M",
                bytes: "384M",
                passes: 2,
                runs: 1,
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
                runs: 1,
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
                runs: 1,
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
            // (it reports 1,382 MiB/s for hugevmm's 2m unit then, 2,409
            // MiB/s for the guest kernel's own PMD swap on its hardware).
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
    /// Store bytes read and written per second over those seconds.
    swapping_io_bytes_per_s: f64,
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
            swapping_io_bytes_per_s: (win_r + win_w) / swapping_s.max(1e-9),
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
    swapping_io_bytes_per_s: f64,
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
                swapping_io_bytes_per_s: m(|f| f.swapping_io_bytes_per_s),
            }
        })
        .collect()
}

fn ratio(groups: &[Group], case: &str, store: &str) -> Option<f64> {
    let find = |unit: &str| {
        groups
            .iter()
            .find(|g| g.case == case && g.unit == unit && g.store == store)
            .map(|g| g.throughput_mibs)
    };
    match (find("2m"), find("4k")) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let limits = ctx.limits()?;
    let p = plan(ctx.mode);
    // Asked once: it decides both the planned steps and the fio runs.
    let fio_missing = fio::unavailable();
    let same_work = announce(ctx, &p, fio_missing.is_none());
    let (results, fio_rates) = run_all(ctx, &p, &limits, fio_missing)?;
    if results.is_empty() {
        // Nothing ran (no KVM here, said at the start): no empty tables.
        return Ok(());
    }
    let runs_table = runs_table(ctx, &p, &results, &same_work);
    let figs: Vec<RunFigures> = results.iter().map(|(f, _)| f.clone()).collect();
    let groups = groups(&figs);
    let medians_table = medians_table(ctx, &groups, &limits);
    let ratios = Ratios::of(&groups);
    report_headlines(ctx, &p, &groups, &ratios);
    let mut granularity = granularity_table(ctx, &groups);
    fio_rows(ctx, &mut granularity, &groups, &fio_rates);
    ctx.report.tables.push(granularity);
    ctx.report.tables.push(medians_table);
    ctx.report.tables.push(runs_table);
    plot(ctx, &p, &results, &groups)?;
    ctx.report.set(
        "swap_w_seq",
        suite_json(&p, &same_work, &ratios, &groups, &results),
    );
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
/// with one vCPU, randwrite; units interleaved within each.
fn run_all(
    ctx: &mut Ctx,
    p: &Plan,
    limits: &Limits,
    fio_missing: Option<String>,
) -> Result<(Vec<RunOutcome>, Vec<FioRate>)> {
    let mut results: Vec<RunOutcome> = Vec::new();
    let mut fio_rates = Vec::new();
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
                if let Some(rate) = fio_step(ctx, p, i, runs)? {
                    fio_rates.push(rate);
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
    Ok((results, fio_rates))
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

/// The seed 000 row's case name, and the units it runs.
const SEED_CASE: &str = "seed 000: seqwrite 6G over 4G";
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

/// One fio measurement of the store's filesystem as a progress step;
/// `None` (reported as a failure) when fio fails.
fn fio_step(ctx: &mut Ctx, p: &Plan, i: usize, runs: usize) -> Result<Option<FioRate>> {
    let seconds = fio_seconds(p);
    ctx.progress.start(&format!(
        "fio: 2 MiB reads and writes in slot order (half each), {} in flight, O_DIRECT, {seconds} s #{i}/{runs}",
        fio::QUEUE_DEPTH
    ));
    // A file of the size of the store the runs use (guest RAM), so that
    // the offsets spread as the engine's slots do.
    let file_bytes = guestmem::parse_size(p.seq.mem).unwrap_or(2 << 30);
    match fio::mixed_2m_on_file(&ctx.store_dir, file_bytes, seconds).map(|r| r.rate) {
        Ok(rate) => {
            ctx.progress.done(&format!(
                "read {:.2} + write {:.2} GiB/s",
                rate.read_bytes_per_s / GIB,
                rate.write_bytes_per_s / GIB
            ));
            Ok(Some(rate))
        }
        Err(e) => {
            let msg = format!("{e:#}");
            ctx.progress.failed(&msg);
            ctx.report.failures.push(format!("fio ceiling #{i}: {msg}"));
            Ok(None)
        }
    }
}

/// The aim rows against fio's ceiling: each unit's store I/O while it
/// swapped (seqwrite, file store, median) over the median fio rate of the
/// same invocation.
fn fio_rows(ctx: &mut Ctx, t: &mut Table, groups: &[Group], fio_rates: &[FioRate]) {
    let Some(ceiling) = median(
        &fio_rates
            .iter()
            .map(FioRate::total_bytes_per_s)
            .collect::<Vec<_>>(),
    ) else {
        return;
    };
    for (unit, key) in [
        ("2m", "swap_io_over_fio_seqwrite_2m"),
        ("auto", "swap_io_over_fio_seqwrite_auto"),
    ] {
        let Some(g) = groups
            .iter()
            .find(|g| g.case == "seqwrite" && g.unit == unit && g.store == "file")
        else {
            continue;
        };
        let value = g.swapping_io_bytes_per_s / ceiling;
        let what = format!("swap I/O / fio ceiling, seqwrite {unit}");
        let met = value >= 0.8;
        t.row(vec![
            what.clone(),
            format!("{value:.2}"),
            ">= 0.8".into(),
            if met { "yes" } else { "no" }.into(),
        ]);
        ctx.report.headline.push(Headline {
            key,
            what,
            value,
            aim: ">= 0.8",
            met,
            how: format!(
                "store bytes read + written per second while swapping (median) over fio's mixed 2 MiB read+write rate, median of {} fio runs interleaved with the VM runs ({:.2} GiB/s)",
                fio_rates.len(),
                ceiling / GIB
            ),
        });
        ctx.report
            .csv("swap-w-seq", "fio", unit, 0, key, value, "x");
    }
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
            "2m/4k",
        ],
    );
    for g in groups {
        let bound = groups
            .iter()
            .any(|x| x.case == g.case && x.store == g.store && x.timed_out > 0);
        let r = if g.unit == "2m" {
            ratio(groups, g.case, &g.store)
                .map(|r| format!("{}{r:.2}x", if bound { "~" } else { "" }))
                .unwrap_or_default()
        } else {
            String::new()
        };
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
            r,
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

/// The median throughput of one case and unit on the file store.
fn median_mibs(groups: &[Group], case: &str, unit: &str) -> Option<f64> {
    groups
        .iter()
        .find(|g| g.case == case && g.unit == unit && g.store == "file")
        .map(|g| g.throughput_mibs)
}

/// The granularity policy against the fixed units (the aims of the
/// granularity issue), as a table and headlines.
fn granularity_table(ctx: &mut Ctx, groups: &[Group]) -> Table {
    let mut t = Table::new(
        "swap-w-seq: auto against the fixed units (file store, medians)",
        &["figure", "value", "aim", "met"],
    );
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let best_fixed = |case: &str| match (
        median_mibs(groups, case, "2m"),
        median_mibs(groups, case, "4k"),
    ) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mixed_amp = groups
        .iter()
        .find(|g| g.case == "mixed" && g.unit == "auto" && g.store == "file")
        .map(|g| g.amplification);
    let seed = ratio(
        median_mibs(groups, SEED_CASE, "auto"),
        median_mibs(groups, SEED_CASE, "2m"),
    );
    let rows: [(&'static str, &str, Option<f64>, &'static str, bool); 5] = {
        let seq = ratio(
            median_mibs(groups, "seqwrite", "auto"),
            median_mibs(groups, "seqwrite", "2m"),
        );
        let rand = ratio(
            median_mibs(groups, "randwrite", "auto"),
            median_mibs(groups, "randwrite", "4k"),
        );
        let mixed = ratio(median_mibs(groups, "mixed", "auto"), best_fixed("mixed"));
        [
            (
                "auto_over_2m_seqwrite",
                "seqwrite, auto / 2m throughput",
                seq,
                ">= 0.9",
                seq.is_some_and(|r| r >= 0.9),
            ),
            (
                "auto_over_4k_randwrite",
                "randwrite, auto / 4k throughput",
                rand,
                ">= 0.9",
                rand.is_some_and(|r| r >= 0.9),
            ),
            (
                "auto_over_best_mixed",
                "mixed, auto / best of (2m, 4k) throughput",
                mixed,
                ">= 5",
                mixed.is_some_and(|r| r >= 5.0),
            ),
            (
                "store_bytes_per_guest_byte_mixed_auto",
                "store bytes moved per guest byte, mixed, auto",
                mixed_amp,
                "<= 3",
                mixed_amp.is_some_and(|r| r <= 3.0),
            ),
            (
                "auto_over_2m_seed000",
                "seed 000 (6G over 4G, 4 vCPUs), auto / 2m throughput",
                seed,
                ">= 0.9",
                seed.is_some_and(|r| r >= 0.9),
            ),
        ]
    };
    for (key, what, value, aim, met) in rows {
        let Some(value) = value else { continue };
        t.row(vec![
            what.into(),
            format!("{value:.2}"),
            aim.into(),
            if met { "yes" } else { "no" }.into(),
        ]);
        ctx.report.headline.push(Headline {
            key,
            what: what.into(),
            value,
            aim,
            met,
            how: "medians of the interleaved runs of one invocation, file store".into(),
        });
        ctx.report
            .csv("swap-w-seq", "granularity", "auto", 0, key, value, "x");
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
                ]);
            }
        }
    }
    t.note("fault max is the worst fault of all the runs of the group (seed 004: the worst case, not only the average)");
    t
}

/// The 2m/4k throughput ratios of the medians.
struct Ratios {
    seq: Option<f64>,
    rand: Option<f64>,
    lz4: Option<f64>,
    strict: Option<f64>,
}

impl Ratios {
    fn of(groups: &[Group]) -> Ratios {
        Ratios {
            seq: ratio(groups, "seqwrite", "file"),
            rand: ratio(groups, "randwrite", "file"),
            lz4: ratio(groups, "seqwrite", "mem:lz4"),
            strict: ratio(groups, "seqwrite 1 vCPU", "file"),
        }
    }
}

/// The suite's headline figures: the 2m/4k ratios and the disk use while
/// swapping (and the ratio's CSV line).
fn report_headlines(ctx: &mut Ctx, p: &Plan, groups: &[Group], ratios: &Ratios) {
    let seq_ratio = ratios.seq;
    let strict_ratio = ratios.strict;
    ctx.report.ratio_2m_over_4k = seq_ratio;
    if let Some(r) = seq_ratio {
        ctx.report.headline.push(Headline {
            key: "ratio_2m_over_4k",
            what: "swap-w-seq throughput, 2m / 4k units".into(),
            value: r,
            aim: ">= 10",
            met: r >= 10.0,
            how: format!(
                "medians of {} interleaved runs each, seqwrite 4 vCPUs, file store",
                p.seq.runs
            ),
        });
    }
    if let Some(r) = strict_ratio {
        ctx.report.headline.push(Headline {
            key: "ratio_2m_over_4k_one_vcpu",
            what: "same, seqwrite with 1 vCPU (every pass swaps everything)".into(),
            value: r,
            aim: ">= 10",
            met: r >= 10.0,
            how: format!(
                "medians of {} interleaved runs each; {}",
                p.strict.runs,
                p.strict.work_text()
            ),
        });
    }
    // Two rows: the seed's shape (4 vCPUs), where the vCPUs take turns on
    // two cores and much of each pass runs on memory that stayed resident,
    // so the disk idles between bursts of swapping; and one vCPU, where
    // every pass swaps the whole working set, which is what shows whether
    // the engine keeps the disk busy.
    for (case, key, what) in [
        (
            "seqwrite",
            "io_fraction_of_disk",
            "swap I/O / disk bandwidth, seqwrite 2m, 4 vCPUs",
        ),
        (
            "seqwrite 1 vCPU",
            "io_fraction_of_disk_one_vcpu",
            "swap I/O / disk bandwidth, seqwrite 2m, 1 vCPU",
        ),
    ] {
        if let Some(g) = groups
            .iter()
            .find(|g| g.case == case && g.unit == "2m" && g.store == "file")
        {
            ctx.report.headline.push(Headline {
                key,
                what: what.into(),
                value: g.swapping_fraction,
                aim: ">= 0.8",
                met: g.swapping_fraction >= 0.8,
                how: format!(
                    "median; store reads and writes timed at the disk ceilings of `limits` over the time the run swapped (first store I/O to end); over the whole run {:.2}; swapped in {:.0}% of the ideal",
                    g.store_fraction,
                    g.swapped_share.unwrap_or(0.0) * 100.0
                ),
            });
        }
    }
    ctx.report.csv(
        "swap-w-seq",
        "seqwrite",
        "file",
        0,
        "ratio_2m_over_4k",
        seq_ratio.unwrap_or(0.0),
        "x",
    );
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

/// The suite's key in `results.json`.
fn suite_json(
    p: &Plan,
    same_work: &str,
    ratios: &Ratios,
    groups: &[Group],
    results: &[(RunFigures, RunResult)],
) -> Value {
    json!({
        "same_work": same_work,
        "seqwrite": {"payload_args": p.seq.args(), "mem": p.seq.mem, "mem_limit": p.seq.mem_limit, "vcpus": p.seq.vcpus, "runs_per_unit": p.seq.runs},
        "randwrite": {"payload_args": p.rand.args(), "mem": p.rand.mem, "mem_limit": p.rand.mem_limit, "vcpus": p.rand.vcpus, "runs_per_unit": p.rand.runs},
        "ratio_2m_over_4k": ratios.seq,
        "ratio_2m_over_4k_randwrite": ratios.rand,
        "ratio_2m_over_4k_lz4": ratios.lz4,
        "ratio_2m_over_4k_one_vcpu": ratios.strict,
        "seqwrite_one_vcpu": {"payload_args": p.strict.args(), "mem": p.strict.mem, "mem_limit": p.strict.mem_limit, "vcpus": 1, "runs_per_unit": p.strict.runs},
        "medians": groups.iter().map(|g| json!({
            "case": g.case, "unit": g.unit, "store": g.store, "runs": g.runs, "runs_stopped_at_time_bound": g.timed_out,
            "throughput_mibs": g.throughput_mibs, "elapsed_s": g.elapsed_s, "userfaults": g.faults,
            "swap_io_gibs": g.io_gibs, "store_busy_fraction": g.store_fraction,
            "store_busy_fraction_while_swapping": g.swapping_fraction, "pages_2m_coverage": g.coverage,
            "swapped_in_share_of_ideal": g.swapped_share,
        })).collect::<Vec<_>>(),
        "runs": results.iter().map(|(f, r)| f.json(r)).collect::<Vec<_>>(),
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

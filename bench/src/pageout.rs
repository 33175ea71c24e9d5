//! `pageout`: seed 001. The time to evict 256 MiB of resident guest memory
//! to each store (`hugevmm run --pageout`: after the payload wrote 256 MiB,
//! evict every resident chunk and wait for the writes), next to the
//! kernel's `madvise(MADV_PAGEOUT)` of 256 MiB of host memory to a swap
//! file on the same disk (root only).

use anyhow::Result;
use serde_json::{json, Value};

use super::figures;
use super::hist::median;
use super::host_pageout::{self, KernelPageout, Probe, SwapFile};
use super::limits::Limits;
use super::plots::{self, Bar};
use super::report::{fmt_f, Table};
use super::runner::{num, RunResult, RunSpec, MIB};
use super::{interrupt, Ctx, Mode};

const PAGEOUT_MIB: u64 = 256;
const STORES: [&str; 3] = ["default", "mem:lz4", "mem:zstd"];
/// Kernel variants: (name, fill, pages). `seed` is the seed's program as
/// written (memset 0, no madvise); `pattern` writes what the guest holds.
const KERNEL_VARIANTS: [(&str, &str, &str); 3] = [
    ("seed: memset 0, 4 KiB pages", "zero", "plain"),
    ("seqwrite pattern, 4 KiB pages", "pattern", "plain"),
    ("seqwrite pattern, THP", "pattern", "thp"),
];
/// The variant the headline compares with: the same content as the
/// guest's, in the seed's mapping.
const KERNEL_HEADLINE: usize = 1;

fn spec(store: &str, rep: usize) -> RunSpec {
    RunSpec {
        name: format!("pageout-{}-{rep}", store.replace(':', "-")),
        payload: "seqwrite",
        payload_args: format!("bytes={PAGEOUT_MIB}M"),
        vcpus: 1,
        mem: "512M".into(),
        mem_limit: None,
        store: store.into(),
        unit: "2m",
        pageout: true,
        encrypt: false,
        timeline_ms: None,
        timeout_s: 300.0,
        allow_timeout: false,
        extra_args: Vec::new(),
    }
}

fn store_label(store: &str) -> &str {
    if store == "default" {
        "file (O_DIRECT)"
    } else {
        store
    }
}

fn pageout_ms(r: &RunResult) -> f64 {
    num(&r.stats, "/pageout/elapsed_ms")
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let limits = ctx.limits()?;
    let reps = if ctx.mode == Mode::Quick { 1 } else { 3 };
    let (host, host_note) = set_up_host(ctx);
    let zswap = host_pageout::zswap_enabled();
    if host.is_some() && zswap {
        ctx.progress.note("NOTE: zswap is enabled: the kernel compresses into RAM instead of writing the swap file");
    }
    let steps = reps
        * (STORES.len()
            + if host.is_some() {
                KERNEL_VARIANTS.len()
            } else {
                0
            });
    ctx.progress.plan(steps);

    let (vm, kernel) = run_all(ctx, reps, &host)?;
    // Swap off and remove the file now, not at the end of the bench.
    drop(host);

    if vm.is_empty() && kernel.is_empty() {
        return Ok(());
    }
    // Summaries.
    let mut t = Table::new(
        &format!("pageout: evict {PAGEOUT_MIB} MiB of written memory (median of {reps})"),
        &[
            "who",
            "store / variant",
            "ms",
            "MiB/s",
            "of store ceiling",
            "check",
        ],
    );
    let mut bars = Vec::new();
    let (vm_json, vm_file_ms) = summarize_vm(ctx, &limits, &vm, &mut t, &mut bars);
    let (kernel_json, kernel_headline) = summarize_kernel(ctx, &limits, &kernel, &mut t, &mut bars);
    t.note("hugevmm: `pageout.elapsed_ms` = evict every resident chunk and wait for the store writes; resident before includes the VMM's pinned chunk and the payload image");
    t.note("kernel: ms = from the madvise call until /proc/meminfo Writeback is back to its level before it (the writes are done); `call` = the madvise call alone, the seed's figure, which returns once the writes are only submitted");
    if zswap {
        t.note("zswap is enabled on this host: the kernel's pageout compressed into RAM");
    }
    let ratio_json = compare(ctx, &mut t, vm_file_ms, kernel_headline);
    if !bars.is_empty() {
        plots::hbars(
            &ctx.out_dir.join("pageout.svg"),
            &format!("pageout of {PAGEOUT_MIB} MiB: time until written (ms, median)"),
            "ms",
            &bars,
            &["hugevmm --pageout", "kernel MADV_PAGEOUT"],
            false,
        )?;
        ctx.report.plots.push("pageout.svg".into());
    }
    let suite = json!({
        "bytes": PAGEOUT_MIB << 20,
        "hugevmm": vm_json,
        "kernel": kernel_json,
        "headline_variant": KERNEL_VARIANTS[KERNEL_HEADLINE].0,
        "kernel_setup": host_note,
        "zswap_enabled": zswap,
        "ratio_of_medians": ratio_json,
    });
    // The headline from the JSON, as a results file holds it: per
    // repetition, hugevmm's time over the kernel's of the same repetition.
    for h in figures::pageout(&suite) {
        t.note(&format!(
            "{}: median {:.2} (min {:.2}, max {:.2}, {} repetitions), aim {}: {}",
            h.key,
            h.median(),
            h.min(),
            h.max(),
            h.values.len(),
            h.aim.map(|a| a.text()).unwrap_or_default(),
            h.verdict()
        ));
        ctx.report.headline.push(h);
    }
    ctx.report.tables.push(t);
    ctx.report.set("pageout", suite);
    Ok(())
}

/// The host comparison needs root (swapon) and gcc; set it up first so
/// its runs can interleave with hugevmm's. Returns the probe and swap
/// file, if they could be set up, and a note naming the swap file.
fn set_up_host(ctx: &mut Ctx) -> (Option<(Probe, SwapFile)>, String) {
    let mut host: Option<(Probe, SwapFile)> = None;
    let mut host_note = String::new();
    if !ctx.is_root {
        ctx.skip("pageout host comparison", "needs root for swapon");
    } else {
        match Probe::build().and_then(|p| {
            Ok((
                p,
                SwapFile::create(&ctx.store_dir, (2 * PAGEOUT_MIB) << 20)?,
            ))
        }) {
            Ok((p, s)) => {
                host_note = format!(
                    "host swap file {} (512 MiB, priority 32767)",
                    s.path().display()
                );
                ctx.progress.note(&host_note);
                host = Some((p, s));
            }
            Err(e) => ctx.skip("pageout host comparison", &format!("{e:#}")),
        }
    }
    (host, host_note)
}

/// hugevmm pageouts per store (`(store index, run)`) and kernel pageouts
/// per variant (`(variant index, rep, figures)`), interleaved per rep.
#[allow(clippy::type_complexity)]
fn run_all(
    ctx: &mut Ctx,
    reps: usize,
    host: &Option<(Probe, SwapFile)>,
) -> Result<(
    Vec<(usize, usize, RunResult)>,
    Vec<(usize, usize, KernelPageout)>,
)> {
    let mut vm: Vec<(usize, usize, RunResult)> = Vec::new();
    let mut kernel: Vec<(usize, usize, KernelPageout)> = Vec::new();
    for rep in 1..=reps {
        for (si, store) in STORES.iter().enumerate() {
            let label = format!(
                "hugevmm pageout of {PAGEOUT_MIB} MiB to {} #{rep}/{reps}",
                store_label(store)
            );
            let figure = |r: &RunResult| {
                format!(
                    "{:.1} ms ({:.0} MiB resident before, {:.0} MiB written)",
                    pageout_ms(r),
                    num(&r.stats, "/pageout/resident_bytes_before") / MIB,
                    num(&r.stats, "/pageout/written_bytes") / MIB
                )
            };
            if let Some(r) = ctx.run_vm(&spec(store, rep), &label, figure)? {
                vm.push((si, rep, r));
            }
        }
        if let Some((probe, _)) = host {
            for (vi, (name, fill, pages)) in KERNEL_VARIANTS.iter().enumerate() {
                interrupt::check()?;
                ctx.progress.start(&format!(
                    "kernel MADV_PAGEOUT of {PAGEOUT_MIB} MiB, {name} #{rep}/{reps}"
                ));
                match probe.run(PAGEOUT_MIB, fill, pages) {
                    Ok(k) => {
                        ctx.progress.done(&format!(
                            "madvise {:.1} ms, writes done at {:.1} ms; unmapped {:.0}%, swapped {:.0}%{}",
                            k.madvise_ms,
                            k.written_ms,
                            k.unmapped_fraction() * 100.0,
                            k.swapped_fraction() * 100.0,
                            if k.really_paged_out() { "" } else { " — NOT really paged out" }
                        ));
                        kernel.push((vi, rep, k));
                    }
                    Err(e) => {
                        ctx.progress.failed(&format!("{e:#}"));
                        ctx.report
                            .failures
                            .push(format!("kernel pageout {name} #{rep}: {e:#}"));
                    }
                }
            }
        }
    }
    Ok((vm, kernel))
}

/// One table row, CSV lines, a bar and a JSON entry per store; returns
/// the JSON entries and the file store's median.
fn summarize_vm(
    ctx: &mut Ctx,
    limits: &Limits,
    vm: &[(usize, usize, RunResult)],
    t: &mut Table,
    bars: &mut Vec<Bar>,
) -> (Vec<Value>, Option<f64>) {
    let mut vm_json = Vec::new();
    let mut vm_file_ms = None;
    for (si, store) in STORES.iter().enumerate() {
        let runs: Vec<&RunResult> = vm
            .iter()
            .filter(|(i, _, _)| *i == si)
            .map(|(_, _, r)| r)
            .collect();
        let runs_by_rep: Vec<Value> = vm
            .iter()
            .filter(|(i, _, _)| *i == si)
            .map(|(_, rep, r)| json!({"rep": rep, "ms": pageout_ms(r)}))
            .collect();
        if runs.is_empty() {
            continue;
        }
        let ms = median(&runs.iter().map(|r| pageout_ms(r)).collect::<Vec<_>>()).unwrap_or(0.0);
        let written = median(
            &runs
                .iter()
                .map(|r| num(&r.stats, "/pageout/written_bytes"))
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0);
        let before = median(
            &runs
                .iter()
                .map(|r| num(&r.stats, "/pageout/resident_bytes_before"))
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0);
        let after = median(
            &runs
                .iter()
                .map(|r| num(&r.stats, "/pageout/resident_bytes_after"))
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0);
        let fraction = limits.store_fraction(store, 0.0, written, ms / 1e3);
        let rate = written / MIB / (ms / 1e3).max(1e-9);
        if *store == "default" {
            vm_file_ms = Some(ms);
        }
        t.row(vec![
            "hugevmm --pageout".into(),
            store_label(store).into(),
            fmt_f(ms, 1),
            fmt_f(rate, 0),
            fmt_f(fraction, 2),
            format!("{:.0} -> {:.0} MiB resident", before / MIB, after / MIB),
        ]);
        for (i, r) in runs.iter().enumerate() {
            ctx.report.csv(
                "pageout",
                "hugevmm",
                store_label(store),
                i + 1,
                "pageout_ms",
                pageout_ms(r),
                "ms",
            );
        }
        ctx.report.csv(
            "pageout",
            "hugevmm",
            store_label(store),
            0,
            "median_pageout_ms",
            ms,
            "ms",
        );
        bars.push(Bar {
            label: format!("hugevmm, {}", store_label(store)),
            value: ms,
            series: 0,
        });
        vm_json.push(json!({
            "store": store, "runs": runs.len(), "median_ms": ms, "written_bytes": written,
            "resident_bytes_before": before, "resident_bytes_after": after, "mib_per_s": rate,
            "store_busy_fraction": fraction,
            "runs_ms": runs.iter().map(|r| pageout_ms(r)).collect::<Vec<_>>(),
            "runs_by_rep": runs_by_rep,
            "command": spec(store, 1).command_line(),
        }));
    }
    (vm_json, vm_file_ms)
}

/// One table row, CSV lines, a bar and a JSON entry per kernel variant;
/// returns the JSON entries and the headline variant's `(madvise ms,
/// written ms, really paged out)`.
fn summarize_kernel(
    ctx: &mut Ctx,
    limits: &Limits,
    kernel: &[(usize, usize, KernelPageout)],
    t: &mut Table,
    bars: &mut Vec<Bar>,
) -> (Vec<Value>, Option<(f64, f64, bool)>) {
    let mut kernel_json = Vec::new();
    let mut kernel_headline: Option<(f64, f64, bool)> = None;
    for (vi, (name, fill, pages)) in KERNEL_VARIANTS.iter().enumerate() {
        let reps: Vec<usize> = kernel
            .iter()
            .filter(|(i, _, _)| *i == vi)
            .map(|(_, rep, _)| *rep)
            .collect();
        let runs: Vec<&KernelPageout> = kernel
            .iter()
            .filter(|(i, _, _)| *i == vi)
            .map(|(_, _, k)| k)
            .collect();
        if runs.is_empty() {
            continue;
        }
        let madvise = median(&runs.iter().map(|k| k.madvise_ms).collect::<Vec<_>>()).unwrap_or(0.0);
        let written = median(&runs.iter().map(|k| k.written_ms).collect::<Vec<_>>()).unwrap_or(0.0);
        let really = runs.iter().all(|k| k.really_paged_out());
        let unmapped = median(
            &runs
                .iter()
                .map(|k| k.unmapped_fraction())
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0);
        let swapped = median(
            &runs
                .iter()
                .map(|k| k.swapped_fraction())
                .collect::<Vec<_>>(),
        )
        .unwrap_or(0.0);
        let io = *fill == "pattern";
        let fraction = if io {
            limits.disk_seconds(0.0, (PAGEOUT_MIB << 20) as f64) / (written / 1e3).max(1e-9)
        } else {
            0.0
        };
        if vi == KERNEL_HEADLINE {
            kernel_headline = Some((madvise, written, really));
        }
        t.row(vec![
            "kernel MADV_PAGEOUT".into(),
            (*name).into(),
            format!("{} (call {})", fmt_f(written, 1), fmt_f(madvise, 1)),
            if io {
                fmt_f(PAGEOUT_MIB as f64 / (written / 1e3).max(1e-9), 0)
            } else {
                "no I/O".into()
            },
            if io { fmt_f(fraction, 2) } else { "-".into() },
            format!(
                "{} (unmapped {:.0}%, swap used {:.0}%)",
                if really { "paged out" } else { "NOT paged out" },
                unmapped * 100.0,
                swapped * 100.0
            ),
        ]);
        for (i, k) in runs.iter().enumerate() {
            ctx.report.csv(
                "pageout",
                "kernel",
                name,
                i + 1,
                "madvise_ms",
                k.madvise_ms,
                "ms",
            );
            ctx.report.csv(
                "pageout",
                "kernel",
                name,
                i + 1,
                "written_ms",
                k.written_ms,
                "ms",
            );
        }
        bars.push(Bar {
            label: format!("kernel, {name}"),
            value: written,
            series: 1,
        });
        kernel_json.push(json!({
            "variant": name, "fill": fill, "pages": pages, "runs": runs.len(),
            "median_madvise_ms": madvise, "median_written_ms": written,
            "really_paged_out": really, "unmapped_fraction": unmapped, "swapped_fraction": swapped,
            "disk_busy_fraction": if io { Value::from(fraction) } else { Value::Null },
            "runs_detail": runs.iter().zip(&reps).map(|(k, rep)| json!({
                "rep": rep, "really_paged_out": k.really_paged_out(),
                "madvise_ms": k.madvise_ms, "written_ms": k.written_ms, "writeback_timed_out": k.writeback_timed_out,
                "rss_before_kb": k.rss_before_kb, "rss_after_kb": k.rss_after_kb,
                "swapfree_before_kb": k.swapfree_before_kb, "swapfree_after_kb": k.swapfree_after_kb,
                "resident_after_pages": k.resident_after_pages, "anon_huge_before_kb": k.anon_huge_before_kb,
            })).collect::<Vec<_>>(),
        }));
    }
    (kernel_json, kernel_headline)
}

/// hugevmm's file store against the kernel's headline variant, as the
/// ratio of the medians: a table note and a CSV line; returns the ratio's
/// JSON. (The headline pairs the repetitions: `figures::pageout`.)
fn compare(
    ctx: &mut Ctx,
    t: &mut Table,
    vm_file_ms: Option<f64>,
    kernel_headline: Option<(f64, f64, bool)>,
) -> Value {
    let mut ratio_json = json!(null);
    if let (Some(vm_ms), Some((madvise, written, really))) = (vm_file_ms, kernel_headline) {
        let ratio = vm_ms / written.max(1e-9);
        let ratio_call = vm_ms / madvise.max(1e-9);
        t.note(&format!(
            "hugevmm file / kernel ({}), of the medians: {ratio:.2} against the writes done, {ratio_call:.2} against the madvise call alone",
            KERNEL_VARIANTS[KERNEL_HEADLINE].0
        ));
        ratio_json = json!({"hugevmm_over_kernel_written": ratio, "hugevmm_over_kernel_call": ratio_call, "kernel_really_paged_out": really});
        ctx.report.csv(
            "pageout",
            "ratio",
            "hugevmm file / kernel",
            0,
            "ratio",
            ratio,
            "x",
        );
    }
    ratio_json
}

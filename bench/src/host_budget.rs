//! The `host-budget` suite (issue 30, item 5): several VMs with different,
//! changing active sets (the `phases` payload on different heaps) under one
//! memory budget, `hugevmm host` against what an operator does without it,
//! an equal static split (each VM `hugevmm run --mem-limit BUDGET/N`, all
//! at once). Rounds alternate the two, the order swapped every round.
//!
//! Each VM does a fixed amount of work, so its progress is the inverse of
//! its time. Per round: each VM's progress under the host over its
//! progress under the static split (`static s / host s`); the total is
//! their mean (every VM counts alike, whatever its speed); the least one
//! says whether some VM paid for the others.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::report::{Aim, Headline, Table};
use crate::{interrupt, plots, Ctx};

/// One VM of the scenario: name, guest RAM, payload arguments.
struct VmSpec {
    name: &'static str,
    mem: &'static str,
    args: String,
}

/// Whether the self-sizing suite's tiny plan is asked for (a few seconds
/// of work per VM and one round; for the test).
fn tiny() -> bool {
    std::env::var(crate::self_sizing::PLAN_VAR).is_ok_and(|v| v == "tiny")
}

/// The scenario: quick, two VMs under 256 MiB; full, three under 384 MiB.
fn scenario(quick: bool) -> (u64, Vec<VmSpec>) {
    let ops = match (tiny(), quick) {
        (true, _) => 300_000,
        (false, true) => 3_000_000,
        (false, false) => 6_000_000,
    };
    let mut vms = vec![
        // Its large phases (128 MiB of a 512 MiB heap) and the guest's own
        // memory beside them do not fit a fair share of 128 MiB: measured
        // alone on this host (quick ops, auto unit), 90 s at 128 MiB
        // against 4.8 s at 180 MiB. A heap of 384 MiB (large phases of
        // 96 MiB, the scenario until 2026-12-07) fitted its share, 5.6 s
        // at 128 MiB against 5.0 s with no limit: with every set inside
        // its share there was nothing for the host to give, and the aim
        // of 1.25x could not be reached by any division of the budget.
        VmSpec {
            name: "big",
            mem: "576M",
            args: format!("heap=512M phases=6 ops={ops} seed=1"),
        },
        // All of it fits in a fair share, with room to spare.
        VmSpec {
            name: "small",
            mem: "160M",
            args: format!("heap=96M phases=6 ops={ops} seed=2"),
        },
    ];
    if !quick {
        vms.push(VmSpec {
            name: "mid",
            mem: "256M",
            args: format!("heap=192M phases=6 ops={ops} seed=3"),
        });
    }
    let budget_mib = 128 * vms.len() as u64;
    (budget_mib << 20, vms)
}

/// One VM's end in one variant.
#[derive(Debug, Clone)]
struct VmEnd {
    elapsed_s: f64,
    mean_limit_bytes: Option<u64>,
}

/// Runs the suite.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    if let Some(why) = ctx.kvm_unusable.clone() {
        ctx.skip("host-budget", &why);
        return Ok(());
    }
    let quick = ctx.quick();
    let (budget, vms) = scenario(quick);
    let rounds = match (tiny(), quick) {
        (true, _) => 1,
        (false, true) => 2,
        (false, false) => 3,
    };
    let dir = ctx.raw_path("host-budget");
    std::fs::create_dir_all(&dir)?;
    let configs: Vec<PathBuf> = vms
        .iter()
        .map(|vm| {
            let path = dir.join(format!("{}.json", vm.name));
            let config = json!({"payload": "phases", "mem": vm.mem, "payload-args": vm.args});
            std::fs::write(&path, config.to_string())?;
            Ok(path)
        })
        .collect::<Result<_>>()?;
    ctx.progress.plan(rounds * 2);
    let mut rounds_json = Vec::new();
    for round in 0..rounds {
        let host_first = round % 2 == 1;
        let mut ends: [Option<(Vec<VmEnd>, f64)>; 2] = [None, None];
        for step in 0..2 {
            interrupt::check()?;
            let host = (step == 0) == host_first;
            let label = format!(
                "round {} {}",
                round + 1,
                if host { "host" } else { "static" }
            );
            ctx.progress.start(&label);
            let started = Instant::now();
            let result = if host {
                run_host(ctx, &configs, budget, &dir.join(format!("host-{round}"))).map(
                    |(end, report)| {
                        let plot = ctx
                            .out_dir
                            .join(format!("host-budget-round-{}.svg", round + 1));
                        if let Err(e) = plot_host(&report, &plot, round + 1) {
                            ctx.progress.note(&format!("no plot: {e:#}"));
                        }
                        end
                    },
                )
            } else {
                run_static(ctx, &configs, budget, &dir.join(format!("static-{round}")))
            };
            match result {
                Ok(end) => {
                    let wall = started.elapsed().as_secs_f64();
                    ctx.progress.done(&format!("{wall:.1} s"));
                    ends[usize::from(host)] = Some((end, wall));
                }
                Err(e) => {
                    ctx.progress.failed(&format!("{e:#}"));
                    ctx.report
                        .failures
                        .push(format!("host-budget {label}: {e:#}"));
                }
            }
        }
        let (Some((fixed, fixed_wall)), Some((steered, steered_wall))) = (&ends[0], &ends[1])
        else {
            continue;
        };
        rounds_json.push(json!({
            "round": round + 1,
            "host_first": host_first,
            "static_s": fixed.iter().map(|e| e.elapsed_s).collect::<Vec<_>>(),
            "host_s": steered.iter().map(|e| e.elapsed_s).collect::<Vec<_>>(),
            "host_mean_limit_bytes": steered.iter().map(|e| e.mean_limit_bytes).collect::<Vec<_>>(),
            "static_wall_s": fixed_wall,
            "host_wall_s": steered_wall,
        }));
    }
    let suite = json!({
        "budget_bytes": budget,
        "vms": vms.iter().map(|vm| json!({"name": vm.name, "mem": vm.mem, "payload_args": vm.args})).collect::<Vec<_>>(),
        "rounds_planned": rounds,
        "rounds": rounds_json,
    });
    ctx.report.tables.push(table_from_json(&suite));
    ctx.report.headline.extend(headlines(&suite));
    ctx.report.set("host_budget", suite);
    Ok(())
}

/// Per round, each VM's progress under the host over the static split
/// (`static s / host s`, fixed work).
fn ratios(round: &Value) -> Vec<f64> {
    let times = |key: &str| -> Vec<f64> {
        round[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .collect()
    };
    times("static_s")
        .iter()
        .zip(times("host_s"))
        .map(|(f, s)| f / s)
        .collect()
}

fn rounds_of(suite: &Value) -> impl Iterator<Item = &Value> {
    suite["rounds"].as_array().into_iter().flatten()
}

/// The suite's two aims, per round, from its object alone.
pub fn headlines(suite: &Value) -> Vec<Headline> {
    let vms: Vec<&Value> = suite["vms"].as_array().into_iter().flatten().collect();
    let how = format!(
        "{} interleaved rounds, order swapped each round; {}",
        suite["rounds_planned"],
        vms.iter()
            .map(|vm| format!(
                "{}: --mem {} phases {}",
                vm["name"].as_str().unwrap_or(""),
                vm["mem"].as_str().unwrap_or(""),
                vm["payload_args"].as_str().unwrap_or("")
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let per_round: Vec<Vec<f64>> = rounds_of(suite).map(ratios).collect();
    vec![
        Headline::new(
            "host_budget_total_progress",
            "hugevmm host over an equal static split: the VMs' mean progress",
            per_round
                .iter()
                .map(|r| r.iter().sum::<f64>() / r.len() as f64)
                .collect(),
            Some(Aim::AtLeast(1.25)),
            how.clone(),
        ),
        Headline::new(
            "host_budget_least_vm_progress",
            "hugevmm host over an equal static split: the least VM's progress",
            per_round
                .iter()
                .map(|r| r.iter().copied().fold(f64::INFINITY, f64::min))
                .collect(),
            Some(Aim::AtLeast(0.8)),
            how,
        ),
    ]
}

/// The suite's table, from its object alone.
pub fn table_from_json(suite: &Value) -> Table {
    let vms: Vec<&str> = suite["vms"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|vm| vm["name"].as_str().unwrap_or(""))
        .collect();
    let mut t = Table::new(
        &format!(
            "{} VMs (phases) under a budget of {} MiB: hugevmm host against an equal static split",
            vms.len(),
            suite["budget_bytes"].as_u64().unwrap_or(0) >> 20
        ),
        &[
            "round",
            "VM",
            "static s",
            "host s",
            "progress host / static",
            "host mean limit MiB",
        ],
    );
    let mut makespans = Vec::new();
    for round in rounds_of(suite) {
        let r = ratios(round);
        for (i, vm) in vms.iter().enumerate() {
            let at = |key: &str| round[key].get(i).and_then(Value::as_f64);
            t.row(vec![
                round["round"].to_string(),
                vm.to_string(),
                at("static_s").map_or("-".into(), |s| format!("{s:.2}")),
                at("host_s").map_or("-".into(), |s| format!("{s:.2}")),
                r.get(i).map_or("-".into(), |x| format!("{x:.2}")),
                at("host_mean_limit_bytes").map_or("-".into(), |b| format!("{:.0}", b / 1048576.0)),
            ]);
        }
        if let (Some(a), Some(b)) = (
            round["static_wall_s"].as_f64(),
            round["host_wall_s"].as_f64(),
        ) {
            makespans.push(format!("{:.2}", a / b));
        }
    }
    t.note("progress = static s / host s for each VM (fixed work); the static split runs every VM at once with --mem-limit budget/N; the host runs them under hugevmm host --budget (working-set sampling at 2 units/s, its cost included)");
    t.note(&format!(
        "all VMs done, static wall / host wall, per round: {}",
        makespans.join(", ")
    ));
    t
}

/// Each VM's limit and stall over one host run, from the host's report.
fn plot_host(report: &Value, path: &Path, round: usize) -> Result<()> {
    let mut limits: Vec<plots::Series> = Vec::new();
    let mut stalls: Vec<plots::Series> = Vec::new();
    for vm in report["vms"].as_array().into_iter().flatten() {
        let name = vm["name"].as_str().unwrap_or("").to_string();
        let (mut limit, mut stall) = (Vec::new(), Vec::new());
        for sample in report["timeline"].as_array().into_iter().flatten() {
            let t = sample["t_s"].as_f64().unwrap_or(0.0);
            let Some(entry) = sample["vms"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"].as_str() == Some(&name))
            else {
                continue;
            };
            if let Some(b) = entry["limit_bytes"].as_f64() {
                limit.push((t, b / 1048576.0));
            }
            if let Some(s) = entry["stall_share"].as_f64() {
                stall.push((t, s * 100.0));
            }
        }
        limits.push((format!("{name} limit"), limit));
        stalls.push((format!("{name} stall"), stall));
    }
    plots::limits_and_stall(
        path,
        &format!(
            "hugevmm host, budget {} MiB, round {round}",
            report["budget_bytes"].as_u64().unwrap_or(0) >> 20
        ),
        &limits,
        &stalls,
        report["stall_target_pct"].as_f64().unwrap_or(0.0),
        &[],
    )
}

/// Each VM alone at budget/N, all at once.
fn run_static(ctx: &Ctx, configs: &[PathBuf], budget: u64, dir: &Path) -> Result<Vec<VmEnd>> {
    std::fs::create_dir_all(dir)?;
    let share = budget / configs.len() as u64;
    let mut children = Vec::new();
    for (i, config) in configs.iter().enumerate() {
        let stats = dir.join(format!("{i}.stats.json"));
        let out = dir.join(format!("{i}.out"));
        let child = Command::new(&ctx.hugevmm)
            .arg("run")
            .arg("--config")
            .arg(config)
            .arg("--mem-limit")
            .arg(share.to_string())
            .arg("--quiet")
            .arg("--stats-json")
            .arg(&stats)
            .env("TMPDIR", &ctx.store_dir)
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(dir.join(format!("{i}.err")))?)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", ctx.hugevmm.display()))?;
        children.push((child, stats, out));
    }
    let mut ends = Vec::new();
    for (mut child, stats, out) in children {
        let status = child.wait()?;
        ends.push(vm_end(status.code(), &stats, &out, None)?);
    }
    Ok(ends)
}

/// The VMs under `hugevmm host --budget`.
fn run_host(
    ctx: &Ctx,
    configs: &[PathBuf],
    budget: u64,
    dir: &Path,
) -> Result<(Vec<VmEnd>, Value)> {
    let report_path = dir.with_extension("report.json");
    let _ = std::fs::remove_dir_all(dir);
    let mut command = Command::new(&ctx.hugevmm);
    command
        .arg("host")
        .arg("--budget")
        .arg(budget.to_string())
        .arg("--state-dir")
        .arg(dir)
        .arg("--report")
        .arg(&report_path)
        .env("TMPDIR", &ctx.store_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for config in configs {
        command.arg("--vm").arg(config);
    }
    let output = command
        .output()
        .with_context(|| format!("cannot start {} host", ctx.hugevmm.display()))?;
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).with_context(|| {
            format!(
                "hugevmm host wrote no report: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?)?;
    let mut ends = Vec::new();
    for vm in report["vms"].as_array().into_iter().flatten() {
        let path = |key: &str| PathBuf::from(vm[key].as_str().unwrap_or_default());
        ends.push(vm_end(
            vm["exit_status"].as_i64().map(|s| s as i32),
            &path("stats_json"),
            &path("stdout"),
            vm["limit"]["mean_bytes"].as_u64(),
        )?);
    }
    if ends.len() != configs.len() {
        bail!(
            "the host's report names {} VMs, not {}",
            ends.len(),
            configs.len()
        );
    }
    Ok((ends, report))
}

/// A VM's time, once its status, stats and checked data say it ran whole.
fn vm_end(
    status: Option<i32>,
    stats: &Path,
    out: &Path,
    mean_limit_bytes: Option<u64>,
) -> Result<VmEnd> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    if status != Some(0) || !text.contains(" ok") {
        bail!(
            "a VM ended with {status:?} without checking its data (see {})",
            out.display()
        );
    }
    let stats: Value = serde_json::from_str(&std::fs::read_to_string(stats)?)?;
    Ok(VmEnd {
        elapsed_s: stats["elapsed_s"]
            .as_f64()
            .context("no elapsed_s in its stats")?,
        mean_limit_bytes,
    })
}

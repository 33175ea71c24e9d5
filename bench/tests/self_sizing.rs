//! The `self-sizing` suite end to end on its tiny plan (one round of a
//! small phases run with no limit, two fixed limits, auto, auto on long
//! phases and working-set sampling on long phases, then one
//! round of the host budget): every variant gets a row and a record with
//! its phases and timeline, the plots are drawn, and the results file
//! renders the docs' blocks. It asserts no times. It needs KVM and the
//! release `hugevmm` beside the test's `hugevmm-bench` (`cargo build
//! --release -p vmm`; a debug binary works too, named in HUGEVMM_BIN).

mod common;

use test_resources::skip_without_kvm;

const TEST: &str = "self_sizing_tiny_rows_records_plots_and_render";

#[test]
fn self_sizing_tiny_rows_records_plots_and_render() {
    if skip_without_kvm(TEST) {
        return;
    }
    let Some(bin) = common::hugevmm_or_skip(TEST) else {
        return;
    };
    let common::TinyRun { stdout, json, out } = common::run_tiny(
        "self-sizing",
        "HUGEVMM_BENCH_SELF_SIZING_PLAN",
        &bin,
        "sizing",
    );
    common::assert_rows(
        &stdout,
        &[
            "none",
            "fixed-24M",
            "fixed-48M",
            "auto",
            "1      big",
            "1      small",
        ],
    );
    let runs = json["self_sizing"]["runs"]
        .as_array()
        .expect("self_sizing.runs");
    assert_eq!(runs.len(), 6, "{runs:?}");
    for run in runs {
        assert_eq!(run["end"], "ok", "{run}");
        let phases = run["phases"].as_array().expect("phases");
        assert_eq!(phases.len(), 6, "six phases, from the payload: {run}");
        let mut last_end = 0.0;
        for p in phases {
            let (start, end) = (p["start_s"].as_f64().unwrap(), p["end_s"].as_f64().unwrap());
            assert!(
                start >= last_end - 1e-9 && end > start,
                "phases follow one another: {phases:?}"
            );
            last_end = end;
        }
        assert!(
            !run["timeline"].as_array().expect("timeline").is_empty(),
            "{run}"
        );
    }
    let limited = runs.iter().find(|r| r["variant"] == "fixed-24M").unwrap();
    assert!(
        limited["refault_wait_us"].as_f64().unwrap() > 0.0,
        "24 MiB under a 32 MiB heap refaults: {limited}"
    );
    let auto = runs.iter().find(|r| r["variant"] == "auto").unwrap();
    assert!(
        auto["stall_target_pct"].as_f64().is_some(),
        "auto reports its target: {auto}"
    );
    // The follow run: auto on the same phases, each ten times longer.
    let follow = runs.iter().find(|r| r["variant"] == "auto-follow").unwrap();
    let length = |r: &serde_json::Value| {
        r["phases"].as_array().unwrap().last().unwrap()["end_s"]
            .as_f64()
            .unwrap()
    };
    assert!(
        length(follow) > 3.0 * length(auto),
        "the follow run's phases are longer: {follow}"
    );
    // The working-set run: no limit, sampling on, on the long phases,
    // with an estimate over time and the sampling's figures.
    let ws = runs.iter().find(|r| r["variant"] == "working-set").unwrap();
    assert!(length(ws) > 3.0 * length(auto), "long phases: {ws}");
    assert_eq!(ws["working_set"]["sampling"], true, "{ws}");
    assert_eq!(ws["working_set"]["window_ms"], 100, "{ws}");
    assert!(
        ws["working_set"]["samples"].as_u64().unwrap_or(0) > 0,
        "it sampled: {ws}"
    );
    assert!(
        ws["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s[4].as_f64().is_some()),
        "an estimate in its timeline: {ws}"
    );
    let rounds = json["host_budget"]["rounds"]
        .as_array()
        .expect("host rounds");
    assert_eq!(rounds.len(), 1, "{rounds:?}");
    for key in [
        "self_sizing_auto_footprint_over_best_fixed",
        "self_sizing_auto_slowdown_pct",
        "self_sizing_working_set_cost_pct",
        "host_budget_total_progress",
        "host_budget_least_vm_progress",
    ] {
        assert!(
            json["headline"].get(key).is_some(),
            "no headline {key}: {}",
            json["headline"]
        );
    }
    for plot in [
        "self-sizing-auto-1.svg",
        "self-sizing-follow-1.svg",
        "self-sizing-working-set-1.svg",
        "host-budget-round-1.svg",
    ] {
        let text = std::fs::read_to_string(out.join(plot)).unwrap_or_default();
        assert!(text.contains("<svg"), "{plot} is not drawn");
    }
    for block in ["self-sizing", "host-budget"] {
        let text = bench::render::block(&json, block).expect("the block renders");
        assert!(text.contains("| "), "{block}: {text}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

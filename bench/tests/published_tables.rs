//! The result tables of README.md and docs/BENCHMARKS.md are the ones the
//! committed results file renders to, and that file's headline figures
//! are the ones its own runs give. To update both after a new run:
//! `cp bench-results/results.json docs/results/quick.json &&
//! hugevmm bench report --render docs/results/quick.json`. The same holds
//! for docs/KERNEL_BASELINE.md and the committed run of `hugevmm bench
//! workloads` (docs/results/workloads-quick.json), and for
//! docs/SELF_SIZING.md and that of `hugevmm bench self-sizing`
//! (docs/results/self-sizing-quick.json), and for the 4 KiB fault
//! breakdown in docs/BENCHMARKS.md and that of `hugevmm bench fault-4k`
//! (docs/results/fault-4k-quick.json).

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the bench crate lives in the workspace")
        .to_path_buf()
}

fn committed() -> PathBuf {
    repo().join("docs/results/quick.json")
}

#[test]
fn the_docs_tables_are_rendered_from_the_committed_results() {
    let stale = bench::render::stale_docs(&repo(), &committed()).unwrap();
    assert!(
        stale.is_empty(),
        "these tables differ from {}: {}; run `hugevmm bench report --render docs/results/quick.json` from the repository's top directory",
        committed().display(),
        stale.join(", ")
    );
}

#[test]
fn the_committed_headline_is_what_its_runs_give() {
    let results = bench::render::read_results(&committed()).unwrap();
    let mismatched = bench::render::headline_mismatches(&results);
    assert!(
        mismatched.is_empty(),
        "{}: headline figures {mismatched:?} differ from the figures its runs give",
        committed().display()
    );
    let headline = results["headline"].as_object().expect("a headline object");
    for key in [
        "ratio_2m_over_4k",
        "auto_over_2m_seqwrite",
        "p99_over_floor",
    ] {
        assert!(
            headline.contains_key(key),
            "the committed run has no {key}: it must cover the published suites"
        );
    }
}

#[test]
fn the_kernel_baseline_tables_are_rendered_from_the_committed_workloads_run() {
    let committed = repo().join("docs/results/workloads-quick.json");
    let stale = bench::render::stale_docs(&repo(), &committed).unwrap();
    assert!(
        stale.is_empty(),
        "these tables differ from {}: {}; run `hugevmm bench report --render docs/results/workloads-quick.json` from the repository's top directory",
        committed.display(),
        stale.join(", ")
    );
}

#[test]
fn the_self_sizing_tables_are_rendered_from_the_committed_self_sizing_run() {
    let committed = repo().join("docs/results/self-sizing-quick.json");
    let stale = bench::render::stale_docs(&repo(), &committed).unwrap();
    assert!(
        stale.is_empty(),
        "these tables differ from {}: {}; run `hugevmm bench report --render docs/results/self-sizing-quick.json` from the repository's top directory",
        committed.display(),
        stale.join(", ")
    );
    let results = bench::render::read_results(&committed).unwrap();
    for key in ["self_sizing", "host_budget"] {
        assert!(
            results.get(key).is_some(),
            "the committed run has no {key}: it must come from `hugevmm bench self-sizing`"
        );
    }
}

#[test]
fn the_fault_4k_breakdown_is_rendered_from_the_committed_fault_4k_run() {
    let committed = repo().join("docs/results/fault-4k-quick.json");
    let stale = bench::render::stale_docs(&repo(), &committed).unwrap();
    assert!(
        stale.is_empty(),
        "these tables differ from {}: {}; run `hugevmm bench report --render docs/results/fault-4k-quick.json` from the repository's top directory",
        committed.display(),
        stale.join(", ")
    );
    let results = bench::render::read_results(&committed).unwrap();
    let rows = results["fault_4k"]["rows"].as_array().map_or(0, Vec::len);
    assert!(
        rows >= 10,
        "{}: {rows} rows; the published breakdown must be a whole run's",
        committed.display()
    );
}

//! Replays the committed seed corpus and every regression input (the
//! crashes the fuzzer found, fixed since) through the targets, in plain
//! `cargo test`: a fix that regresses fails here without a fuzzing run.

use std::path::{Path, PathBuf};

use hugevmm_fuzz::seeds::seeds;
use hugevmm_fuzz::TARGETS;

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

fn replay(kind: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(kind);
    let mut count = 0;
    for target in TARGETS {
        for file in inputs(&root.join(target.name)) {
            let data = std::fs::read(&file).unwrap();
            println!("{}: {}", target.name, file.display());
            (target.run)(&data);
            count += 1;
        }
    }
    count
}

#[test]
fn the_seed_corpus_runs_clean() {
    assert!(replay("corpus") >= TARGETS.len());
}

#[test]
fn every_regression_input_runs_clean() {
    replay("regressions");
}

#[test]
fn the_committed_seeds_are_the_generated_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for target in TARGETS {
        let generated = seeds(target.name);
        assert!(!generated.is_empty(), "{} has no seeds", target.name);
        for (name, bytes) in generated {
            let file = root.join(target.name).join(format!("seed-{name}"));
            let committed = std::fs::read(&file).unwrap_or_default();
            assert!(
                committed == bytes,
                "{} differs from its generator: run `cargo run -p hugevmm-fuzz --bin hugevmm-fuzz-seeds fuzz/corpus`",
                file.display()
            );
        }
    }
}

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

/// Every committed regression input, as (target, file name). The test
/// replays these and fails when one is missing (an emptied or missing
/// folder replays nothing, which must not pass) or when the folder holds
/// one this list does not name (add it here when you commit it).
const REGRESSIONS: &[(&str, &str)] = &[
    ("disk_spec", "vhost-user-no-socket"),
    ("disk_spec", "vhost-user-options"),
    ("disk_spec", "vhost-user-round-trip"),
    ("engine", "auto-retry-split-pages"),
    ("engine", "collapse-waits-for-a-starved-cpu"),
    ("engine", "evict-all-waits-for-a-failed-fault"),
    ("engine", "sealed-auto-split-pages"),
    ("engine", "sealed-retry-transient-corruption"),
    ("engine", "stuck-under-load-limit-2-unconfirmed"),
    ("kernel_image", "image-kind-phoff-overflow-1"),
    ("kernel_image", "image-kind-phoff-overflow-2"),
    ("kernel_image", "vmlinux-end-gpa-overflow"),
    ("payload_elf", "image-kind-phoff-overflow-1"),
    ("payload_elf", "image-kind-phoff-overflow-2"),
    ("store_spec", "nbd-host-with-brackets"),
];

#[test]
fn every_regression_input_runs_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let mut on_disk = Vec::new();
    for target in TARGETS {
        for file in inputs(&root.join(target.name)) {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            on_disk.push((target.name.to_string(), name));
        }
    }
    for (target, name) in &on_disk {
        assert!(
            REGRESSIONS.contains(&(target.as_str(), name.as_str())),
            "fuzz/regressions/{target}/{name} is not in this test's REGRESSIONS list: add it there"
        );
    }
    for (target, name) in REGRESSIONS {
        assert!(
            on_disk.iter().any(|(t, n)| t == target && n == name),
            "fuzz/regressions/{target}/{name} is missing (was the folder emptied?)"
        );
    }
    let replayed = replay("regressions");
    assert_eq!(
        replayed,
        REGRESSIONS.len(),
        "replayed {replayed} regression inputs, {} are committed",
        REGRESSIONS.len()
    );
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

fn regression(target: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The engine inputs kept for the `auto` unit, the retry layer and sealed
/// stores reach what they are named for: a replay that no longer split a
/// chunk, retried a fault or opened a sealed page would test nothing.
#[test]
fn the_engine_regressions_reach_what_they_are_named_for() {
    use hugevmm_fuzz::engine::run_input;
    // Thrashing chunks split, their pages fault back alone through the
    // retry layer (EIOs and checksum failures injected on the way), and
    // the dense ones collapse.
    let auto = run_input(&regression("engine", "auto-retry-split-pages"));
    let (split, store) = (&auto.stats.split, &auto.store);
    assert!(auto.completed, "{auto:?}");
    assert!(
        split.splits_by_reason.thrashing > 0
            && split.page_faults.store > 0
            && split.collapses_by_reason.dense > 0,
        "auto-retry-split-pages: {split:?}"
    );
    assert!(
        store.injected.transient_errors > 0
            && store.retry.retries > 0
            && store.injected.transient_corruptions > 0
            && store.retry.checksum_recovered > 0,
        "auto-retry-split-pages: {store:?}"
    );
    // A sealed store keeps split chunks' pages, each sealed apart.
    let sealed = run_input(&regression("engine", "sealed-auto-split-pages"));
    let split = &sealed.stats.split;
    assert!(sealed.completed, "{sealed:?}");
    assert!(
        split.splits_by_reason.thrashing > 0
            && split.pages_written > 0
            && split.page_faults.store > 0,
        "sealed-auto-split-pages: {split:?}"
    );
    // Damage on the way to a sealed image fails authentication once, the
    // re-read opens it; EIOs are retried.
    let retried = run_input(&regression("engine", "sealed-retry-transient-corruption"));
    let store = &retried.store;
    assert!(retried.completed, "{retried:?}");
    assert!(
        store.sealed
            && store.retry.auth_rereads > 0
            && store.retry.auth_recovered == store.retry.auth_rereads,
        "sealed-retry-transient-corruption: {store:?}"
    );
    assert!(
        store.injected.transient_errors > 0 && store.retry.retries > 0,
        "sealed-retry-transient-corruption: {store:?}"
    );
}

/// `tools/fuzz --ci` (what CI fuzzes) runs the targets its own list names:
/// a target added to [`TARGETS`] and not there would never be fuzzed.
#[test]
fn tools_fuzz_runs_every_target() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/fuzz");
    let listed = std::process::Command::new("bash")
        .arg(&script)
        .arg("--list")
        .output()
        .expect("run tools/fuzz --list");
    assert!(listed.status.success(), "tools/fuzz --list: {listed:?}");
    let listed: Vec<String> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let targets: Vec<String> = TARGETS.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(
        listed, targets,
        "tools/fuzz's targets=(...) and TARGETS differ"
    );
}

//! What the bench's end-to-end tests share: the `hugevmm` binary they
//! drive, and one run of a suite on its tiny plan.

// Each test binary includes this module and uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use test_resources::{skip, Resource};

/// The `hugevmm` beside the test's `hugevmm-bench` (release, as `cargo
/// build --release -p vmm` makes it), or the one HUGEVMM_BIN names.
pub fn hugevmm() -> PathBuf {
    if let Some(p) = std::env::var_os("HUGEVMM_BIN") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_BIN_EXE_hugevmm-bench")).with_file_name("hugevmm")
}

/// [`hugevmm`], or `None` after a visible skip of `test` that says how to
/// build it.
pub fn hugevmm_or_skip(test: &str) -> Option<PathBuf> {
    let bin = hugevmm();
    if bin.is_file() {
        return Some(bin);
    }
    skip(
        test,
        Resource::Kvm,
        format!(
            "{} does not exist: cargo build --release -p vmm",
            bin.display()
        ),
    );
    None
}

/// What a suite's tiny run left.
pub struct TinyRun {
    /// What it printed: its tables.
    pub stdout: String,
    /// Its `results.json`.
    pub json: serde_json::Value,
    /// Its `--out` folder (removed by the caller when done).
    pub out: PathBuf,
}

/// `hugevmm-bench SUITE --quick --out OUT --store-dir /var/tmp` with
/// `plan_var=tiny`, driving `bin`; fails the test when the suite fails or
/// skips anything.
pub fn run_tiny(suite: &str, plan_var: &str, bin: &std::path::Path, tag: &str) -> TinyRun {
    let out = std::env::temp_dir().join(format!("hugevmm-bench-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let result = Command::new(env!("CARGO_BIN_EXE_hugevmm-bench"))
        .args([suite, "--quick", "--out"])
        .arg(&out)
        .args(["--store-dir", "/var/tmp"])
        .env("HUGEVMM_BIN", bin)
        .env(plan_var, "tiny")
        .output()
        .expect("run hugevmm-bench");
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        result.status.success(),
        "{suite} failed: {}\n{stderr}\n{stdout}",
        result.status
    );
    assert!(!stderr.contains("SKIP"), "the suite skipped:\n{stderr}");
    let json = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json"),
    )
    .expect("results.json parses");
    TinyRun { stdout, json, out }
}

/// Fails unless some line of `stdout` starts with each of `rows`.
pub fn assert_rows(stdout: &str, rows: &[&str]) {
    for row in rows {
        assert!(
            stdout.lines().any(|l| l.starts_with(row)),
            "no `{row}` row:\n{stdout}"
        );
    }
}

//! Smoke test of the benchmark binary (what `hugevmm bench` starts): the
//! smallest suite in quick mode runs and writes its files. It asserts no
//! times: a benchmark's figures depend on the machine, and CI must not
//! fail on a slow disk. The suite runs no VM, so no `hugevmm` is needed.

use std::path::PathBuf;
use std::process::Command;

fn out_dir(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("hugevmm-bench-smoke-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn bench_limits_quick_writes_json_csv_and_svg() {
    let out = out_dir("limits");
    // The store directory must accept O_DIRECT; /var/tmp does on the CI
    // machines, unlike a tmpfs /tmp.
    let result = Command::new(env!("CARGO_BIN_EXE_hugevmm-bench"))
        .args(["limits", "--quick", "--out"])
        .arg(&out)
        .args(["--store-dir", "/var/tmp"])
        .output()
        .expect("run hugevmm-bench");
    let stderr = String::from_utf8_lossy(&result.stderr);
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(
        result.status.success(),
        "hugevmm-bench limits --quick failed: {}\n{stderr}\n{stdout}",
        result.status
    );
    assert!(
        stdout.contains("limits: this machine's ceilings"),
        "no table on stdout:\n{stdout}"
    );
    assert!(
        stderr.contains("limits"),
        "no progress lines on stderr:\n{stderr}"
    );

    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json"),
    )
    .expect("results.json parses");
    for key in ["write_gibs", "read_gibs", "read_qd1_gibs"] {
        assert!(
            json["limits"]["disk"][key].is_number(),
            "results.json lacks limits.disk.{key}: {json}"
        );
    }
    assert!(json["limits"]["memcpy_2m_gibs"].is_number());
    assert!(json["limits"]["codecs"]["lz4"]["seqwrite"]["ratio"].is_number());

    let csv = std::fs::read_to_string(out.join("results.csv")).expect("results.csv");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("suite,case,variant,run,metric,value,unit")
    );
    assert!(
        lines.any(|l| l.starts_with("limits,machine,,0,memcpy_2m_gibs,")),
        "{csv}"
    );

    let svg = std::fs::read_to_string(out.join("limits.svg")).expect("limits.svg");
    assert!(
        svg.contains("<svg") && svg.contains("memcpy"),
        "limits.svg is not the expected plot"
    );
    assert!(out.join("results.md").exists());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_suite_that_runs_vms_names_the_missing_hugevmm_binary() {
    let out = out_dir("no-hugevmm");
    let result = Command::new(env!("CARGO_BIN_EXE_hugevmm-bench"))
        .args(["swap-w-seq", "--quick", "--out"])
        .arg(&out)
        .env("HUGEVMM_BIN", "/nonexistent/hugevmm")
        .output()
        .expect("run hugevmm-bench");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/hugevmm, which does not exist") && stderr.contains("-p vmm"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing is written before the check");
}

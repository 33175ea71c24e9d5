//! `hugevmm bench` starts the benchmark binary beside it: with the same
//! arguments, naming itself as the binary the VM runs use, and with an
//! error naming what to build when that binary is missing. A script stands
//! in for `hugevmm-bench` (the real one is tested in bench/tests).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory of its own holding a `hugevmm` (a hard link to the one
/// cargo built, so that its `current_exe` is in that directory).
fn hugevmm_in_own_dir(tag: &str) -> (PathBuf, PathBuf) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-exec-{tag}-{}", std::process::id()))
        .join("debug");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the directory");
    let hugevmm = dir.join("hugevmm");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_hugevmm"), &hugevmm).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_hugevmm"), &hugevmm).expect("copy hugevmm");
    }
    (dir, hugevmm)
}

#[test]
fn bench_runs_the_binary_beside_it_with_its_arguments() {
    let (dir, hugevmm) = hugevmm_in_own_dir("present");
    let bench = dir.join("hugevmm-bench");
    std::fs::write(
        &bench,
        "#!/bin/sh\nprintf '%s|' \"$0\" \"$@\" \"$HUGEVMM_BIN\"\nexit 7\n",
    )
    .expect("write the stand-in");
    std::fs::set_permissions(&bench, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&hugevmm)
        .args(["bench", "limits", "--quick", "--help", "--out", "x y"])
        .output()
        .expect("run hugevmm bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "the bench's status is hugevmm's: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A shell script's $0 is the path it was started by; the arguments
    // arrive as given, --help included, and HUGEVMM_BIN names hugevmm.
    assert_eq!(
        stdout,
        format!(
            "{}|limits|--quick|--help|--out|x y|{}|",
            bench.display(),
            hugevmm.display()
        )
    );
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn bench_without_the_benchmark_binary_says_what_to_build() {
    let (dir, hugevmm) = hugevmm_in_own_dir("missing");
    let out = Command::new(&hugevmm)
        .args(["bench", "limits", "--quick"])
        .output()
        .expect("run hugevmm bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "hugevmm bench runs the benchmark binary {}, which is not there: build it in the checkout: `cargo build -p hugevmm-bench`",
            dir.join("hugevmm-bench").display()
        )),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

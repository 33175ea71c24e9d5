//! CLI behaviour that needs no VM: argument errors are clear and early.
//! (Also makes `cargo test --workspace` build the `hugevmm` binary that the
//! `integration-tests` package launches.)

use std::process::Command;

fn hugevmm(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hugevmm"))
        .args(args)
        .output()
        .expect("run hugevmm");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn mem_not_a_multiple_of_2mib_is_refused() {
    let (status, err) = hugevmm(&["run", "--payload", "hello", "--mem", "1001M"]);
    assert_ne!(status, Some(0));
    assert!(err.contains("2 MiB"), "{err}");
}

#[test]
fn unknown_payload_lists_the_builtins() {
    let (status, err) = hugevmm(&["run", "--payload", "nosuch"]);
    assert_eq!(status, Some(1));
    assert!(err.contains("hello") && err.contains("verify"), "{err}");
}

#[test]
fn bad_size_and_backing_are_refused() {
    let (status, err) = hugevmm(&["run", "--payload", "hello", "--mem", "lots"]);
    assert_ne!(status, Some(0));
    assert!(err.contains("--mem"), "{err}");
    let (status, err) = hugevmm(&["run", "--payload", "hello", "--backing", "giant"]);
    assert_ne!(status, Some(0));
    assert!(err.contains("thp") && err.contains("hugetlb"), "{err}");
}

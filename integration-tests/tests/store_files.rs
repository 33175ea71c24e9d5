//! Files the user names for the swap store and disks are never destroyed
//! by accident: an existing file is refused without `,overwrite`, and a
//! file used as both a disk and the store (or as two writable disks) is
//! refused by its lock before anything is written.

use integration_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// A file with content worth keeping, on a disk filesystem (O_DIRECT).
fn precious(tag: &str, len_bytes: usize) -> (PathBuf, Vec<u8>) {
    let path =
        PathBuf::from("/var/tmp").join(format!("hugevmm-test-{}-{tag}.img", std::process::id()));
    let content: Vec<u8> = (0..len_bytes)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1])
        .collect();
    std::fs::write(&path, &content).expect("write test file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (path, content)
}

fn assert_kept(path: &PathBuf, content: &[u8], run: &Run) {
    let now = std::fs::read(path).expect("the file must still exist");
    let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let _ = std::fs::remove_file(path);
    assert!(
        now == content,
        "{} changed ({} bytes now)\n--- stderr\n{}",
        path.display(),
        now.len(),
        run.stderr
    );
    assert_eq!(mode, 0o644, "mode changed\n--- stderr\n{}", run.stderr);
}

/// Runs `hugevmm run --payload hello --mem 64M ARGS`, where `{file}` in
/// ARGS stands for a fresh file with content: the run must be refused with
/// a message containing each of `wants` (`{file}` there too), and the file
/// must keep its content and mode.
fn refused_with_the_file_kept(test: &str, args: &[&str], wants: &[&str]) {
    if skip_without_kvm(test) {
        return;
    }
    let (path, content) = precious(test, 4 << 20);
    let file = path.display().to_string();
    let args: Vec<String> = ["run", "--payload", "hello", "--mem", "64M"]
        .iter()
        .chain(args)
        .map(|a| a.replace("{file}", &file))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = hugevmm(&args, LIMIT);
    assert_ne!(run.status, Some(0), "{}", run.stderr);
    for want in wants {
        let want = want.replace("{file}", &file);
        assert!(run.stderr.contains(&want), "want {want:?}: {}", run.stderr);
    }
    assert_kept(&path, &content, &run);
}

#[test]
fn an_existing_store_file_is_kept_and_needs_overwrite() {
    refused_with_the_file_kept(
        "an_existing_store_file_is_kept_and_needs_overwrite",
        &["--swap-store", "file:{file}"],
        &[",overwrite", "existing regular file"],
    );
}

#[test]
fn a_disk_that_is_also_the_store_is_refused_untouched() {
    refused_with_the_file_kept(
        "a_disk_that_is_also_the_store_is_refused_untouched",
        &["--disk", "{file}", "--swap-store", "file:{file},overwrite"],
        &["in use", "{file}"],
    );
}

#[test]
fn the_same_writable_disk_twice_is_refused() {
    refused_with_the_file_kept(
        "the_same_writable_disk_twice_is_refused",
        &["--disk", "{file}", "--disk", "{file}"],
        &["in use", "--disk"],
    );
}

#[test]
fn overwrite_lets_the_store_use_an_existing_file() {
    if skip_without_kvm("overwrite_lets_the_store_use_an_existing_file") {
        return;
    }
    let (path, _) = precious("store-overwrite", 4 << 20);
    let store = format!("file:{},overwrite", path.display());
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64M",
            "--mem-limit",
            "16M",
            "--swap-store",
            &store,
        ],
        LIMIT,
    );
    let _ = std::fs::remove_file(&path);
    run.expect_status(0);
}

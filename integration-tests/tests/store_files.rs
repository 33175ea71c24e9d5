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

#[test]
fn an_existing_store_file_is_kept_and_needs_overwrite() {
    if skip_without_kvm("an_existing_store_file_is_kept_and_needs_overwrite") {
        return;
    }
    let (path, content) = precious("store-exists", 4 << 20);
    let store = format!("file:{}", path.display());
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64M",
            "--swap-store",
            &store,
        ],
        LIMIT,
    );
    assert_ne!(run.status, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains(",overwrite"), "{}", run.stderr);
    assert!(
        run.stderr.contains("existing regular file"),
        "{}",
        run.stderr
    );
    assert_kept(&path, &content, &run);
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

#[test]
fn a_disk_that_is_also_the_store_is_refused_untouched() {
    if skip_without_kvm("a_disk_that_is_also_the_store_is_refused_untouched") {
        return;
    }
    let (path, content) = precious("disk-and-store", 4 << 20);
    let disk = path.display().to_string();
    let store = format!("file:{disk},overwrite");
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64M",
            "--disk",
            &disk,
            "--swap-store",
            &store,
        ],
        LIMIT,
    );
    assert_ne!(run.status, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("in use"), "{}", run.stderr);
    assert!(run.stderr.contains(&disk), "{}", run.stderr);
    assert_kept(&path, &content, &run);
}

#[test]
fn the_same_writable_disk_twice_is_refused() {
    if skip_without_kvm("the_same_writable_disk_twice_is_refused") {
        return;
    }
    let (path, content) = precious("disk-twice", 4 << 20);
    let disk = path.display().to_string();
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64M",
            "--disk",
            &disk,
            "--disk",
            &disk,
        ],
        LIMIT,
    );
    assert_ne!(run.status, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("in use"), "{}", run.stderr);
    assert!(run.stderr.contains("--disk"), "{}", run.stderr);
    assert_kept(&path, &content, &run);
}

//! `--swap-encrypt` under real VMs (docs/ENCRYPTION.md): a `file:` store
//! written by an encrypted run holds none of the guest's recognisable
//! pages that the same run without encryption leaves there, the guest
//! still reads back every word it wrote (through whole-chunk and split
//! page I/O), and bad key files are refused with what to do.

use integration_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

/// `verify` on 2 vCPUs, 512 MiB held to 128 MiB, onto a new `file:` store
/// at `store`, with `extra` options; the store file is left for the caller
/// (`,keep`).
fn verify_onto(store: &Path, extra: &[&str]) -> Run {
    let run = verify_small_overcommitted(&format!("file:{},keep", store.display()), extra);
    run.expect_status(0);
    assert!(run.stat("/swap/evictions") >= 256, "too few evictions");
    assert!(run.stat("/swap/faults/store") >= 128, "too few store reads");
    assert_eq!(run.stat("/swap/store/auth_fatal"), 0);
    let sealed = run.stats.as_ref().unwrap().pointer("/swap/store/sealed");
    assert_eq!(
        sealed,
        Some(&serde_json::Value::Bool(extra.contains(&"--swap-encrypt"))),
        "swap.store.sealed"
    );
    run
}

#[test]
fn an_encrypted_store_holds_none_of_the_guest_pages_a_plain_one_does() {
    if skip_without_kvm("an_encrypted_store_holds_none_of_the_guest_pages") {
        return;
    }
    let plain = temp_path("plain-store.img");
    verify_onto(&plain, &[]);
    let image = std::fs::read(&plain).unwrap();
    let _ = std::fs::remove_file(&plain);
    let found_plain = verify_pages_in(&image);
    // The control: the scan recognises the guest's pages in a plain store.
    assert!(
        found_plain >= 10_000,
        "only {found_plain} verify pages in the plain store of {} bytes",
        image.len()
    );

    let sealed = temp_path("sealed-store.img");
    let run = verify_onto(&sealed, &["--swap-encrypt"]);
    let image = std::fs::read(&sealed).unwrap();
    let _ = std::fs::remove_file(&sealed);
    let found_sealed = verify_pages_in(&image);
    eprintln!(
        "verify pages: {found_plain} in the plain store, {found_sealed} in the sealed one ({} bytes; {} evictions, {} store faults)",
        image.len(),
        run.stat("/swap/evictions"),
        run.stat("/swap/faults/store"),
    );
    assert!(
        image.len() >= 128 << 20,
        "the sealed store was hardly written"
    );
    assert_eq!(
        found_sealed, 0,
        "guest pages in the clear in a sealed store"
    );
}

/// Split chunks under encryption: every 3rd restore splits its chunk
/// (re-sealing the slot page by page) and every 3rd page fault collapses
/// one, on the file and the mem store; `verify` checks every word.
#[test]
fn verify_with_forced_splits_on_encrypted_stores() {
    if skip_without_kvm("verify_with_forced_splits_on_encrypted_stores") {
        return;
    }
    let file = temp_path("sealed-split-store.img");
    let spec = format!("file:{}", file.display());
    for store in [spec.as_str(), "mem:lz4"] {
        let run = hugevmm(
            &[
                "run",
                "--payload",
                "verify",
                "--vcpus",
                "2",
                "--mem",
                "512M",
                "--mem-limit",
                "128M",
                "--payload-args",
                "passes=2",
                "--swap-store",
                store,
                "--swap-encrypt",
                "--swap-unit",
                "2m",
                "--force-split-every",
                "3",
            ],
            LIMIT,
        );
        run.expect_status(0);
        let _ = std::fs::remove_file(&file);
        let splits = run.stat("/swap/split/splits_by_origin/stored");
        let page_reads = run.stat("/swap/split/page_faults/store");
        eprintln!("sealed {store}: stored splits {splits}, page reads {page_reads}");
        assert!(splits >= 20, "{store}: {splits} splits of stored chunks");
        assert!(page_reads > 0, "{store}: no page read alone");
        assert_eq!(run.stat("/swap/store/auth_fatal"), 0);
    }
}

fn key_file(name: &str, bytes: &[u8], mode: u32) -> std::path::PathBuf {
    let path = temp_path(name);
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[test]
fn key_files_are_checked_before_the_vm_starts() {
    let base = [
        "run",
        "--payload",
        "hello",
        "--mem",
        "64M",
        "--swap-store",
        "mem:lz4",
        "--swap-encrypt",
        "--swap-key-file",
    ];
    let open = key_file("key-open", &[5u8; 32], 0o644);
    let short = key_file("key-short", &[5u8; 16], 0o600);
    let missing = temp_path("key-missing");
    for (path, want) in [
        (&open, "chmod 600"),
        (&short, "holds 16 bytes, not 32"),
        (&missing, "head -c 32 /dev/urandom"),
    ] {
        let mut args = base.to_vec();
        let shown = path.display().to_string();
        args.push(&shown);
        let run = hugevmm(&args, LIMIT);
        assert_eq!(run.status, Some(1), "{}", run.stderr);
        assert!(run.stderr.contains(want), "{}", run.stderr);
        assert!(run.stderr.contains(&shown), "{}", run.stderr);
    }
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64M",
            "--swap-store",
            "mem:lz4",
            "--swap-key-file",
            "/nonexistent",
        ],
        LIMIT,
    );
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("add --swap-encrypt"), "{}", run.stderr);
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64M",
            "--swap-encrypt",
        ],
        LIMIT,
    );
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("--swap-encrypt"), "{}", run.stderr);
    let _ = std::fs::remove_file(&open);
    let _ = std::fs::remove_file(&short);
    if skip_without_kvm("a_good_key_file_runs") {
        return;
    }
    let good = key_file("key-good", &[7u8; 32], 0o600);
    let shown = good.display().to_string();
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "verify",
            "--mem",
            "128M",
            "--mem-limit",
            "32M",
            "--swap-store",
            "mem:zstd",
            "--swap-encrypt",
            "--swap-key-file",
            &shown,
        ],
        LIMIT,
    );
    let _ = std::fs::remove_file(&good);
    run.expect_status(0);
    assert!(run.stat("/swap/faults/store") > 0);
}

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

/// A fresh path for a store file on a disk filesystem (O_DIRECT); nothing
/// is created there.
fn store_path(tag: &str) -> PathBuf {
    let path =
        PathBuf::from("/var/tmp").join(format!("hugevmm-test-{}-{tag}.swap", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// `verify` on 1 vCPU, 128 MiB held to 64 MiB, on the store `spec`: it
/// evicts, so the store is written.
fn verify_on(spec: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "run",
        "--payload",
        "verify",
        "--mem",
        "128M",
        "--mem-limit",
        "64M",
        "--swap-store",
        spec,
    ];
    args.extend_from_slice(extra);
    hugevmm(&args, LIMIT)
}

/// The first finding: the same `file:` store command twice in a
/// row. The first run left its file behind (guest memory in the clear) and
/// the second was refused as "an existing regular file".
#[test]
fn the_same_file_store_command_runs_twice_and_leaves_no_file() {
    if skip_without_kvm("the_same_file_store_command_runs_twice_and_leaves_no_file") {
        return;
    }
    let path = store_path("twice");
    let spec = format!("file:{}", path.display());
    for round in 1..=2 {
        let run = verify_on(&spec, &[]);
        let left = path.exists();
        let _ = std::fs::remove_file(&path);
        run.expect_status(0);
        assert!(
            run.stat("/swap/evictions") > 0,
            "round {round}: no eviction"
        );
        assert!(
            !left,
            "round {round}: {} is left after the run\n{}",
            path.display(),
            run.stderr
        );
        assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    }
}

/// A run that fails to start after its store file (and its console log)
/// were created leaves neither behind.
#[test]
fn a_run_that_fails_to_start_leaves_no_store_file_or_console_log() {
    if skip_without_kvm("a_run_that_fails_to_start_leaves_no_store_file_or_console_log") {
        return;
    }
    let store = store_path("failed-start");
    let spec = format!("file:{}", store.display());
    let console = store_path("failed-start-console.log");
    // Not a kernel, but nothing refuses it before the devices are built:
    // the missing disk ends the run first (and the kernel would next).
    let kernel = temp_file("not-a-kernel.bin", &"x".repeat(8192));
    let missing_disk = store_path("no-such-disk.img");
    let run = hugevmm(
        &[
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--mem",
            "64M",
            "--mem-limit",
            "32M",
            "--swap-store",
            &spec,
            "--console-log",
            console.to_str().unwrap(),
            "--disk",
            missing_disk.to_str().unwrap(),
        ],
        LIMIT,
    );
    let _ = std::fs::remove_file(&kernel);
    let (store_left, console_left) = (store.exists(), console.exists());
    let _ = std::fs::remove_file(&store);
    let _ = std::fs::remove_file(&console);
    run.expect_status(1);
    assert!(
        run.stderr.contains(&missing_disk.display().to_string()),
        "{}",
        run.stderr
    );
    assert!(!store_left, "the store file is left\n{}", run.stderr);
    assert!(!console_left, "the console log is left\n{}", run.stderr);
}

/// Ended by SIGTERM: no store file. (Its name is gone as soon as the VM
/// runs, while hugevmm holds it open: gone however hugevmm ends.)
#[test]
fn a_store_file_is_gone_while_the_vm_runs_and_after_sigterm() {
    if skip_without_kvm("a_store_file_is_gone_while_the_vm_runs_and_after_sigterm") {
        return;
    }
    let path = store_path("sigterm");
    let spec = format!("file:{}", path.display());
    let (vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "balloon",
        "--mem",
        "128M",
        "--mem-limit",
        "64M",
        "--balloon",
        "--payload-args",
        "follow=1",
        "--swap-store",
        &spec,
    ]);
    // The socket listens before the store is opened; its first answer
    // comes once the machine is built.
    ctl(&socket, &["stats"]);
    let named_while_running = path.exists();
    let deleted = format!("{} (deleted)", path.display());
    let held_open = std::fs::read_dir(format!("/proc/{}/fd", vm.pid()))
        .unwrap()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_str() == Some(&deleted)));
    vm.signal(libc::SIGTERM);
    let run = vm.finish(LIMIT);
    let left = path.exists();
    let _ = std::fs::remove_file(&path);
    run.expect_status(128 + libc::SIGTERM);
    assert!(
        !named_while_running,
        "{} has its name while the VM runs",
        path.display()
    );
    assert!(held_open, "hugevmm does not hold {deleted} open");
    assert!(
        !left,
        "{} is left after SIGTERM\n{}",
        path.display(),
        run.stderr
    );
}

/// `,keep` keeps the file, written, and says that it holds guest memory.
#[test]
fn keep_keeps_the_store_file_and_warns_that_it_holds_guest_memory() {
    if skip_without_kvm("keep_keeps_the_store_file_and_warns_that_it_holds_guest_memory") {
        return;
    }
    let path = store_path("keep");
    let spec = format!("file:{},keep", path.display());
    let run = verify_on(&spec, &[]);
    let image = std::fs::read(&path);
    let _ = std::fs::remove_file(&path);
    run.expect_status(0);
    let image = image.unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), run.stderr));
    assert!(
        run.stderr.contains(&format!(
            "hugevmm: warning: --swap-store {spec}: {} stays after the run (,keep) and holds guest memory in the clear",
            path.display()
        )),
        "{}",
        run.stderr
    );
    assert!(
        verify_pages_in(&image) > 0,
        "none of the guest's pages in the kept store ({} bytes)",
        image.len()
    );
}

/// The second finding: an `,overwrite` store on a VM that evicts
/// was killed by the evictor's filter (`fchmod`, status 159). Now it runs
/// to the end; the file, the user's, stays, holding the store's content
/// (mode 0600), and the warning says so.
#[test]
fn an_overwrite_store_on_a_vm_that_evicts_runs_to_the_end() {
    if skip_without_kvm("an_overwrite_store_on_a_vm_that_evicts_runs_to_the_end") {
        return;
    }
    let (path, _) = precious("overwrite-evicting", 4 << 20);
    let spec = format!("file:{},overwrite", path.display());
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "verify",
            "--vcpus",
            "2",
            "--mem",
            "256M",
            "--mem-limit",
            "64M",
            "--swap-store",
            &spec,
        ],
        LIMIT,
    );
    let image = std::fs::read(&path);
    let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
    let _ = std::fs::remove_file(&path);
    run.expect_status(0);
    assert!(run.stat("/swap/evictions") > 0, "no eviction");
    assert!(!run.stderr.contains("seccomp"), "{}", run.stderr);
    let image = image.unwrap_or_else(|e| panic!("the user's file is gone ({e})\n{}", run.stderr));
    assert_eq!(mode.ok(), Some(0o600), "{}", run.stderr);
    assert!(
        verify_pages_in(&image) > 0,
        "the store's content is not in the file"
    );
    assert!(
        run.stderr
            .contains("was there before the run, so it is not removed")
            && run.stderr.contains("guest memory in the clear"),
        "{}",
        run.stderr
    );
}

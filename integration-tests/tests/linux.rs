//! A stock Debian kernel booted through hugevmm.
//!
//! On hosts whose KVM runs guest kernel code natively (VMX/SVM) a kernel
//! boots fully. On this project's PVM hosts guest CPL 0 code is emulated and
//! the emulator stops a stock kernel early; the test then checks what the
//! kernel printed up to there (banner, command line, our e820 map) and that
//! hugevmm ends the VM with a clear emulation-failure message, in bounded
//! time.

use integration_tests::*;
use std::path::PathBuf;
use std::time::Duration;

fn kernel() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/linux-kernel/vmlinuz");
    path.exists().then_some(path)
}

/// The BIOS-e820 lines Linux prints for hugevmm's layout of `mem_bytes` of
/// RAM (below 3 GiB only here): low RAM up to the EBDA, the legacy hole,
/// then the rest.
fn expected_e820(mem_bytes: u64) -> Vec<String> {
    let line = |start: u64, end: u64, kind: &str| {
        format!("BIOS-e820: [mem {start:#018x}-{:#018x}] {kind}", end - 1)
    };
    vec![
        line(0, 0x9fc00, "usable"),
        line(0x9fc00, 0x100000, "reserved"),
        line(0x100000, mem_bytes, "usable"),
    ]
}

#[test]
fn a_debian_kernel_boots_to_its_banner_with_our_cmdline_and_e820_map() {
    if skip_without_kvm("linux_boot") {
        return;
    }
    let Some(kernel) = kernel() else {
        eprintln!("SKIP linux_boot: no kernel at target/linux-kernel/vmlinuz; run .ci/fetch-kernel (CI does)");
        return;
    };
    let cmdline = "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1 hugevmm.test=banner";
    let run = hugevmm(
        &[
            "run",
            "--kernel",
            kernel.to_str().unwrap(),
            "--mem",
            "256M",
            "--cmdline",
            cmdline,
            "--timeout",
            "400",
            "--mem-limit",
            "192M",
        ],
        Duration::from_secs(600),
    );
    let out = &run.stdout;
    assert!(
        out.contains("Linux version "),
        "no banner:\n{out}\n{}",
        run.stderr
    );
    let printed = out
        .lines()
        .find_map(|l| {
            l.split_once("Command line: ")
                .map(|(_, c)| c.trim_end().to_string())
        })
        .unwrap_or_default();
    assert_eq!(printed, cmdline, "the kernel saw exactly our command line");
    let e820: Vec<String> = out
        .lines()
        .filter_map(|l| {
            l.find("BIOS-e820: ")
                .map(|at| l[at..].trim_end().to_string())
        })
        .collect();
    assert_eq!(e820, expected_e820(256 << 20), "e820 map:\n{out}");
    assert_ne!(
        run.status,
        Some(124),
        "the VM must end by itself, not by --timeout:\n{}",
        run.stderr
    );
    if run.stderr.contains("emulation failure") {
        eprintln!("linux_boot: PVM-like host (guest CPL 0 emulated): banner, cmdline and e820 checked; the VM ended with an emulation failure, as expected here");
        assert_eq!(run.status, Some(125));
        assert!(
            run.stderr.contains("emulation failure at rip 0x"),
            "{}",
            run.stderr
        );
    } else {
        eprintln!(
            "linux_boot: the kernel ran on (VMX/SVM-like host); exit {:?}; full boot to an initramfs is not covered by this test",
            run.status
        );
    }
}

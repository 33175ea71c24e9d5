//! Real VMs running the built-in payloads and payloads built here with gcc.

use integration_tests::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(180);

#[test]
fn hello_on_one_and_four_vcpus() {
    if skip_without_kvm("hello_on_one_and_four_vcpus") {
        return;
    }
    for vcpus in ["1", "4"] {
        let run = hugevmm(
            &[
                "run",
                "--payload",
                "hello",
                "--vcpus",
                vcpus,
                "--mem",
                "64M",
            ],
            LIMIT,
        );
        run.expect_status(0);
        let n: usize = vcpus.parse().unwrap();
        for i in 0..n {
            let want = format!("hello from vcpu {i} of {n}");
            assert!(
                run.stdout.lines().any(|l| l == want),
                "missing '{want}' in:\n{}",
                run.stdout
            );
        }
        assert_eq!(
            run.stdout.lines().count(),
            n,
            "one whole line per vCPU:\n{}",
            run.stdout
        );
        assert_eq!(run.stat("/vcpus"), n as u64);
    }
}

#[test]
fn exit_status_of_the_payload_is_the_exit_status_of_hugevmm() {
    if skip_without_kvm("exit_status") {
        return;
    }
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "selftest",
            "--payload-args",
            "exit=7",
            "--mem",
            "64M",
        ],
        LIMIT,
    );
    run.expect_status(7);
    assert_eq!(run.stat("/exit_status"), 7);
}

#[test]
fn guest_exceptions_are_reported_with_vector_rip_and_cr2() {
    if skip_without_kvm("guest_exceptions") {
        return;
    }
    let ud = hugevmm(
        &[
            "run",
            "--payload",
            "selftest",
            "--payload-args",
            "fault=ud",
            "--mem",
            "64M",
        ],
        LIMIT,
    );
    assert_ne!(ud.status, Some(0));
    assert!(
        ud.stderr.contains("vector 6") && ud.stderr.contains("rip 0x"),
        "{}",
        ud.stderr
    );

    let pf = hugevmm(
        &[
            "run",
            "--payload",
            "selftest",
            "--payload-args",
            "fault=pf vcpu=1",
            "--vcpus",
            "2",
            "--mem",
            "64M",
        ],
        LIMIT,
    );
    assert_ne!(pf.status, Some(0));
    assert!(
        pf.stderr.contains("vCPU 1") && pf.stderr.contains("vector 14"),
        "{}",
        pf.stderr
    );
    assert!(pf.stderr.contains("cr2 0xc0000000"), "{}", pf.stderr);
}

#[test]
fn verify_passes_on_two_vcpus() {
    if skip_without_kvm("verify_passes_on_two_vcpus") {
        return;
    }
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "verify",
            "--vcpus",
            "2",
            "--mem",
            "512M",
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert_eq!(
        run.stdout
            .lines()
            .filter(|l| l.starts_with("verify vcpu=") && l.ends_with(" ok"))
            .count(),
        2,
        "{}",
        run.stdout
    );
}

fn seqwrite_256m(backing: &str) -> Run {
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "seqwrite",
            "--payload-args",
            "bytes=256M",
            "--vcpus",
            "2",
            "--mem",
            "512M",
            "--backing",
            backing,
        ],
        LIMIT,
    );
    run.expect_status(0);
    run
}

#[test]
fn seqwrite_on_thp_is_mapped_2mib_by_kvm() {
    if skip_without_kvm("seqwrite_on_thp") {
        return;
    }
    let run = seqwrite_256m("thp");
    assert_mostly_huge(run.stat("/kvm/pages_2m"), 128, "seqwrite 256M on thp");
}

#[test]
fn seqwrite_on_small_pages_has_no_2mib_mappings() {
    if skip_without_kvm("seqwrite_on_small_pages") {
        return;
    }
    let run = seqwrite_256m("4k");
    assert_eq!(run.stat("/kvm/pages_2m"), 0);
    assert!(
        run.stat("/kvm/pages_4k") >= 128 * 512,
        "4k mappings cover the working set"
    );
}

#[test]
fn seqwrite_on_hugetlb_is_mapped_2mib_by_kvm() {
    if skip_without_kvm("seqwrite_on_hugetlb") {
        return;
    }
    let _pages = match ensure_hugetlb_pages(256) {
        Ok(pages) => pages,
        Err(reason) => {
            skip("seqwrite_on_hugetlb", Resource::Hugetlb, reason);
            return;
        }
    };
    let run = seqwrite_256m("hugetlb");
    assert_mostly_huge(run.stat("/kvm/pages_2m"), 128, "seqwrite 256M on hugetlb");
}

#[test]
fn hugetlb_without_enough_pages_says_how_to_reserve() {
    if skip_without_kvm("hugetlb_pool_message") {
        return;
    }
    // 64 GiB of hugetlb pages is more than this kind of machine reserves.
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "hello",
            "--mem",
            "64G",
            "--backing",
            "hugetlb",
        ],
        LIMIT,
    );
    assert_eq!(run.status, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("nr_hugepages"), "{}", run.stderr);
}

#[test]
fn bad_images_give_clear_errors() {
    if skip_without_kvm("bad_images") {
        return;
    }
    let junk = temp_file("junk.elf", "this is not an ELF file");
    let run = hugevmm(
        &[
            "run",
            "--payload-file",
            junk.to_str().unwrap(),
            "--mem",
            "64M",
        ],
        LIMIT,
    );
    assert_eq!(run.status, Some(1));
    assert!(run.stderr.contains("not an ELF"), "{}", run.stderr);

    let asm = temp_file("low.S", EXTERNAL_ASM);
    let low = gcc_build(
        &[&asm],
        &["-Wl,-Ttext-segment=0x100000", "-Wl,--build-id=none"],
        "low.elf",
    );
    let run = hugevmm(
        &[
            "run",
            "--payload-file",
            low.to_str().unwrap(),
            "--mem",
            "64M",
        ],
        LIMIT,
    );
    assert_eq!(run.status, Some(1));
    assert!(run.stderr.contains("below 2 MiB"), "{}", run.stderr);
}

#[test]
fn mem_not_multiple_of_2mib_is_refused() {
    let run = hugevmm(&["run", "--payload", "hello", "--mem", "1001M"], LIMIT);
    assert_ne!(run.status, Some(0));
    assert!(run.stderr.contains("multiple of 2 MiB"), "{}", run.stderr);
}

/// A payload written against the protocol document alone, in plain
/// assembly with no SDK: prints its vCPU index and the boot info magic
/// check result, exits 0.
const EXTERNAL_ASM: &str = r#"
    .globl _start
    .text
_start:
    movabs $0x4c5941504d4d5648, %rax
    cmp (%rsi), %rax
    jne bad
    cmpl $1, 8(%rsi)
    jne bad
    lea msg(%rip), %rbx
    mov $0x3f8, %dx
1:  movb (%rbx), %al
    test %al, %al
    jz 2f
    outb %al, %dx
    inc %rbx
    jmp 1b
2:  mov %edi, %eax
    add $'0', %al
    outb %al, %dx
    mov $'\n', %al
    outb %al, %dx
    xor %eax, %eax
    mov $0xf4, %dx
    outl %eax, %dx
3:  jmp 3b
bad:
    mov $9, %eax
    mov $0xf4, %dx
    outl %eax, %dx
    jmp bad
    .section .rodata
msg: .asciz "external payload on vcpu "
"#;

#[test]
fn a_payload_built_elsewhere_runs_unchanged() {
    if skip_without_kvm("external_payload") {
        return;
    }
    let asm = temp_file("ext.S", EXTERNAL_ASM);
    let elf = gcc_build(
        &[&asm],
        &["-Wl,-Ttext-segment=0x400000", "-Wl,--build-id=none"],
        "ext.elf",
    );
    let run = hugevmm(
        &[
            "run",
            "--payload-file",
            elf.to_str().unwrap(),
            "--vcpus",
            "3",
            "--mem",
            "128M",
        ],
        LIMIT,
    );
    run.expect_status(0);
    for i in 0..3 {
        assert!(
            run.stdout
                .contains(&format!("external payload on vcpu {i}")),
            "{}",
            run.stdout
        );
    }
}

#[test]
fn a_payload_built_with_the_sdk_runs_and_sees_its_args() {
    if skip_without_kvm("sdk_payload") {
        return;
    }
    let sdk = payloads::sdk_dir();
    let src = temp_file(
        "sdk_payload.c",
        r#"#include "hvmm.h"
int hvmm_main(unsigned vcpu, const struct hvmm_boot_info *info) {
    uint64_t n = 0;
    if (hvmm_arg_u64(info, "answer", &n) != 1) return 3;
    hvmm_printf("sdk vcpu=%u answer=%lu\n", vcpu, n);
    return n == 42 ? 0 : 4;
}
"#,
    );
    let ld = sdk.join("hvmm.ld");
    let elf = gcc_build(
        &[&sdk.join("start.S"), &sdk.join("hvmm.c"), Path::new(&src)],
        &[
            &format!("-I{}", sdk.display()),
            "-T",
            ld.to_str().unwrap(),
            "-x",
            "none",
        ],
        "sdk.elf",
    );
    let run = hugevmm(
        &[
            "run",
            "--payload-file",
            elf.to_str().unwrap(),
            "--payload-args",
            "answer=42",
            "--mem",
            "64M",
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert!(
        run.stdout.contains("sdk vcpu=0 answer=42"),
        "{}",
        run.stdout
    );
}

#[test]
fn without_dev_kvm_there_is_one_clear_line() {
    // Hide /dev/kvm in a private mount namespace (needs root and unshare).
    // SAFETY: geteuid has no preconditions and cannot fail.
    let is_root = unsafe { libc::geteuid() } == 0;
    if !is_root
        || std::process::Command::new("unshare")
            .arg("--version")
            .output()
            .is_err()
    {
        skip(
            "without_dev_kvm",
            Resource::Unshare,
            "needs root and unshare(1) to hide /dev/kvm",
        );
        return;
    }
    let bin = hugevmm_bin();
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs none /dev && exec {} run --payload hello",
            bin.display()
        ));
    let out = run_with_limit(cmd, LIMIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot open /dev/kvm"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}

/// A payload argument out of its range is refused by the payload with
/// the range (status 2), not accepted and ignored: a fault test naming a
/// vCPU the VM does not have would otherwise pass without its fault.
#[test]
fn payload_arguments_out_of_range_are_refused() {
    if skip_without_kvm("payload_arguments_out_of_range_are_refused") {
        return;
    }
    for (payload, args, said) in [
        (
            "selftest",
            "fault=ud vcpu=5",
            "selftest: bad value '5' for vcpu= (expected 0 or 1)",
        ),
        (
            "hostile",
            "exceptions=2",
            "hostile: bad value '2' for exceptions= (expected 0 or 1)",
        ),
    ] {
        let run = hugevmm(
            &[
                "run",
                "--payload",
                payload,
                "--payload-args",
                args,
                "--vcpus",
                "2",
                "--mem",
                "64M",
            ],
            LIMIT,
        );
        run.expect_status(2);
        assert!(
            run.stdout.contains(said),
            "{payload} {args}: {}",
            run.stdout
        );
        assert_eq!(run.stats.as_ref().unwrap()["exit_kind"], "payload");
    }
}

/// The command line and the payloads read sizes by one rule: a decimal
/// fraction is taken where it makes whole bytes (`--mem 1.5G`,
/// `bytes=1.5M`), and refused on both sides where it does not.
#[test]
fn the_cli_and_the_payloads_read_sizes_alike() {
    if skip_without_kvm("the_cli_and_the_payloads_read_sizes_alike") {
        return;
    }
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "seqwrite",
            "--mem",
            "1.5G",
            "--payload-args",
            "bytes=1.5M",
        ],
        LIMIT,
    );
    run.expect_status(0);
    assert_eq!(run.stat("/mem_bytes"), 1536 << 20);
    assert!(
        run.stdout.contains("seqwrite vcpu=0 bytes=1572864 "),
        "{}",
        run.stdout
    );
    let run = hugevmm(
        &[
            "run",
            "--payload",
            "seqwrite",
            "--mem",
            "64M",
            "--payload-args",
            "bytes=1.3K",
        ],
        LIMIT,
    );
    run.expect_status(2);
    assert!(
        run.stdout.contains("seqwrite: bad value '1.3K' for bytes="),
        "{}",
        run.stdout
    );
    let run = hugevmm(&["run", "--payload", "seqwrite", "--mem", "1.3K"], LIMIT);
    run.expect_status(2);
    assert!(
        run.stderr.contains("'1.3K' is not a whole number of bytes"),
        "{}",
        run.stderr
    );
}

/// `hugevmm payloads` names every argument (verify's cycles= was missing)
/// and says how arguments are written.
#[test]
fn the_payload_list_names_every_argument() {
    let run = hugevmm(&["payloads"], LIMIT);
    run.expect_status(0);
    let verify = run
        .stdout
        .lines()
        .find(|l| l.starts_with("verify "))
        .expect("verify listed");
    assert!(verify.contains("cycles=N"), "{verify}");
    for name in ["mixed", "blkcheck", "balloon"] {
        assert!(
            run.stdout.lines().any(|l| l.starts_with(name)),
            "{}",
            run.stdout
        );
    }
    assert!(
        run.stdout.contains("sizes as --mem takes them"),
        "{}",
        run.stdout
    );
}

/// The keys of a payload's argument table (`{ "key", HVMM_ARG_...`).
fn argument_keys(source: &str) -> Vec<String> {
    source
        .split("{ \"")
        .skip(1)
        .filter_map(|rest| {
            let (key, after) = rest.split_once('"')?;
            after
                .trim_start_matches([',', ' '])
                .starts_with("HVMM_ARG_")
                .then(|| key.to_string())
        })
        .collect()
}

/// README.md's payload table has a row for every built-in payload (it
/// lacked mixed, blkcheck and balloon), naming every argument it takes.
#[test]
fn the_readme_payload_table_lists_every_payload_and_argument() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for builtin in payloads::all() {
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", builtin.name)))
            .unwrap_or_else(|| panic!("README.md has no payload table row for {}", builtin.name));
        let source =
            std::fs::read_to_string(root.join(format!("payloads/src/guest/{}.c", builtin.name)))
                .unwrap();
        for key in argument_keys(&source) {
            assert!(
                row.contains(&format!("`{key}=")),
                "README.md's row for {} does not name {key}=: {row}",
                builtin.name
            );
        }
    }
}

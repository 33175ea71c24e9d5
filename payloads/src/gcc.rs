//! The gcc command line that builds a payload against the SDK.
//!
//! Shared by `build.rs` (built-in payloads) and the library
//! (`compile_command`, for payloads built by tests).

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// The gcc flags every payload is built with (before the SDK files and the
/// payload's sources). They make a freestanding, static, non-PIE ET_EXEC
/// with no stack protector, no unwind tables, no CET notes and no AVX
/// (the baseline x86-64 ISA: SSE2 is used, which the guest enables), and
/// keep the file compact (no build id, no page alignment in the file,
/// unused functions dropped).
pub const CFLAGS: &[&str] = &[
    "-std=gnu11",
    "-O2",
    "-Wall",
    "-Wextra",
    "-march=x86-64",
    "-mtune=generic",
    "-ffreestanding",
    "-fno-pic",
    "-fno-stack-protector",
    "-fno-stack-clash-protection",
    "-fcf-protection=none",
    "-fno-asynchronous-unwind-tables",
    "-fno-unwind-tables",
    "-ffunction-sections",
    "-fdata-sections",
    "-static",
    "-nostdlib",
    "-no-pie",
    "-Wl,--gc-sections",
    "-Wl,--build-id=none",
    "-Wl,-z,noexecstack",
    "-Wl,-z,norelro",
    "-Wl,-n",
];

/// The SDK's C files linked into every payload (after `start.S`); unused
/// functions are dropped by `--gc-sections`.
pub const SDK_SOURCES: &[&str] = &["hvmm.c", "virtio.c"];

/// Returns the command `cc CFLAGS -I sdk -T sdk/hvmm.ld sdk/start.S
/// sdk/hvmm.c sdk/virtio.c SOURCES -o OUTPUT`.
pub fn command(cc: &OsStr, sdk: &Path, sources: &[&Path], output: &Path) -> Command {
    let mut cmd = Command::new(cc);
    cmd.args(CFLAGS)
        .arg("-I")
        .arg(sdk)
        .arg("-T")
        .arg(sdk.join("hvmm.ld"))
        .arg(sdk.join("start.S"))
        .args(SDK_SOURCES.iter().map(|file| sdk.join(file)))
        .args(sources)
        .arg("-o")
        .arg(output);
    cmd
}

/// The compiler to use: `$CC` if set, else `gcc`.
pub fn cc() -> std::ffi::OsString {
    std::env::var_os("CC")
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "gcc".into())
}

//! Builds every `src/guest/*.c` into a payload ELF in `OUT_DIR` with the
//! system C compiler (`$CC`, default `gcc`); `src/lib.rs` embeds them.

use std::path::{Path, PathBuf};

#[path = "src/gcc.rs"]
mod gcc;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    let sdk = manifest.join("sdk");
    let guest = manifest.join("src/guest");

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/gcc.rs");
    println!("cargo:rerun-if-changed=sdk");
    println!("cargo:rerun-if-changed=src/guest");
    println!("cargo:rerun-if-env-changed=CC");

    let mut sources: Vec<PathBuf> = std::fs::read_dir(&guest)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", guest.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "c"))
        .collect();
    sources.sort();

    let cc = gcc::cc();
    let errors: Vec<String> = std::thread::scope(|scope| {
        let jobs: Vec<_> = sources
            .iter()
            .map(|src| {
                let (cc, sdk, out_dir) = (&cc, &sdk, &out_dir);
                scope.spawn(move || build_one(cc, sdk, src, out_dir))
            })
            .collect();
        jobs.into_iter()
            .filter_map(|job| job.join().unwrap().err())
            .collect()
    });
    if !errors.is_empty() {
        panic!(
            "building the guest payloads failed:\n\n{}\n\
             hint: the payloads are built with the system C compiler \
             ({}; set CC to use another one). On Debian/Ubuntu: apt-get install gcc",
            errors.join("\n"),
            cc.to_string_lossy()
        );
    }
}

/// Compiles one payload into `OUT_DIR/<name>.elf`, forwarding compiler
/// warnings as cargo warnings.
fn build_one(cc: &std::ffi::OsStr, sdk: &Path, src: &Path, out_dir: &Path) -> Result<(), String> {
    let name = src.file_stem().unwrap().to_string_lossy();
    let elf = out_dir.join(format!("{name}.elf"));
    let mut cmd = gcc::command(cc, sdk, &[src], &elf);
    let output = cmd
        .output()
        .map_err(|e| format!("{name}: cannot run {:?}: {e}", cmd.get_program()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "{name}: {cmd:?} failed ({}):\n{stderr}",
            output.status
        ));
    }
    for line in stderr.lines() {
        println!("cargo:warning={name}: {line}");
    }
    Ok(())
}

//! The kernel side of the pageout comparison: seed 001's method (map 256
//! MiB of anonymous memory, write it, time `madvise(MADV_PAGEOUT)`) in a
//! small C program of our own, compiled with gcc at bench time and run on
//! the host against a swap file the bench creates and removes.
//!
//! Two things the seed's program does not do, added because without them
//! the comparison would not be fair:
//! - `MADV_PAGEOUT` returns once the swap writes are *submitted*; the
//!   program also waits until `/proc/meminfo` `Writeback` is back to its
//!   level before the call, because hugevmm's pageout time includes its
//!   writes completing.
//! - It reports whether the pages really left memory (`RssAnon` before and
//!   after, `SwapFree` before and after): a `MADV_PAGEOUT` that silently
//!   does nothing (no swap, pinned pages) must not look fast.
//!
//! It also fills the memory either with zeros (the seed's `memset`, which
//! this kernel swaps out without any I/O: zero-filled pages only get a bit
//! in the swap zeromap) or with the seqwrite payload's pattern (what the
//! guest memory holds in hugevmm's pageout run).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The probe's source. Written for this bench (not the seed's text).
const PROBE_C: &str = r#"/* hugevmm bench pageout probe: write an anonymous region, time
 * madvise(MADV_PAGEOUT), then wait for the swap writes to finish and report
 * whether the pages left memory. Usage: probe MIB zero|pattern plain|thp */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

static double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The number after "key:" in a /proc file (kB for the fields used), or -1. */
static long proc_field(const char *path, const char *key)
{
    char line[256];
    size_t n = strlen(key);
    long v = -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s MIB zero|pattern plain|thp\n", argv[0]);
        return 2;
    }
    size_t len = (size_t)strtoull(argv[1], NULL, 10) << 20;
    int pattern = !strcmp(argv[2], "pattern");
    int thp = !strcmp(argv[3], "thp");

    uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    if (thp && madvise(mem, len, MADV_HUGEPAGE)) {
        perror("madvise(MADV_HUGEPAGE)");
        return 1;
    }
    if (pattern) {
        uint64_t *w = (uint64_t *)mem;
        for (size_t i = 0; i < len / 8; i++)
            w[i] = (uint64_t)(uintptr_t)&w[i] ^ 0x2545f4914f6cdd1dull;
    } else {
        memset(mem, 0, len);
    }

    long wb_before = proc_field("/proc/meminfo", "Writeback");
    long rss_before = proc_field("/proc/self/status", "RssAnon");
    long huge_before = proc_field("/proc/meminfo", "AnonHugePages");
    long swap_before = proc_field("/proc/meminfo", "SwapFree");
    double t0 = ms_now();
    if (madvise(mem, len, MADV_PAGEOUT)) {
        perror("madvise(MADV_PAGEOUT)");
        return 1;
    }
    double t1 = ms_now();
    long rss_after = proc_field("/proc/self/status", "RssAnon");
    double t2;
    int timed_out = 0;
    for (;;) {
        long wb = proc_field("/proc/meminfo", "Writeback");
        t2 = ms_now();
        if (wb <= wb_before)
            break;
        if (t2 - t0 > 30000) {
            timed_out = 1;
            break;
        }
        usleep(200);
    }
    long swap_after = proc_field("/proc/meminfo", "SwapFree");

    size_t pages = len / 4096, resident = 0;
    unsigned char *vec = malloc(pages);
    if (vec && !mincore(mem, len, vec))
        for (size_t i = 0; i < pages; i++)
            resident += vec[i] & 1;

    printf("madvise_ms=%.3f written_ms=%.3f writeback_timed_out=%d "
           "rss_before_kb=%ld rss_after_kb=%ld anon_huge_before_kb=%ld "
           "swapfree_before_kb=%ld swapfree_after_kb=%ld "
           "resident_after_pages=%zu pages=%zu\n",
           t1 - t0, t2 - t0, timed_out, rss_before, rss_after, huge_before,
           swap_before, swap_after, resident, pages);
    munmap(mem, len);
    return 0;
}
"#;

/// The compiled probe in its own temporary directory (removed on drop).
pub struct Probe {
    dir: PathBuf,
    exe: PathBuf,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Probe {
    /// Writes the source to a fresh temporary directory and compiles it.
    pub fn build() -> Result<Probe> {
        let dir = std::env::temp_dir().join(format!("hugevmm-bench-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let probe = Probe {
            exe: dir.join("pageout_probe"),
            dir,
        };
        let src = probe.dir.join("pageout_probe.c");
        std::fs::write(&src, PROBE_C).with_context(|| format!("cannot write {}", src.display()))?;
        let out = Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&probe.exe)
            .arg(&src)
            .output()
            .context("cannot run gcc (install it: apt-get install gcc)")?;
        if !out.status.success() {
            bail!(
                "gcc failed on the pageout probe:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(probe)
    }

    /// Runs the probe once.
    pub fn run(&self, mib: u64, fill: &str, pages: &str) -> Result<KernelPageout> {
        let out = Command::new(&self.exe)
            .args([mib.to_string(), fill.to_string(), pages.to_string()])
            .output()
            .with_context(|| format!("cannot run {}", self.exe.display()))?;
        if !out.status.success() {
            bail!(
                "the pageout probe failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        KernelPageout::parse(&String::from_utf8_lossy(&out.stdout), mib)
    }
}

/// What the probe measured.
#[derive(Debug, Clone, Default)]
pub struct KernelPageout {
    /// The `madvise(MADV_PAGEOUT)` call (the seed's figure), ms.
    pub madvise_ms: f64,
    /// From the call to the end of the swap writes, ms.
    pub written_ms: f64,
    /// The wait for writeback gave up after 30 s.
    pub writeback_timed_out: bool,
    /// Anonymous RSS before the call, KiB.
    pub rss_before_kb: f64,
    /// Anonymous RSS right after the call, KiB.
    pub rss_after_kb: f64,
    /// System AnonHugePages before the call, KiB (THP in use).
    pub anon_huge_before_kb: f64,
    /// SwapFree before, KiB.
    pub swapfree_before_kb: f64,
    /// SwapFree after the writes, KiB.
    pub swapfree_after_kb: f64,
    /// Pages still in memory (swap cache) after the writes.
    pub resident_after_pages: f64,
    /// Pages in the region.
    pub pages: f64,
    /// Region size, MiB.
    pub mib: u64,
}

impl KernelPageout {
    fn parse(line: &str, mib: u64) -> Result<KernelPageout> {
        let mut k = KernelPageout {
            mib,
            ..Default::default()
        };
        let mut seen = 0;
        for word in line.split_whitespace() {
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            let v: f64 = value
                .parse()
                .with_context(|| format!("bad probe output {word:?}"))?;
            seen += 1;
            match key {
                "madvise_ms" => k.madvise_ms = v,
                "written_ms" => k.written_ms = v,
                "writeback_timed_out" => k.writeback_timed_out = v != 0.0,
                "rss_before_kb" => k.rss_before_kb = v,
                "rss_after_kb" => k.rss_after_kb = v,
                "anon_huge_before_kb" => k.anon_huge_before_kb = v,
                "swapfree_before_kb" => k.swapfree_before_kb = v,
                "swapfree_after_kb" => k.swapfree_after_kb = v,
                "resident_after_pages" => k.resident_after_pages = v,
                "pages" => k.pages = v,
                _ => seen -= 1,
            }
        }
        if seen < 10 {
            bail!("unexpected probe output: {line:?}");
        }
        Ok(k)
    }

    /// Share of the region unmapped by the call (RssAnon drop).
    pub fn unmapped_fraction(&self) -> f64 {
        ((self.rss_before_kb - self.rss_after_kb) / (self.mib as f64 * 1024.0)).clamp(0.0, 1.0)
    }

    /// Share of the region that got swap slots (SwapFree drop).
    pub fn swapped_fraction(&self) -> f64 {
        ((self.swapfree_before_kb - self.swapfree_after_kb) / (self.mib as f64 * 1024.0))
            .clamp(0.0, 1.0)
    }

    /// True when the kernel really paged the region out: at least 90% of
    /// it both left the page tables and took swap space.
    pub fn really_paged_out(&self) -> bool {
        self.unmapped_fraction() >= 0.9
            && self.swapped_fraction() >= 0.9
            && !self.writeback_timed_out
    }
}

/// A swap file made for the comparison: `swapoff` and removal on drop,
/// so an error or Ctrl-C (see `interrupt`) still cleans up.
pub struct SwapFile {
    path: PathBuf,
    active: bool,
}

impl SwapFile {
    /// Creates `bytes` of swap file in `dir`, formats it and enables it at
    /// the highest priority (so the kernel uses it before any other swap).
    pub fn create(dir: &Path, bytes: u64) -> Result<SwapFile> {
        let path = dir.join(format!("hugevmm-bench-swap-{}.img", std::process::id()));
        let mut swap = SwapFile {
            path,
            active: false,
        };
        write_zeros(&swap.path, bytes)?;
        run_tool("mkswap", &[swap.path.as_os_str()])?;
        run_tool(
            "swapon",
            &["-p".as_ref(), "32767".as_ref(), swap.path.as_os_str()],
        )?;
        swap.active = true;
        Ok(swap)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if self.active {
            if let Err(e) = run_tool("swapoff", &[self.path.as_os_str()]) {
                eprintln!(
                    "hugevmm bench: WARNING: cannot swapoff {}: {e:#}; run `swapoff {0} && rm {0}` by hand",
                    self.path.display()
                );
                return;
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Writes real zeros (not `fallocate`): every filesystem accepts a swap
/// file without holes or unwritten extents.
fn write_zeros(path: &Path, bytes: u64) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create the swap file {}", path.display()))?;
    let block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .with_context(|| format!("cannot write the swap file {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()
        .with_context(|| format!("cannot sync the swap file {}", path.display()))?;
    Ok(())
}

fn run_tool(tool: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {tool} (util-linux)"))?;
    if !out.status.success() {
        bail!(
            "{tool} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Whether zswap is on: then MADV_PAGEOUT compresses into RAM instead of
/// writing the swap file, which the report must say.
pub fn zswap_enabled() -> bool {
    std::fs::read_to_string("/sys/module/zswap/parameters/enabled").is_ok_and(|s| s.trim() == "Y")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_probe_output_and_judges_it() {
        let line = "madvise_ms=20.5 written_ms=180.0 writeback_timed_out=0 rss_before_kb=262200 rss_after_kb=200 \
                    anon_huge_before_kb=0 swapfree_before_kb=524284 swapfree_after_kb=262140 resident_after_pages=0 pages=65536\n";
        let k = KernelPageout::parse(line, 256).unwrap();
        assert_eq!(k.written_ms, 180.0);
        assert!(k.really_paged_out());
        let noop = KernelPageout {
            rss_after_kb: 262200.0,
            ..k.clone()
        };
        assert!(!noop.really_paged_out());
        assert!(KernelPageout::parse("garbage", 256).is_err());
    }
}

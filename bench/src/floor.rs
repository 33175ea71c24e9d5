//! The floor of a fault's service time, measured in the bench process with
//! the engine's own building blocks and no guest: what one restore costs
//! when nothing else is going on.
//!
//! For a 2 MiB unit restored from a store, per iteration:
//! - fill: give a `MADV_HUGEPAGE` buffer its huge page (touch one byte,
//!   `MADV_COLLAPSE` to confirm), as the engine's buffer pool does;
//! - read: `Store::read` of one slot into that buffer (file store:
//!   O_DIRECT through io_uring plus the crc32 check; memory store:
//!   decompression plus the crc32 check);
//! - move: `UFFDIO_MOVE` of the buffer onto an empty 2 MiB chunk of a
//!   region registered with a userfaultfd, then the wake, as the engine
//!   installs a unit.
//!
//! The floor is the median of the per-iteration sums. The zero-fill floor
//! is fill + move, the staging floor move alone (a parked unit is moved
//! back). For 4 KiB units: a 4 KiB slot read plus `UFFDIO_COPY` of the
//! page, and `UFFDIO_ZEROPAGE` for a never-written page.

use anyhow::{bail, Context, Result};
use guestmem::host::AnonMapping;
use serde_json::{json, Value};
use std::time::Instant;
use swap::store::{Codec, FileStore, MemStore, SharedStore, SlotId, Store, WriteRequest};
use swap::uffd::{mode, CopyOptions, MoveOptions, Uffd, Userfaults};

use super::hist::{median, sample_summary_json};
use super::limits::seqwrite_chunk;
use super::runner::CHUNK_BYTES;
use super::{interrupt, Ctx, Mode};
use guestmem::addr::Hva;
use guestmem::addr::RegionOffset;
use swap::index::StoreKey;

const PAGE: u64 = 4096;

/// Medians (µs) of the parts of one restore.
#[derive(Debug, Clone, Default)]
pub struct Parts {
    /// Store read (with checksum), µs.
    pub read_us: f64,
    /// Huge-page fill of the buffer, µs.
    pub fill_us: f64,
    /// Install (move or copy) plus wake, µs.
    pub install_us: f64,
    /// Median of the per-iteration sums, µs.
    pub total_us: f64,
    /// Per-iteration sums, µs (for percentiles of the floor itself).
    pub totals_us: Vec<f64>,
    /// Per-iteration installs, µs (the staging floor is the move alone).
    pub installs_us: Vec<f64>,
}

impl Parts {
    fn from_samples(read: &[f64], fill: &[f64], install: &[f64]) -> Parts {
        let totals: Vec<f64> = (0..read.len().max(fill.len()).max(install.len()))
            .map(|i| {
                read.get(i).unwrap_or(&0.0)
                    + fill.get(i).unwrap_or(&0.0)
                    + install.get(i).unwrap_or(&0.0)
            })
            .collect();
        Parts {
            read_us: median(read).unwrap_or(0.0),
            fill_us: median(fill).unwrap_or(0.0),
            install_us: median(install).unwrap_or(0.0),
            total_us: median(&totals).unwrap_or(0.0),
            totals_us: totals,
            installs_us: install.to_vec(),
        }
    }

    fn json(&self) -> Value {
        json!({
            "read_us_p50": self.read_us,
            "fill_us_p50": self.fill_us,
            "install_us_p50": self.install_us,
            "floor_us": self.total_us,
            "per_iteration_us": sample_summary_json(&self.totals_us),
        })
    }
}

/// All floors.
#[derive(Debug, Clone, Default)]
pub struct Floors {
    /// 2 MiB from the default (file) store: read + fill + move.
    pub store_file_2m: Parts,
    /// 2 MiB from `mem:lz4`: decompress + fill + move.
    pub store_lz4_2m: Parts,
    /// 2 MiB zero fill: fill + move.
    pub zero_2m: Parts,
    /// 2 MiB hand-back from the parking area: move.
    pub staging_2m: Parts,
    /// 4 KiB from the file store: read + UFFDIO_COPY.
    pub store_file_4k: Parts,
    /// 4 KiB zero: UFFDIO_ZEROPAGE.
    pub zero_4k: Parts,
    /// Whether the moved buffers arrived as one PMD (AnonHugePages).
    pub moved_as_pmd: Option<bool>,
    /// Why the userfaultfd parts could not be measured, if so.
    pub uffd_problem: Option<String>,
}

impl Floors {
    /// As JSON.
    pub fn json(&self) -> Value {
        json!({
            "store_file_2m": self.store_file_2m.json(),
            "store_lz4_2m": self.store_lz4_2m.json(),
            "zero_2m": self.zero_2m.json(),
            "staging_2m": self.staging_2m.json(),
            "store_file_4k": self.store_file_4k.json(),
            "zero_4k": self.zero_4k.json(),
            "moved_as_pmd": self.moved_as_pmd,
            "uffd_problem": self.uffd_problem,
        })
    }
}

fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// A region registered (MISSING) with a fresh userfaultfd: the
/// destination of moves and copies. It is never touched by this thread.
struct Registered {
    uffd: Uffd,
    map: AnonMapping,
}

impl Registered {
    fn new(len: u64, huge: bool) -> Result<Registered> {
        let uffd = Uffd::open(0).context("cannot open a userfaultfd")?;
        if huge && !uffd.has_move() {
            bail!("this kernel's userfaultfd lacks UFFDIO_MOVE");
        }
        let map = AnonMapping::new(len).context("cannot map the destination region")?;
        let r = map.range();
        if huge {
            r.advise_hugepage(RegionOffset::ZERO, r.len())
                .context("madvise(MADV_HUGEPAGE)")?;
        } else {
            r.advise_nohugepage(RegionOffset::ZERO, r.len())
                .context("madvise(MADV_NOHUGEPAGE)")?;
        }
        // SAFETY: the mapping is this measurement's own, reached through raw
        // addresses only; nothing touches a missing page of it (the floor
        // only installs chunks, it never faults on them).
        unsafe { uffd.register(Hva::new(r.base()), r.len(), mode::MISSING) }
            .context("cannot register the destination with the userfaultfd")?;
        Ok(Registered { uffd, map })
    }
}

/// `AnonHugePages` of the mapping holding `addr`, from /proc/self/smaps.
fn anon_huge_kb_at(addr: u64) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                return v.trim().trim_end_matches("kB").trim().parse().ok();
            }
        }
    }
    None
}

fn write_slots(store: &dyn Store, n: usize, unit: u64) -> Result<Vec<SlotId>> {
    let mut slots = Vec::with_capacity(n);
    let chunk = seqwrite_chunk(1 << 32, 0x2545_f491_4f6c_dd1d);
    for batch in (0..n).collect::<Vec<_>>().chunks(8) {
        let reqs: Vec<WriteRequest<'_>> = batch
            .iter()
            .map(|&i| {
                let off = (i as u64 * unit) % CHUNK_BYTES;
                WriteRequest {
                    gpa: StoreKey::new((1 << 32) + i as u64 * unit),
                    data: &chunk[off as usize..(off + unit) as usize],
                }
            })
            .collect();
        for r in store.write_batch(&reqs) {
            slots.push(r.context("writing the floor's store slots")?);
        }
    }
    Ok(slots)
}

/// Fill, read and move, `n` times; `None` store: fill and move only.
fn thp_restores(
    dst: &Registered,
    buf: &AnonMapping,
    store: Option<&dyn Store>,
    slots: &[SlotId],
    n: usize,
) -> Result<(Parts, bool)> {
    let b = buf.range();
    let d = dst.map.range();
    let (mut read, mut fill, mut install) = (Vec::new(), Vec::new(), Vec::new());
    let mut pmd = true;
    for i in 0..n {
        let t = Instant::now();
        b.touch(RegionOffset::ZERO, PAGE);
        if b.collapse(RegionOffset::ZERO, CHUNK_BYTES).is_err() {
            // Not huge: populate every page so the move leaves no hole.
            b.touch(RegionOffset::ZERO, CHUNK_BYTES);
        }
        fill.push(us(t));
        if let Some(store) = store {
            let t = Instant::now();
            // SAFETY: the buffer is a private, populated mapping of this
            // function's caller that nothing else accesses during the call.
            let data = unsafe { b.slice_mut(RegionOffset::ZERO, CHUNK_BYTES) };
            store
                .read(slots[i % slots.len()], StoreKey::new(1 << 32), data)
                .context("floor: store read failed")?;
            read.push(us(t));
        }
        let t = Instant::now();
        let dst_addr = d.base() + (i as u64 % (d.len() / CHUNK_BYTES)) * CHUNK_BYTES;
        let options = MoveOptions {
            allow_src_holes: false,
            dont_wake: true,
        };
        // SAFETY: the buffer and the destination are this measurement's own
        // mappings, reached through raw addresses only.
        unsafe {
            dst.uffd
                .move_pages(Hva::new(dst_addr), Hva::new(b.base()), CHUNK_BYTES, options)
        }
        .context("floor: UFFDIO_MOVE failed")?;
        dst.uffd
            .wake(Hva::new(dst_addr), CHUNK_BYTES)
            .context("floor: UFFDIO_WAKE failed")?;
        install.push(us(t));
        if i == 0 {
            pmd = anon_huge_kb_at(dst_addr).is_some_and(|kb| kb >= 2048);
        }
        // Empty the destination again (frees the huge page) without
        // touching it.
        d.discard(RegionOffset::new(dst_addr - d.base()), CHUNK_BYTES)
            .context("floor: MADV_DONTNEED")?;
    }
    Ok((Parts::from_samples(&read, &fill, &install), pmd))
}

/// Measures every floor. `uffd` parts are skipped (with the reason kept)
/// when no userfaultfd can be opened here.
pub fn measure(ctx: &mut Ctx) -> Result<Floors> {
    let (n2m, n4k) = if ctx.mode == Mode::Quick {
        (24usize, 256usize)
    } else {
        (64, 1024)
    };
    let mut f = Floors::default();

    let file: SharedStore = std::sync::Arc::new(
        FileStore::temporary(
            &ctx.store_dir,
            CHUNK_BYTES as usize,
            n2m as u64 * CHUNK_BYTES,
        )
        .context("floor: cannot open a file store in --store-dir")?,
    );
    let file_slots = write_slots(file.as_ref(), n2m, CHUNK_BYTES)?;
    let lz4: SharedStore = std::sync::Arc::new(MemStore::new(
        Codec::Lz4,
        CHUNK_BYTES as usize,
        n2m as u64,
        None,
    )?);
    let lz4_slots = write_slots(lz4.as_ref(), n2m, CHUNK_BYTES)?;
    interrupt::check()?;

    match Registered::new(4 * CHUNK_BYTES, true) {
        Ok(dst) => {
            let buf = AnonMapping::new(CHUNK_BYTES).context("floor: cannot map the buffer")?;
            buf.range()
                .advise_hugepage(RegionOffset::ZERO, CHUNK_BYTES)
                .context("madvise(MADV_HUGEPAGE)")?;
            // One untimed round warms the code paths and the allocator.
            thp_restores(&dst, &buf, Some(file.as_ref()), &file_slots, 2)?;
            let (p, pmd) = thp_restores(&dst, &buf, Some(file.as_ref()), &file_slots, n2m)?;
            f.store_file_2m = p;
            f.moved_as_pmd = Some(pmd);
            interrupt::check()?;
            f.store_lz4_2m = thp_restores(&dst, &buf, Some(lz4.as_ref()), &lz4_slots, n2m)?.0;
            let zero = thp_restores(&dst, &buf, None, &[], n2m)?.0;
            f.staging_2m = Parts::from_samples(&[], &[], &zero.installs_us);
            f.zero_2m = zero;
        }
        Err(e) => {
            f.uffd_problem = Some(format!("{e:#}"));
            // Still measure the store reads: half the floor is better than
            // none, and the table says what is missing.
            let mut buf = blockio::AlignedBuf::new(CHUNK_BYTES as usize, 4096);
            let mut read = Vec::new();
            for &slot in &file_slots {
                let t = Instant::now();
                file.read(slot, StoreKey::new(1 << 32), &mut buf)?;
                read.push(us(t));
            }
            f.store_file_2m = Parts::from_samples(&read, &[], &[]);
        }
    }
    interrupt::check()?;

    // 4 KiB units.
    let file4k: SharedStore = std::sync::Arc::new(
        FileStore::temporary(&ctx.store_dir, PAGE as usize, n4k as u64 * PAGE)
            .context("floor: cannot open a 4 KiB file store")?,
    );
    let slots4k = write_slots(file4k.as_ref(), n4k, PAGE)?;
    let mut page = blockio::AlignedBuf::new(PAGE as usize, 4096);
    let mut read = Vec::new();
    for &slot in &slots4k {
        let t = Instant::now();
        file4k
            .read(slot, StoreKey::new(1 << 32), &mut page)
            .context("floor: 4 KiB read failed")?;
        read.push(us(t));
    }
    match Registered::new(CHUNK_BYTES, false) {
        Ok(dst) => {
            let d = dst.map.range();
            let (mut copy, mut zero) = (Vec::new(), Vec::new());
            for i in 0..n4k {
                let addr = d.base() + (i as u64 % (d.len() / PAGE)) * PAGE;
                let t = Instant::now();
                dst.uffd
                    .copy(
                        Hva::new(addr),
                        Hva::new(page.as_ptr() as u64),
                        PAGE,
                        CopyOptions {
                            write_protect: false,
                            dont_wake: true,
                        },
                    )
                    .context("floor: UFFDIO_COPY failed")?;
                dst.uffd.wake(Hva::new(addr), PAGE)?;
                copy.push(us(t));
                d.discard(RegionOffset::new(addr - d.base()), PAGE)?;
                let t = Instant::now();
                dst.uffd
                    .zeropage(Hva::new(addr), PAGE, true)
                    .context("floor: UFFDIO_ZEROPAGE failed")?;
                dst.uffd.wake(Hva::new(addr), PAGE)?;
                zero.push(us(t));
                d.discard(RegionOffset::new(addr - d.base()), PAGE)?;
            }
            f.store_file_4k = Parts::from_samples(&read, &[], &copy);
            f.zero_4k = Parts::from_samples(&[], &[], &zero);
        }
        Err(e) => {
            f.uffd_problem.get_or_insert(format!("{e:#}"));
            f.store_file_4k = Parts::from_samples(&read, &[], &[]);
        }
    }
    Ok(f)
}

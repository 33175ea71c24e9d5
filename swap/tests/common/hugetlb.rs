//! Guest RAM on 2 MiB hugetlb pages (a MAP_SHARED memfd with MFD_HUGETLB)
//! for the engine tests, and the pool reservation it needs. Tests skip,
//! saying why, when the pages cannot be reserved.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use swap::engine::{EngineConfig, ManagedRegion, MemoryKind, SwapEngine, SwapError};
use swap::store::SharedStore;

use super::GPA_BASE;

const CHUNK: u64 = 2 << 20;

/// A `/proc/meminfo` figure (kB or pages), 0 when absent.
pub fn meminfo(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Makes sure `pages` free 2 MiB hugetlb pages exist; returns how many
/// pages were added to vm.nr_hugepages (to give back), or why not.
pub fn reserve(pages: u64) -> Result<u64, String> {
    let free = meminfo("HugePages_Free:");
    if free >= pages {
        return Ok(0);
    }
    let path = "/proc/sys/vm/nr_hugepages";
    let total: u64 = std::fs::read_to_string(path)
        .map_err(|e| format!("read {path}: {e}"))?
        .trim()
        .parse()
        .unwrap_or(0);
    let add = pages - free;
    std::fs::write(path, format!("{}", total + add))
        .map_err(|e| format!("write {path} (needs root): {e}"))?;
    if meminfo("HugePages_Free:") < pages {
        let _ = std::fs::write(path, format!("{total}"));
        return Err(format!(
            "the kernel could not reserve {pages} free 2 MiB pages"
        ));
    }
    Ok(add)
}

/// Returns `added` pages to the kernel (what [`reserve`] added).
pub fn give_back(added: u64) {
    if added > 0 {
        let path = "/proc/sys/vm/nr_hugepages";
        if let Ok(total) =
            std::fs::read_to_string(path).map(|t| t.trim().parse::<u64>().unwrap_or(0))
        {
            let _ = std::fs::write(path, format!("{}", total.saturating_sub(added)));
        }
    }
}

/// Hugetlb guest RAM with an engine serving it; stops the engine, unmaps
/// and gives the reserved pages back when dropped.
pub struct HugetlbGuest {
    engine: Option<SwapEngine>,
    base: u64,
    len: u64,
    memfd: Option<OwnedFd>,
    added_pages: u64,
    fatal: Arc<Mutex<Vec<String>>>,
}

impl HugetlbGuest {
    pub fn base(&self) -> u64 {
        self.base
    }
    pub fn engine(&self) -> &SwapEngine {
        self.engine.as_ref().unwrap()
    }
    pub fn memfd(&self) -> i32 {
        self.memfd.as_ref().unwrap().as_raw_fd()
    }
    pub fn fatal_messages(&self) -> Vec<String> {
        self.fatal.lock().unwrap().clone()
    }
}

impl Drop for HugetlbGuest {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.shutdown();
        }
        // SAFETY: unmaps the mapping made in `start_hugetlb_guest`; the
        // engine that served it is stopped and no reference into it lives.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len as usize) };
        // The pages go back to the pool with the memfd, before the pool shrinks.
        drop(self.memfd.take());
        give_back(self.added_pages);
    }
}

/// Maps `chunks` 2 MiB chunks of hugetlb guest RAM and starts an engine on
/// it; `None` (after reporting the skip for `test`) when the host cannot
/// give the pages.
pub fn start_hugetlb_guest(
    test: &str,
    chunks: u64,
    store: SharedStore,
    config: EngineConfig,
) -> Option<HugetlbGuest> {
    let skip = |why: String| {
        test_resources::skip(test, test_resources::Resource::Hugetlb, why);
    };
    let len = chunks * CHUNK;
    // The guest's pages, and a few for the engine's own copies.
    let added_pages = match reserve(chunks + 4) {
        Ok(added) => added,
        Err(why) => {
            skip(why);
            return None;
        }
    };
    // SAFETY: memfd_create with a NUL-terminated name; returns a new fd.
    let fd = unsafe {
        libc::memfd_create(
            c"hugevmm-test".as_ptr(),
            libc::MFD_HUGETLB | libc::MFD_CLOEXEC,
        )
    };
    if fd < 0 {
        skip(format!(
            "memfd_create(MFD_HUGETLB): {}",
            std::io::Error::last_os_error()
        ));
        give_back(added_pages);
        return None;
    }
    // SAFETY: fd was just created and is owned here.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own memfd.
    let sized = unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) };
    assert_eq!(sized, 0);
    // SAFETY: a fresh shared mapping of our memfd, unmapped on drop.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    let base = ptr as u64;
    let region = ManagedRegion {
        host_base: guestmem::addr::Hva::new(base),
        len_bytes: len,
        kind: MemoryKind::Hugetlb {
            memfd: memfd.as_raw_fd(),
        },
        gpa_ranges: vec![(
            swap::index::Gpa::new(GPA_BASE),
            guestmem::addr::RegionOffset::ZERO,
            len,
        )],
    };
    let fatal = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = fatal.clone();
    let engine = SwapEngine::start(
        region,
        store,
        config,
        Box::new(move |e: &SwapError| log.lock().unwrap().push(e.to_string())),
    )
    .unwrap();
    Some(HugetlbGuest {
        engine: Some(engine),
        base,
        len,
        memfd: Some(memfd),
        added_pages,
        fatal,
    })
}

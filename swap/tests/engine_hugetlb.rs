//! Hugetlb backing (MAP_SHARED memfd with MFD_HUGETLB): restore by
//! UFFDIO_COPY of 2 MiB, eviction by write-protect + copy + hole punch.
//! Skips (printing why) when 2 MiB hugetlb pages cannot be reserved.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use common::*;
use swap::engine::{ManagedRegion, MemoryKind, SwapEngine, SwapUnit};

const MB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MB;

fn meminfo(key: &str) -> u64 {
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
fn reserve(pages: u64) -> Result<u64, String> {
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

fn give_back(added: u64) {
    if added > 0 {
        let path = "/proc/sys/vm/nr_hugepages";
        if let Ok(total) =
            std::fs::read_to_string(path).map(|t| t.trim().parse::<u64>().unwrap_or(0))
        {
            let _ = std::fs::write(path, format!("{}", total.saturating_sub(added)));
        }
    }
}

#[test]
fn hugetlb_chunks_round_trip_through_the_store() {
    let chunks = 16u64;
    let len = chunks * CHUNK;
    let added = match reserve(chunks + 4) {
        Ok(added) => added,
        Err(why) => {
            test_resources::skip(
                "hugetlb_chunks_round_trip_through_the_store",
                test_resources::Resource::Hugetlb,
                why,
            );
            return;
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
        test_resources::skip(
            "hugetlb_chunks_round_trip_through_the_store",
            test_resources::Resource::Hugetlb,
            format!(
                "memfd_create(MFD_HUGETLB): {}",
                std::io::Error::last_os_error()
            ),
        );
        give_back(added);
        return;
    }
    // SAFETY: fd was just created and is owned here.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own memfd.
    let sized = unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) };
    assert_eq!(sized, 0);
    // SAFETY: a fresh shared mapping of our memfd, unmapped at the end.
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
        host_base: base,
        len_bytes: len,
        kind: MemoryKind::Hugetlb {
            memfd: memfd.as_raw_fd(),
        },
        gpa_ranges: vec![(GPA_BASE, 0, len)],
    };
    let store = VecStore::new(CHUNK as usize);
    let fatal = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = fatal.clone();
    let engine = SwapEngine::start(
        region,
        store.clone(),
        config(SwapUnit::Huge2M),
        Box::new(move |e: &swap::engine::SwapError| log.lock().unwrap().push(e.to_string())),
    )
    .unwrap();

    std::thread::spawn(move || {
        (0..chunks).for_each(|c| {
            if c % 4 != 3 {
                fill(base + c * CHUNK, CHUNK, c as u8 + 1)
            } else {
                get(base + c * CHUNK);
            }
        })
    })
    .join()
    .unwrap();
    let free_before = meminfo("HugePages_Free:");
    let report = engine.evict_all().unwrap();
    let free_after = meminfo("HugePages_Free:");
    println!("hugetlb evict_all: {report:?}; free huge pages {free_before} -> {free_after}");
    assert_eq!(report.written_units, chunks * 3 / 4);
    assert_eq!(report.zero_units, chunks / 4);
    std::thread::spawn(move || {
        for c in 0..chunks {
            assert!(
                all_equal(
                    base + c * CHUNK,
                    CHUNK,
                    if c % 4 != 3 { c as u8 + 1 } else { 0 }
                ),
                "chunk {c}"
            );
        }
    })
    .join()
    .unwrap();
    let st = engine.stats();
    println!(
        "hugetlb refault: faults {:?}, huge {} split {}, latency p50 {} p99 {} us",
        st.faults,
        st.restored_huge,
        st.restored_split,
        st.fault_latency.p50(),
        st.fault_latency.p99()
    );
    assert_eq!(st.faults.store, chunks * 3 / 4);
    // Write one chunk: only that one is written again.
    std::thread::spawn(move || put(base + 8, 42))
        .join()
        .unwrap();
    let report = engine.evict_all().unwrap();
    println!("hugetlb after one write: {report:?}");
    assert_eq!(report.written_units, 1);
    assert_eq!(report.clean_dropped_units, chunks * 3 / 4 - 1);
    std::thread::spawn(move || assert_eq!(get(base + 8), 42))
        .join()
        .unwrap();
    assert!(fatal.lock().unwrap().is_empty());
    engine.shutdown();
    // SAFETY: unmaps the mapping created above; the engine is stopped.
    unsafe { libc::munmap(ptr, len as usize) };
    drop(memfd);
    give_back(added);
}

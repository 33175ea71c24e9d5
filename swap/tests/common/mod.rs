//! Helpers shared by the swap engine tests: a Vec-backed store that counts
//! operations, guest memory, and an engine launcher.
#![allow(dead_code)]

pub mod hugetlb;
pub mod smaps;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use guestmem::host::AnonMapping;
use swap::engine::{EngineConfig, ManagedRegion, MemoryKind, SwapEngine, SwapError, SwapUnit};
use swap::index::StoreKey;
use swap::store::{SharedStore, SlotId, Store, StoreError, WriteRequest};

/// Guest addresses in tests start here, so messages show a recognisable gpa.
pub const GPA_BASE: u64 = 0x1_0000_0000;

/// A store keeping units in heap vectors; counts writes and reads, can
/// delay writes (to widen race windows) and fail on demand.
pub struct VecStore {
    unit_bytes: usize,
    slots: Mutex<Vec<Option<Vec<u8>>>>,
    pub writes: AtomicU64,
    pub reads: AtomicU64,
    pub write_delay_us: AtomicU64,
    /// Sleeps this long in every read (a slow store, for stall figures).
    pub read_delay_us: AtomicU64,
    pub fail_writes: AtomicBool,
    pub fail_reads: AtomicBool,
}

impl VecStore {
    pub fn new(unit_bytes: usize) -> Arc<VecStore> {
        Arc::new(VecStore {
            unit_bytes,
            slots: Mutex::new(Vec::new()),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            write_delay_us: AtomicU64::new(0),
            read_delay_us: AtomicU64::new(0),
            fail_writes: AtomicBool::new(false),
            fail_reads: AtomicBool::new(false),
        })
    }

    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }
}

impl Store for VecStore {
    fn unit_bytes(&self) -> usize {
        self.unit_bytes
    }
    fn capacity_slots(&self) -> u64 {
        1 << 20
    }
    fn describe(&self) -> String {
        "vec-test-store".into()
    }
    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Vec<Result<SlotId, StoreError>> {
        let delay = self.write_delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        requests
            .iter()
            .map(|r| {
                assert_eq!(r.data.len(), self.unit_bytes);
                if self.fail_writes.load(Ordering::SeqCst) {
                    return Err(StoreError::Io {
                        gpa: r.gpa,
                        slot: SlotId::new(0),
                        source: std::io::Error::from_raw_os_error(libc::EIO),
                    });
                }
                self.writes.fetch_add(1, Ordering::SeqCst);
                let mut slots = self.slots.lock().unwrap();
                let data = r.data.to_vec();
                if let Some(i) = slots.iter().position(|s| s.is_none()) {
                    slots[i] = Some(data);
                    Ok(SlotId::new(i as u32))
                } else {
                    slots.push(Some(data));
                    Ok(SlotId::new((slots.len() - 1) as u32))
                }
            })
            .collect()
    }
    fn read(&self, slot: SlotId, gpa: StoreKey, buf: &mut [u8]) -> Result<(), StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let delay = self.read_delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(StoreError::Io {
                gpa,
                slot,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let slots = self.slots.lock().unwrap();
        match slots.get(slot.index()).and_then(|s| s.as_ref()) {
            Some(data) => {
                buf.copy_from_slice(data);
                Ok(())
            }
            None => Err(StoreError::BadSlot { gpa, slot }),
        }
    }
    fn free(&self, slot: SlotId) {
        let mut slots = self.slots.lock().unwrap();
        assert!(
            slots[slot.index()].take().is_some(),
            "double free of slot {slot}"
        );
    }
    fn used_slots(&self) -> u64 {
        self.slots
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.is_some())
            .count() as u64
    }
}

/// Guest RAM for a test, plus the engine serving it.
pub struct Guest {
    pub mem: AnonMapping,
    pub engine: Option<SwapEngine>,
    pub fatal: Arc<Mutex<Vec<String>>>,
}

impl Guest {
    pub fn base(&self) -> u64 {
        self.mem.range().base()
    }
    pub fn len(&self) -> u64 {
        self.mem.range().len()
    }
    pub fn engine(&self) -> &SwapEngine {
        self.engine.as_ref().unwrap()
    }
    pub fn fatal_messages(&self) -> Vec<String> {
        self.fatal.lock().unwrap().clone()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        // The engine must stop before the memory is unmapped.
        if let Some(engine) = self.engine.take() {
            engine.shutdown();
        }
    }
}

/// Maps `len` bytes of anonymous guest RAM and starts an engine on it.
pub fn start_guest(len: u64, store: SharedStore, config: EngineConfig) -> Guest {
    let mem = AnonMapping::new(len).unwrap();
    let region = ManagedRegion {
        host_base: guestmem::addr::Hva::new(mem.range().base()),
        len_bytes: len,
        kind: MemoryKind::Anonymous,
        gpa_ranges: vec![(
            swap::index::Gpa::new(GPA_BASE),
            guestmem::addr::RegionOffset::ZERO,
            len,
        )],
    };
    let fatal = Arc::new(Mutex::new(Vec::new()));
    let log = fatal.clone();
    let engine = SwapEngine::start(
        region,
        store,
        config,
        Box::new(move |e: &SwapError| {
            eprintln!("on_fatal: {e}");
            log.lock().unwrap().push(e.to_string());
        }),
    )
    .unwrap();
    Guest {
        mem,
        engine: Some(engine),
        fatal,
    }
}

pub fn config(unit: SwapUnit) -> EngineConfig {
    EngineConfig {
        unit,
        fault_threads: 2,
        ..EngineConfig::default()
    }
}

/// Writes `value` into the u64 at `addr` (guest memory: may fault).
pub fn put(addr: u64, value: u64) {
    // SAFETY: test guest memory, mapped for the test's lifetime; faults are
    // served by the engine's threads, not this one.
    unsafe { std::ptr::write_volatile(addr as *mut u64, value) }
}

/// Reads the u64 at `addr` (guest memory: may fault).
pub fn get(addr: u64) -> u64 {
    // SAFETY: as for `put`.
    unsafe { std::ptr::read_volatile(addr as *const u64) }
}

/// Fills `[addr, addr+len)` with `byte` (guest memory: may fault).
pub fn fill(addr: u64, len: u64, byte: u8) {
    // SAFETY: as for `put`.
    unsafe { std::ptr::write_bytes(addr as *mut u8, byte, len as usize) }
}

/// True when every byte of `[addr, addr+len)` equals `byte`.
pub fn all_equal(addr: u64, len: u64, byte: u8) -> bool {
    // SAFETY: as for `put`; the slice is dropped before anything else runs
    // on this thread.
    let data = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    data.iter().all(|&b| b == byte)
}

/// Waits (bounded) for `cond`; returns whether it became true.
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..2000 {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

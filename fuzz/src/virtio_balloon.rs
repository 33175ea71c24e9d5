//! virtio-balloon driven as a guest drives it: the handshake with any
//! subset of its features (which renumbers the queues), then inflate and
//! deflate PFN arrays, statistics reports and free page reports, with the
//! host setting targets and asking for statistics in between. The free
//! memory sink checks what the balloon hands the swap engine: whole 2 MiB
//! chunks of guest RAM only, and 4 KiB-granular reclaims inside RAM.

use std::sync::{Arc, Mutex};

use devices::virtio::{Balloon, MmioTransport};
use devices::FreeMemorySink;
use vm_memory::{Address, GuestAddress};

use crate::input::Input;
use crate::virtio::{guest_memory, transport, Driver, Host, RAM};

const CHUNK: u64 = 2 << 20;
const PAGE: u64 = 4096;

fn in_ram(gpa: u64, len: u64) -> bool {
    RAM.iter().any(|&(start, bytes)| {
        gpa >= start
            && gpa
                .checked_add(len)
                .is_some_and(|end| end <= start + bytes as u64)
    })
}

/// Checks every call against the [`FreeMemorySink`] contract, and keeps
/// the freed ranges.
#[derive(Default)]
struct CheckingSink {
    freed: Mutex<Vec<(u64, u64)>>,
}

impl FreeMemorySink for CheckingSink {
    fn free_range(&self, gpa: GuestAddress, len_bytes: u64) {
        let gpa = gpa.raw_value();
        assert!(
            gpa % CHUNK == 0 && len_bytes % CHUNK == 0 && len_bytes > 0,
            "free_range({gpa:#x}, {len_bytes:#x}) is not whole chunks"
        );
        assert!(
            in_ram(gpa, len_bytes),
            "free_range({gpa:#x}, {len_bytes:#x}) outside RAM"
        );
        self.freed.lock().unwrap().push((gpa, len_bytes));
    }

    fn reclaim_range(&self, gpa: GuestAddress, len_bytes: u64) {
        let gpa = gpa.raw_value();
        assert!(
            gpa % PAGE == 0 && len_bytes % PAGE == 0,
            "reclaim_range({gpa:#x}, {len_bytes:#x}) is not whole pages"
        );
        assert!(
            in_ram(gpa, len_bytes),
            "reclaim_range({gpa:#x}, {len_bytes:#x}) outside RAM"
        );
    }
}

impl Host for Balloon {
    fn host_op(transport: &mut MmioTransport<Self>, selector: u8, arg: u32) {
        match selector % 3 {
            0 => {
                let _ = transport.device_mut().set_target_pages(arg);
            }
            1 => {
                let _ = transport.device_mut().request_stats();
            }
            _ => transport.notify_queue(arg as usize % 5),
        }
    }
}

/// A balloon whose sink checks its calls.
pub fn checked_balloon() -> Balloon {
    Balloon::new(Arc::new(CheckingSink::default()))
}

/// Runs one input: the handshake's features to decline and four queue
/// size shifts, then the driver's operations.
pub fn run(data: &[u8]) {
    exercise(data);
}

/// What a balloon input did: the pages inflated, the ranges handed to the
/// sink, the statistics reports taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Inflated minus deflated pages.
    pub inflated_pages: u64,
    /// `free_range` calls.
    pub freed: Vec<(u64, u64)>,
    /// Statistics reports received.
    pub stats_reports: u64,
}

/// [`run`], returning what the balloon did, for tests of the seeds.
pub fn exercise(data: &[u8]) -> Outcome {
    let mut input = Input::new(data);
    let mem = guest_memory();
    let sink = Arc::new(CheckingSink::default());
    let mut transport = transport(Balloon::new(sink.clone()), &mem);
    let mut driver = Driver::new(&mut transport, &mem);
    let decline = input.u64();
    let shifts: Vec<u8> = (0..4).map(|_| input.u8()).collect();
    driver.handshake(decline, &shifts);
    driver.run(&mut input);
    let balloon = transport.device();
    let _ = balloon.latest_stats().map(|s| s.free_bytes());
    let freed = sink.freed.lock().unwrap().clone();
    Outcome {
        inflated_pages: balloon.inflated_pages(),
        freed,
        stats_reports: balloon.stats_reports(),
    }
}

//! virtio-balloon through the transport, with a driver written by hand.

use std::sync::Arc;

use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INTERRUPT_STATUS, VIRTIO_MMIO_INT_CONFIG};
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::chunk_accumulator::tests::RecordingSink;
use crate::interrupt::CountingLine;
use crate::virtio::balloon_stats::{TAG_FREE_MEMORY, TAG_TOTAL_MEMORY};
use crate::virtio::mmio::MmioTransport;
use crate::virtio::test_support::{memory, TestDriver, TestMemory, TestQueue};

const MIB: u64 = 1 << 20;
const CHUNK: u64 = 2 * MIB;
const PFNS: u64 = 0x2_0000;
const STATS: u64 = 0x3_0000;
const ALL_FEATURES: u64 =
    (1 << 32) | (1 << VIRTIO_BALLOON_F_STATS_VQ) | (1 << VIRTIO_BALLOON_F_REPORTING);

struct Rig {
    transport: MmioTransport<Balloon>,
    sink: Arc<RecordingSink>,
    line: Arc<CountingLine>,
    mem: TestMemory,
}

fn rig() -> Rig {
    let sink = Arc::new(RecordingSink::default());
    let mem = memory();
    let line = Arc::new(CountingLine::new());
    let transport = MmioTransport::new(Balloon::new(sink.clone()), mem.clone(), line.clone());
    Rig {
        transport,
        sink,
        line,
        mem,
    }
}

/// Queues at 0x1000 apart from 0x10000, one per entry of `count`.
fn queues(mem: &TestMemory, count: usize) -> Vec<TestQueue<'_>> {
    (0..count)
        .map(|i| TestQueue::new(mem, 0x1_0000 + i as u64 * 0x1000, 16))
        .collect()
}

fn start(rig: &mut Rig, features: u64, vqs: &[TestQueue<'_>]) {
    let mut driver = TestDriver::new(&mut rig.transport);
    driver.negotiate(features);
    for (i, vq) in vqs.iter().enumerate() {
        driver.setup_queue(i as u32, vq);
    }
    driver.driver_ok();
    assert!(rig.transport.is_active());
}

/// Sends `pfns` on queue `index` in one buffer.
fn send_pfns(rig: &mut Rig, vq: &TestQueue<'_>, index: u32, pfns: &[u32]) {
    let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
    rig.mem.write_slice(&bytes, GuestAddress(PFNS)).unwrap();
    let before = vq.used_count();
    vq.add_chain(&[(PFNS, bytes.len() as u32, false)]);
    TestDriver::new(&mut rig.transport).notify(index);
    assert_eq!(vq.used_count(), before + 1);
}

fn pfn_range(gpa: u64, len: u64) -> Vec<u32> {
    (gpa / 4096..(gpa + len) / 4096).map(|p| p as u32).collect()
}

#[test]
fn inflated_pages_reach_the_sink_as_whole_chunks() {
    let mut rig = rig();
    let mem = rig.mem.clone();
    let vqs = queues(&mem, 2);
    start(&mut rig, 1 << 32, &vqs);
    let chunk = 4 * MIB;
    let pfns = pfn_range(chunk, CHUNK);
    send_pfns(&mut rig, &vqs[0], 0, &pfns[..256]);
    assert!(rig.sink.freed.lock().unwrap().is_empty());
    assert_eq!(
        rig.transport
            .device()
            .accumulator()
            .free_pages_in_chunk(guestmem::GuestAddress(chunk)),
        256
    );
    send_pfns(&mut rig, &vqs[0], 0, &pfns[256..]);
    assert_eq!(*rig.sink.freed.lock().unwrap(), vec![(chunk, CHUNK)]);
    assert_eq!(rig.transport.device().inflated_pages(), 512);

    // Deflate: reclaimed runs, coalesced.
    let back = [
        (chunk / 4096) as u32,
        (chunk / 4096) as u32 + 1,
        (chunk / 4096) as u32 + 7,
    ];
    send_pfns(&mut rig, &vqs[1], 1, &back);
    assert_eq!(
        *rig.sink.reclaimed.lock().unwrap(),
        vec![(chunk, 8192), (chunk + 7 * 4096, 4096)]
    );
    assert_eq!(rig.transport.device().inflated_pages(), 509);
}

#[test]
fn deflated_pages_are_forgotten() {
    let mut rig = rig();
    let mem = rig.mem.clone();
    let vqs = queues(&mem, 2);
    start(&mut rig, 1 << 32, &vqs);
    let pfns = pfn_range(0, CHUNK);
    send_pfns(&mut rig, &vqs[0], 0, &pfns[..511]);
    send_pfns(&mut rig, &vqs[1], 1, &pfns[10..11]);
    send_pfns(&mut rig, &vqs[0], 0, &pfns[511..]);
    assert!(
        rig.sink.freed.lock().unwrap().is_empty(),
        "page 10 was taken back"
    );
    send_pfns(&mut rig, &vqs[0], 0, &pfns[10..11]);
    assert_eq!(*rig.sink.freed.lock().unwrap(), vec![(0, CHUNK)]);
}

#[test]
fn bad_pfn_buffers_are_ignored() {
    let mut rig = rig();
    let mem = rig.mem.clone();
    let vqs = queues(&mem, 2);
    start(&mut rig, 1 << 32, &vqs);
    // PFNs in the hole between the regions, and far outside RAM.
    let mut pfns = pfn_range(8 * MIB, CHUNK);
    pfns.push(u32::MAX);
    send_pfns(&mut rig, &vqs[0], 0, &pfns);
    // A device-writable PFN buffer: wrong direction.
    let good = pfn_range(16 * MIB, CHUNK);
    let bytes: Vec<u8> = good.iter().flat_map(|p| p.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(PFNS)).unwrap();
    vqs[0].add_chain(&[(PFNS, bytes.len() as u32, true)]);
    // A length that is not whole PFNs.
    vqs[0].add_chain(&[(PFNS, 6, false)]);
    TestDriver::new(&mut rig.transport).notify(0);
    assert_eq!(vqs[0].used_count(), 3);
    assert!(rig.sink.freed.lock().unwrap().is_empty());
    assert_eq!(rig.transport.device().inflated_pages(), 0);
    assert!(rig.transport.is_active());
}

#[test]
fn free_page_reports_drop_only_chunks_whole_within_one_chain() {
    let mut rig = rig();
    let mem = rig.mem.clone();
    let vqs = queues(&mem, 4);
    start(&mut rig, ALL_FEATURES, &vqs);
    // Reporting is queue 3 with statistics negotiated.
    let chunk = 18 * MIB;
    vqs[3].add_chain(&[(chunk, MIB as u32, true)]);
    TestDriver::new(&mut rig.transport).notify(3);
    assert_eq!(vqs[3].used_count(), 1);
    assert!(rig.sink.freed.lock().unwrap().is_empty());
    // The other half in a later chain does not complete the chunk: the
    // guest may have reused the first half since the first chain came
    // back. Two halves in one chain do, and so does a whole chunk.
    vqs[3].add_chain(&[(chunk + MIB, MIB as u32, true)]);
    vqs[3].add_chain(&[
        (22 * MIB, MIB as u32, true),
        (23 * MIB, MIB as u32, true),
        (2 * MIB, CHUNK as u32, true),
    ]);
    TestDriver::new(&mut rig.transport).notify(3);
    let mut freed = rig.sink.freed.lock().unwrap().clone();
    freed.sort();
    assert_eq!(freed, vec![(2 * MIB, CHUNK), (22 * MIB, CHUNK)]);
    // Device-readable report buffers are ignored.
    vqs[3].add_chain(&[(6 * MIB, CHUNK as u32, false)]);
    TestDriver::new(&mut rig.transport).notify(3);
    assert_eq!(rig.sink.freed.lock().unwrap().len(), 2);
    assert_eq!(vqs[3].used_count(), 4);
}

#[test]
fn reporting_queue_index_follows_negotiated_features() {
    let mut rig = rig();
    let mem = rig.mem.clone();
    let vqs = queues(&mem, 3);
    start(
        &mut rig,
        (1 << 32) | (1 << VIRTIO_BALLOON_F_REPORTING),
        &vqs,
    );
    vqs[2].add_chain(&[(0, CHUNK as u32, true)]);
    TestDriver::new(&mut rig.transport).notify(2);
    assert_eq!(*rig.sink.freed.lock().unwrap(), vec![(0, CHUNK)]);
}

fn stats_buffer(mem: &TestMemory, entries: &[(u16, u64)]) -> u32 {
    let bytes: Vec<u8> = entries
        .iter()
        .flat_map(|&(tag, value)| {
            [tag.to_le_bytes().to_vec(), value.to_le_bytes().to_vec()].concat()
        })
        .collect();
    mem.write_slice(&bytes, GuestAddress(STATS)).unwrap();
    bytes.len() as u32
}

#[test]
fn statistics_are_kept_and_the_buffer_held_until_requested() {
    let mut rig = rig();
    let mem = rig.mem.clone();
    let vqs = queues(&mem, 3);
    start(&mut rig, (1 << 32) | (1 << VIRTIO_BALLOON_F_STATS_VQ), &vqs);
    assert!(
        !rig.transport.device_mut().request_stats().unwrap(),
        "no buffer yet"
    );
    let len = stats_buffer(
        &mem,
        &[(TAG_FREE_MEMORY, 300 * MIB), (TAG_TOTAL_MEMORY, 512 * MIB)],
    );
    vqs[2].add_chain(&[(STATS, len, false)]);
    TestDriver::new(&mut rig.transport).notify(2);
    assert_eq!(vqs[2].used_count(), 0, "held");
    let stats = rig.transport.device().latest_stats().unwrap();
    assert_eq!(stats.free_bytes(), Some(300 * MIB));
    assert_eq!(stats.total_bytes(), Some(512 * MIB));

    let interrupts = rig.line.count();
    assert!(rig.transport.device_mut().request_stats().unwrap());
    assert_eq!(vqs[2].used_count(), 1);
    assert_eq!(rig.line.count(), interrupts + 1);
    assert!(
        !rig.transport.device_mut().request_stats().unwrap(),
        "already handed back"
    );

    // The driver refills it with new figures.
    let len = stats_buffer(&mem, &[(TAG_FREE_MEMORY, 200 * MIB)]);
    vqs[2].add_chain(&[(STATS, len, false)]);
    TestDriver::new(&mut rig.transport).notify(2);
    assert_eq!(
        rig.transport.device().latest_stats().unwrap().free_bytes(),
        Some(200 * MIB)
    );
    assert_eq!(rig.transport.device().stats_reports(), 2);
}

#[test]
fn target_and_actual_in_the_configuration() {
    let mut rig = rig();
    rig.transport.device_mut().set_target_pages(100).unwrap();
    let mem = rig.mem.clone();
    let vqs = queues(&mem, 2);
    start(&mut rig, 1 << 32, &vqs);
    let mut config = [0u8; 8];
    TestDriver::new(&mut rig.transport).config(0, &mut config);
    assert_eq!(u32::from_le_bytes(config[..4].try_into().unwrap()), 100);

    rig.transport.device_mut().set_target_pages(4096).unwrap();
    let mut driver = TestDriver::new(&mut rig.transport);
    assert_ne!(
        driver.read(VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG,
        0
    );
    driver.config(0, &mut config);
    assert_eq!(u32::from_le_bytes(config[..4].try_into().unwrap()), 4096);
    assert_eq!(rig.line.count(), 1);

    // The driver reports what it holds; num_pages is not writable.
    use crate::bus::MmioDevice;
    rig.transport.write(0x104, &4000u32.to_le_bytes());
    rig.transport.write(0x100, &7u32.to_le_bytes());
    assert_eq!(rig.transport.device().actual_pages(), 4000);
    assert_eq!(rig.transport.device().target_pages(), 4096);
}

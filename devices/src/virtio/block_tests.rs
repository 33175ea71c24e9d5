//! virtio-blk through the transport, with a driver written by hand.

use std::path::PathBuf;
use std::sync::Arc;

use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET;
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_INTERRUPT_STATUS, VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_STATUS,
};
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::interrupt::CountingLine;
use crate::virtio::mmio::MmioTransport;
use crate::virtio::test_support::{memory, TestDriver, TestMemory, TestQueue};

const DISK_BYTES: u64 = 1 << 20;
const QUEUE_BASE: u64 = 0x1_0000;
const HEADER: u64 = 0x2_0000;
const STATUS: u64 = 0x2_1000;
const DATA: u64 = 0x10_0000;
const BACK: u64 = 0x20_0000;
const NEXT: u16 = VRING_DESC_F_NEXT as u16;
const WRITE: u16 = VRING_DESC_F_WRITE as u16;

/// A named image file, removed on drop.
struct TempImage(PathBuf);

impl Drop for TempImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory whose filesystem takes O_DIRECT (tmpfs before 6.6 does not).
fn test_dir() -> PathBuf {
    let probe = std::env::temp_dir().join(format!(".devices-odirect-{}", std::process::id()));
    let ok = std::fs::write(&probe, [0u8; 512]).is_ok()
        && Disk::open(&probe, true).is_ok_and(|d| d.is_direct());
    let _ = std::fs::remove_file(&probe);
    if ok {
        std::env::temp_dir()
    } else {
        PathBuf::from("/var/tmp")
    }
}

fn image(name: &str) -> TempImage {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = test_dir().join(format!("{name}-{}-{n}.img", std::process::id()));
    std::fs::write(&path, vec![0u8; DISK_BYTES as usize]).unwrap();
    TempImage(path)
}

struct Rig {
    transport: MmioTransport<Block>,
    mem: TestMemory,
    line: Arc<CountingLine>,
    _image: TempImage,
}

fn rig_with(disk: impl FnOnce(&std::path::Path) -> Disk) -> Rig {
    let image = image("blk");
    let mem = memory();
    let line = Arc::new(CountingLine::new());
    let block = Block::new(disk(&image.0));
    let transport = MmioTransport::new(block, mem.clone(), line.clone());
    Rig {
        transport,
        mem,
        line,
        _image: image,
    }
}

fn rig(readonly: bool) -> Rig {
    rig_with(|path| Disk::open(path, readonly).unwrap())
}

/// Brings the device up with `vq` as its request queue.
fn start(rig: &mut Rig, vq: &TestQueue<'_>) {
    let mut driver = TestDriver::new(&mut rig.transport);
    let offered = driver.device_features();
    driver.negotiate(offered);
    driver.setup_queue(0, vq);
    driver.driver_ok();
    assert!(rig.transport.is_active());
}

fn header(mem: &TestMemory, request_type: u32, sector: u64) {
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&request_type.to_le_bytes());
    bytes[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&bytes, GuestAddress(HEADER)).unwrap();
    mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
}

/// Submits header + `data` buffers + status, notifies, returns (status,
/// used length).
fn submit(
    rig: &mut Rig,
    vq: &TestQueue<'_>,
    request_type: u32,
    sector: u64,
    data: &[(u64, u32)],
) -> (u8, u32) {
    header(&rig.mem, request_type, sector);
    let device_writes = matches!(request_type, VIRTIO_BLK_T_IN | VIRTIO_BLK_T_GET_ID);
    let mut buffers = vec![(HEADER, 16, false)];
    buffers.extend(data.iter().map(|&(addr, len)| (addr, len, device_writes)));
    buffers.push((STATUS, 1, true));
    let before = vq.used_count();
    vq.add_chain(&buffers);
    TestDriver::new(&mut rig.transport).notify(0);
    assert_eq!(vq.used_count(), before + 1, "request not completed");
    let (_, len) = vq.used(before);
    (rig.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(), len)
}

fn fill(mem: &TestMemory, addr: u64, len: usize, seed: u8) -> Vec<u8> {
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    mem.write_slice(&bytes, GuestAddress(addr)).unwrap();
    bytes
}

fn read_mem(mem: &TestMemory, addr: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    mem.read_slice(&mut bytes, GuestAddress(addr)).unwrap();
    bytes
}

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

#[test]
fn config_and_features() {
    let mut rig = rig(false);
    let mut driver = TestDriver::new(&mut rig.transport);
    let features = driver.device_features();
    assert_ne!(features & (1 << 32), 0, "VERSION_1");
    assert_ne!(features & (1 << VIRTIO_BLK_F_FLUSH), 0);
    assert_ne!(features & (1 << VIRTIO_BLK_F_SEG_MAX), 0);
    assert_eq!(features & (1 << VIRTIO_BLK_F_RO), 0);
    let mut capacity = [0u8; 8];
    driver.config(0, &mut capacity);
    assert_eq!(u64::from_le_bytes(capacity), DISK_BYTES / 512);
    let mut seg_max = [0u8; 4];
    driver.config(12, &mut seg_max);
    assert_eq!(u32::from_le_bytes(seg_max), SEG_MAX);
    assert_eq!(rig.transport.device().capacity_sectors(), DISK_BYTES / 512);
}

#[test]
fn write_then_read_back() {
    let mut rig = rig(false);
    assert!(rig.transport.device().disk().is_direct());
    let mem = rig.mem.clone();
    let vq = TestQueue::new(&mem, QUEUE_BASE, 16);
    start(&mut rig, &vq);
    let written = fill(&mem, DATA, 8192, 7);
    assert_eq!(
        submit(
            &mut rig,
            &vq,
            VIRTIO_BLK_T_OUT,
            16,
            &[(DATA, 4096), (DATA + 4096, 4096)]
        ),
        (OK, 1)
    );
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_IN, 16, &[(BACK, 8192)]),
        (OK, 8193)
    );
    assert_eq!(read_mem(&mem, BACK, 8192), written);
    // A read of part of it, at an offset.
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_IN, 17, &[(BACK, 512)]),
        (OK, 513)
    );
    assert_eq!(read_mem(&mem, BACK, 512), written[512..1024]);
    assert!(rig.line.count() >= 3);
    // The data really is in the file.
    let file = std::fs::read(&rig._image.0).unwrap();
    assert_eq!(&file[16 * 512..16 * 512 + 8192], &written[..]);
}

#[test]
fn unaligned_guest_buffers_round_trip() {
    for try_direct in [true, false] {
        let mut rig = rig_with(|path| Disk::open_with(path, false, try_direct).unwrap());
        let mem = rig.mem.clone();
        let vq = TestQueue::new(&mem, QUEUE_BASE, 16);
        start(&mut rig, &vq);
        // Odd addresses, odd splits: 3 + 509 + 1536 bytes.
        let written = fill(&mem, DATA + 3, 2048, 11);
        let pieces = [(DATA + 3, 3), (DATA + 6, 509), (DATA + 515, 1536)];
        assert_eq!(
            submit(&mut rig, &vq, VIRTIO_BLK_T_OUT, 3, &pieces),
            (OK, 1),
            "direct={try_direct}"
        );
        let back = [(BACK + 7, 1000), (BACK + 1007, 1048)];
        assert_eq!(submit(&mut rig, &vq, VIRTIO_BLK_T_IN, 3, &back), (OK, 2049));
        assert_eq!(
            read_mem(&mem, BACK + 7, 2048),
            written,
            "direct={try_direct}"
        );
        // Aligned reads see the same bytes.
        assert_eq!(
            submit(&mut rig, &vq, VIRTIO_BLK_T_IN, 3, &[(BACK, 2048)]),
            (OK, 2049)
        );
        assert_eq!(read_mem(&mem, BACK, 2048), written);
        let disk = rig.transport.device().disk();
        let counts = disk.path_counts();
        if !try_direct {
            assert_eq!(counts.direct_transfers, 0);
            assert_eq!(counts.buffered_transfers, 3);
            continue;
        }
        // Whole sectors at misaligned guest addresses: O_DIRECT through
        // bounce buffers, where the file's direct-I/O granularity allows.
        let written = fill(&mem, DATA + 5, 1536, 13);
        let pieces = [(DATA + 5, 512), (DATA + 517, 1024)];
        assert_eq!(submit(&mut rig, &vq, VIRTIO_BLK_T_OUT, 8, &pieces), (OK, 1));
        assert_eq!(
            submit(&mut rig, &vq, VIRTIO_BLK_T_IN, 8, &[(BACK + 1, 1536)]),
            (OK, 1537)
        );
        assert_eq!(read_mem(&mem, BACK + 1, 1536), written);
        let after = rig.transport.device().disk().path_counts();
        if rig.transport.device().disk().direct_align_bytes() <= 512 {
            assert_eq!(
                after.direct_transfers,
                counts.direct_transfers + 2,
                "{after:?}"
            );
            assert_eq!(after.bounced_pieces, counts.bounced_pieces + 3, "{after:?}");
        } else {
            eprintln!(
                "direct-I/O granularity {} > 512: bounce path not reached",
                rig.transport.device().disk().direct_align_bytes()
            );
        }
    }
}

#[test]
fn flush_and_get_id() {
    let mut rig = rig(false);
    let mem = rig.mem.clone();
    let vq = TestQueue::new(&mem, QUEUE_BASE, 16);
    start(&mut rig, &vq);
    assert_eq!(submit(&mut rig, &vq, VIRTIO_BLK_T_FLUSH, 0, &[]), (OK, 1));
    mem.write_slice(&[0xaa; 32], GuestAddress(BACK)).unwrap();
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_GET_ID, 0, &[(BACK, 32)]),
        (OK, 21)
    );
    let id = read_mem(&mem, BACK, 20);
    assert!(id.starts_with(b"blk-"), "{id:?}");
    assert_eq!(
        read_mem(&mem, BACK + 20, 1),
        [0xaa],
        "nothing past 20 bytes"
    );
    // A short buffer gets what fits.
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_GET_ID, 0, &[(BACK, 4)]),
        (OK, 5)
    );
}

#[test]
fn readonly_disk_refuses_writes() {
    let mut rig = rig(true);
    let mem = rig.mem.clone();
    let vq = TestQueue::new(&mem, QUEUE_BASE, 16);
    let features = TestDriver::new(&mut rig.transport).device_features();
    assert_ne!(features & (1 << VIRTIO_BLK_F_RO), 0);
    assert_eq!(features & (1 << VIRTIO_BLK_F_DISCARD), 0);
    start(&mut rig, &vq);
    fill(&mem, DATA, 512, 1);
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_OUT, 0, &[(DATA, 512)]).0,
        IOERR
    );
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_IN, 0, &[(BACK, 512)]).0,
        OK
    );
    assert_eq!(read_mem(&mem, BACK, 512), vec![0u8; 512]);
    assert_eq!(submit(&mut rig, &vq, VIRTIO_BLK_T_FLUSH, 0, &[]).0, OK);
}

#[test]
fn out_of_range_and_odd_requests_fail_with_a_status() {
    let mut rig = rig(false);
    let mem = rig.mem.clone();
    let vq = TestQueue::new(&mem, QUEUE_BASE, 16);
    start(&mut rig, &vq);
    let last = DISK_BYTES / 512 - 1;
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_IN, last, &[(BACK, 512)]).0,
        OK
    );
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_IN, last, &[(BACK, 1024)]),
        (IOERR, 1)
    );
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_OUT, last + 1, &[(DATA, 512)]).0,
        IOERR
    );
    assert_eq!(
        submit(
            &mut rig,
            &vq,
            VIRTIO_BLK_T_IN,
            u64::MAX / 256,
            &[(BACK, 512)]
        )
        .0,
        IOERR
    );
    // Not whole sectors.
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_IN, 0, &[(BACK, 100)]).0,
        IOERR
    );
    // Over the per-request cap: 3 x 6 MiB (the same guest buffer thrice).
    let big = [(DATA, 6 << 20), (DATA, 6 << 20), (DATA, 6 << 20)];
    assert_eq!(submit(&mut rig, &vq, VIRTIO_BLK_T_OUT, 0, &big).0, IOERR);
    // Unknown request types.
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_SCSI_CMD, 0, &[]).0,
        UNSUPP
    );
    assert_eq!(submit(&mut rig, &vq, 0xdead, 0, &[]).0, UNSUPP);
    // A header that does not fit: 8 readable bytes, then the status.
    mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let before = vq.used_count();
    vq.add_chain(&[(HEADER, 8, false), (STATUS, 1, true)]);
    TestDriver::new(&mut rig.transport).notify(0);
    assert_eq!(vq.used_count(), before + 1);
    assert_eq!(mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(), IOERR);
    assert!(
        rig.transport.is_active(),
        "request errors keep the device working"
    );
}

#[test]
fn discard_and_write_zeroes_punch_holes() {
    let mut rig = rig(false);
    if !rig.transport.device().disk().can_discard() {
        test_resources::skip(
            "discard_and_write_zeroes_punch_holes",
            test_resources::Resource::HolePunch,
            "the test filesystem cannot punch holes",
        );
        return;
    }
    let mem = rig.mem.clone();
    let vq = TestQueue::new(&mem, QUEUE_BASE, 16);
    start(&mut rig, &vq);
    let written = fill(&mem, DATA, 16384, 3);
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_OUT, 0, &[(DATA, 16384)]).0,
        OK
    );
    let segment = |sector: u64, sectors: u32, flags: u32| {
        let mut s = sector.to_le_bytes().to_vec();
        s.extend(sectors.to_le_bytes());
        s.extend(flags.to_le_bytes());
        s
    };
    mem.write_slice(&segment(8, 8, 0), GuestAddress(DATA + 0x10000))
        .unwrap();
    assert_eq!(
        submit(
            &mut rig,
            &vq,
            VIRTIO_BLK_T_DISCARD,
            0,
            &[(DATA + 0x10000, 16)]
        )
        .0,
        OK
    );
    mem.write_slice(
        &segment(24, 8, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP),
        GuestAddress(DATA + 0x10000),
    )
    .unwrap();
    assert_eq!(
        submit(
            &mut rig,
            &vq,
            VIRTIO_BLK_T_WRITE_ZEROES,
            0,
            &[(DATA + 0x10000, 16)]
        )
        .0,
        OK
    );
    assert_eq!(
        submit(&mut rig, &vq, VIRTIO_BLK_T_IN, 0, &[(BACK, 16384)]).0,
        OK
    );
    let back = read_mem(&mem, BACK, 16384);
    assert_eq!(back[..4096], written[..4096]);
    assert!(back[4096..8192].iter().all(|&b| b == 0));
    assert_eq!(back[8192..12288], written[8192..12288]);
    assert!(back[12288..].iter().all(|&b| b == 0));
    // Discard with the unmap flag is refused; past the end is an error.
    mem.write_slice(
        &segment(0, 8, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP),
        GuestAddress(DATA + 0x10000),
    )
    .unwrap();
    assert_eq!(
        submit(
            &mut rig,
            &vq,
            VIRTIO_BLK_T_DISCARD,
            0,
            &[(DATA + 0x10000, 16)]
        )
        .0,
        UNSUPP
    );
    mem.write_slice(
        &segment(DISK_BYTES / 512, 8, 0),
        GuestAddress(DATA + 0x10000),
    )
    .unwrap();
    assert_eq!(
        submit(
            &mut rig,
            &vq,
            VIRTIO_BLK_T_DISCARD,
            0,
            &[(DATA + 0x10000, 16)]
        )
        .0,
        IOERR
    );
}

/// Publishes a chain written by hand and checks the device went broken
/// without touching the status byte.
fn assert_breaks(build: impl FnOnce(&TestQueue<'_>, &TestMemory) -> u16) {
    let mut rig = rig(false);
    let mem = rig.mem.clone();
    let vq = TestQueue::new(&mem, QUEUE_BASE, 16);
    start(&mut rig, &vq);
    header(&mem, VIRTIO_BLK_T_IN, 0);
    let head = build(&vq, &mem);
    vq.publish(head);
    let mut driver = TestDriver::new(&mut rig.transport);
    driver.notify(0);
    assert_ne!(
        driver.read(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET,
        0
    );
    assert_ne!(
        driver.read(VIRTIO_MMIO_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG,
        0
    );
    assert_eq!(mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(), 0xff);
    assert!(!rig.transport.is_active());
    assert_eq!(rig.line.count(), 1);
}

#[test]
fn a_looping_chain_breaks_the_device() {
    assert_breaks(|vq, _| {
        vq.set_desc(0, HEADER, 16, NEXT, 1);
        vq.set_desc(1, BACK, 512, WRITE | NEXT, 2);
        vq.set_desc(2, STATUS, 1, WRITE | NEXT, 1);
        0
    });
}

#[test]
fn a_buffer_outside_ram_breaks_the_device() {
    // 8 MiB is the hole between the two RAM regions.
    assert_breaks(|vq, _| {
        vq.set_desc(0, HEADER, 16, NEXT, 1);
        vq.set_desc(1, 9 << 20, 512, WRITE | NEXT, 2);
        vq.set_desc(2, STATUS, 1, WRITE, 0);
        0
    });
    // One that starts in RAM and runs past its region's end.
    assert_breaks(|vq, _| {
        vq.set_desc(0, HEADER, 16, NEXT, 1);
        vq.set_desc(1, (8 << 20) - 512, 1024, WRITE | NEXT, 2);
        vq.set_desc(2, STATUS, 1, WRITE, 0);
        0
    });
}

#[test]
fn wrong_direction_breaks_the_device() {
    // The data buffer of a read is device-readable after the writable
    // status: readable after writable.
    assert_breaks(|vq, _| {
        vq.set_desc(0, HEADER, 16, NEXT, 1);
        vq.set_desc(1, STATUS, 1, WRITE | NEXT, 2);
        vq.set_desc(2, BACK, 512, NEXT, 3);
        vq.set_desc(3, STATUS, 1, WRITE, 0);
        0
    });
}

#[test]
fn a_missing_status_breaks_the_device() {
    assert_breaks(|vq, _| {
        vq.set_desc(0, HEADER, 16, NEXT, 1);
        vq.set_desc(1, DATA, 512, 0, 0);
        0
    });
}

#[test]
fn an_overlong_indirect_chain_breaks_the_device() {
    // 300 descriptors in an indirect table: more than the device takes.
    assert_breaks(|vq, mem| {
        let table = 0x30_0000u64;
        let count = 300u16;
        for i in 0..count {
            let (addr, len, flags) = match i {
                0 => (HEADER, 16, NEXT),
                i if i == count - 1 => (STATUS, 1, WRITE),
                _ => (BACK + u64::from(i) * 512, 512, WRITE | NEXT),
            };
            let desc = [
                addr.to_le_bytes().to_vec(),
                (len as u32).to_le_bytes().to_vec(),
                flags.to_le_bytes().to_vec(),
                (i + 1).to_le_bytes().to_vec(),
            ]
            .concat();
            mem.write_slice(&desc, GuestAddress(table + u64::from(i) * 16))
                .unwrap();
        }
        vq.set_desc(
            0,
            table,
            u32::from(count) * 16,
            VRING_DESC_F_INDIRECT as u16,
            0,
        );
        0
    });
}

#[test]
fn a_head_index_outside_the_table_breaks_the_device() {
    assert_breaks(|_, _| 200);
}

#[test]
fn the_device_works_again_after_a_reset() {
    let mut rig = rig(false);
    let mem = rig.mem.clone();
    let vq = TestQueue::new(&mem, QUEUE_BASE, 16);
    start(&mut rig, &vq);
    vq.set_desc(0, HEADER, 16, 0, 0);
    vq.publish(0);
    TestDriver::new(&mut rig.transport).notify(0);
    assert!(!rig.transport.is_active());
    let vq = TestQueue::new(&mem, QUEUE_BASE + 0x8000, 16);
    start(&mut rig, &vq);
    assert_eq!(submit(&mut rig, &vq, VIRTIO_BLK_T_FLUSH, 0, &[]), (OK, 1));
}

#[test]
fn the_same_writable_disk_twice_is_refused_and_kept() {
    let img = image("lock-rw");
    std::fs::write(&img.0, vec![0x5au8; DISK_BYTES as usize]).unwrap();
    let first = Disk::open(&img.0, false).unwrap();
    for readonly in [false, true] {
        let err = Disk::open(&img.0, readonly).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, DiskError::Lock(_)), "{text}");
        assert!(text.contains(&img.0.display().to_string()), "{text}");
        assert!(text.contains("--disk"), "{text}");
        assert!(text.contains("in use"), "{text}");
    }
    drop(first);
    assert!(
        std::fs::read(&img.0).unwrap() == vec![0x5au8; DISK_BYTES as usize],
        "a refused disk must be unchanged"
    );
    // The lock goes with the disk.
    Disk::open(&img.0, false).unwrap();
}

#[test]
fn read_only_disks_share_and_exclude_a_writer() {
    let img = image("lock-ro");
    let a = Disk::open(&img.0, true).unwrap();
    let b = Disk::open(&img.0, true).unwrap();
    assert!(matches!(Disk::open(&img.0, false), Err(DiskError::Lock(_))));
    drop((a, b));
}

#[test]
fn a_disk_locked_by_someone_else_is_refused() {
    let img = image("lock-other");
    std::fs::write(&img.0, vec![7u8; DISK_BYTES as usize]).unwrap();
    let other = std::fs::File::open(&img.0).unwrap();
    blockio::lockfile::lock(
        &other,
        &img.0,
        blockio::lockfile::LockMode::Exclusive,
        "the swap store",
    )
    .unwrap();
    let err = Disk::open(&img.0, true).unwrap_err();
    assert!(matches!(err, DiskError::Lock(_)), "{err}");
    assert!(std::fs::read(&img.0).unwrap() == vec![7u8; DISK_BYTES as usize]);
}

#[test]
fn a_disk_and_a_swap_store_cannot_share_a_file() {
    use swap::store::{FileOptions, FileStore, StoreOpenError};
    let img = image("lock-store");
    std::fs::write(&img.0, vec![9u8; DISK_BYTES as usize]).unwrap();
    let overwrite = FileOptions { overwrite: true };
    let opts = blockio::BlockOptions::default();
    // Disk first: the store is refused by the lock.
    let disk = Disk::open(&img.0, false).unwrap();
    let err = FileStore::create_with(&img.0, 4096, 1 << 20, overwrite, &opts).unwrap_err();
    assert!(matches!(err, StoreOpenError::Lock(_)), "{err}");
    drop(disk);
    // Store first (the order hugevmm run uses): the disk is refused.
    let store = FileStore::create_with(&img.0, 4096, 1 << 20, overwrite, &opts).unwrap();
    let err = Disk::open(&img.0, false).unwrap_err();
    assert!(matches!(err, DiskError::Lock(_)), "{err}");
    drop(store);
    assert!(
        std::fs::read(&img.0).unwrap() == vec![9u8; DISK_BYTES as usize],
        "neither may change the file"
    );
}

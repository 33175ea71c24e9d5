//! virtio-blk driven as a guest drives it: the handshake, then request
//! chains (header, data, status in any layout the fuzzer makes, indirect
//! tables included) on the request queue, notifications and register
//! accesses in between. The disk is a 64 KiB file (read-write or
//! read-only), rewritten before every input so runs repeat.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use devices::virtio::{Block, Disk, MmioTransport};
use vm_memory::GuestMemoryMmap;

use crate::input::Input;
use crate::virtio::{guest_memory, transport, Driver, Host};

/// The disk image's size.
pub const DISK_BYTES: usize = 64 << 10;

/// The disk image: an unlinked temporary file, reopened for each input
/// through `/proc/self/fd` (a `Disk` opens a path, and takes its own lock).
pub(crate) fn disk_path() -> PathBuf {
    static FILE: OnceLock<File> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("hugevmm-fuzz-disk-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("create the fuzz disk image");
        std::fs::remove_file(&path).expect("unlink the fuzz disk image");
        file
    });
    let content: Vec<u8> = (0..DISK_BYTES)
        .map(|i| (i / 512) as u8 ^ (i as u8))
        .collect();
    file.set_len(DISK_BYTES as u64).expect("size the fuzz disk");
    file.write_all_at(&content, 0).expect("fill the fuzz disk");
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

impl Host for Block {
    fn host_op(transport: &mut MmioTransport<Self>, selector: u8, arg: u32) {
        match selector % 2 {
            // A notification through the ioeventfd path instead of MMIO.
            0 => transport.notify_queue(arg as usize % 2),
            _ => {
                let _ = transport.device().io_error_count();
            }
        }
    }
}

/// Runs one input: a byte whose low bit makes the disk read-only, the
/// handshake's features to decline and queue size shift, then the
/// driver's operations.
pub fn run(data: &[u8]) {
    exercise(data);
}

/// [`run`], returning the used ring's entries (head, bytes written) and
/// guest RAM, for tests that check what a seed reaches.
pub fn exercise(data: &[u8]) -> (Vec<(u32, u32)>, Arc<GuestMemoryMmap<()>>) {
    let mut input = Input::new(data);
    let readonly = input.u8() & 1 == 1;
    let disk = Disk::open_with(&disk_path(), readonly, false).expect("open the fuzz disk");
    let capacity_sectors = disk.capacity_bytes() / 512;
    let mem = guest_memory();
    let mut transport = transport(Block::new(disk), &mem);
    assert_eq!(transport.device().capacity_sectors(), capacity_sectors);
    let mut driver = Driver::new(&mut transport, &mem);
    let decline = input.u64();
    let shift = input.u8();
    driver.handshake(decline, &[shift]);
    driver.run(&mut input);
    check_used_ring(&driver);
    let used = (0..driver.used_idx(0)).map(|i| driver.used(0, i)).collect();
    (used, mem)
}

/// Every used entry names a descriptor of the queue: a driver trusts it to
/// find its request.
fn check_used_ring(driver: &Driver<'_, Block>) {
    let size = driver.sizes[0];
    if size == 0 || !driver.transport.is_active() {
        return;
    }
    let used = driver.used_idx(0);
    for i in used.saturating_sub(size)..used {
        let (id, _) = driver.used(0, i);
        assert!(
            id < u32::from(size),
            "used entry {i}: head {id} of a {size}-entry queue"
        );
    }
}

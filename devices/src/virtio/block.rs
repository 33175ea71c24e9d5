//! virtio-blk: one request queue over a raw disk image.
//!
//! Requests are handled synchronously, one after the other, on the thread
//! that delivers the queue notification. Each request's descriptors are
//! checked first ([`super::chain`]); a chain that is malformed, or that has
//! no writable byte for the status, leaves the device needing a reset,
//! because the request cannot be failed in a way the driver would see. A
//! well-formed request that asks for something impossible (past the end of
//! the disk, over [`MAX_REQUEST_BYTES`], a write to a read-only disk) gets
//! status IOERR; an unknown request type gets UNSUPP.

use std::mem::offset_of;
use std::sync::Arc;

use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use virtio_queue::{DescriptorChain, Queue};

use guestmem::GuestMemoryView;

use super::block_disk::{Disk, DiskError, SECTOR_BYTES};
use super::block_spec::DiskSpec;
use super::chain::{parse_chain, stream_slice, ChainError, ParsedChain};
use super::device::{read_config_bytes, VirtioDevice};
use super::error::VirtioError;
use super::interrupt::VirtioInterrupt;
use super::queue_drain::{drain_queue, Disposition};
use crate::memory::GuestMemoryHandle;

/// Entries of the request queue.
const QUEUE_SIZE: u16 = 256;
/// Data segments per request announced to the driver (the chain adds the
/// header and the status).
const SEG_MAX: u32 = 126;
/// Largest data segment announced to the driver.
const SIZE_MAX_BYTES: u32 = 128 << 10;
/// Largest data transfer of one request; with the announced limits a
/// driver stays below it (126 x 128 KiB).
pub const MAX_REQUEST_BYTES: u64 = 16 << 20;
/// Descriptors accepted in one chain: a whole queue's worth, which covers
/// any layout of header, data and status a driver may choose.
const MAX_CHAIN_DESCRIPTORS: usize = QUEUE_SIZE as usize;
/// Bytes of the request header (type, ioprio, sector).
const HEADER_BYTES: u64 = 16;
/// Bytes of one discard / write-zeroes segment (sector, sectors, flags).
const DISCARD_SEGMENT_BYTES: u64 = 16;
/// Discard / write-zeroes segments per request.
const MAX_DISCARD_SEGMENTS: u32 = 16;
/// Sectors per discard / write-zeroes segment.
const MAX_DISCARD_SECTORS: u32 = 4 << 20;
/// Discard granularity in sectors: a filesystem block, where hole punching
/// actually frees space.
const DISCARD_ALIGN_SECTORS: u32 = 8;
/// Size of the configuration space served: through `write_zeroes_may_unmap`
/// and its padding.
const CONFIG_BYTES: usize = offset_of!(virtio_blk_config, max_secure_erase_sectors);
/// I/O errors reported on stderr before going quiet.
const REPORTED_IO_ERRORS: u64 = 5;

const STATUS_OK: u8 = VIRTIO_BLK_S_OK as u8;
const STATUS_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const STATUS_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// The virtio-blk device.
pub struct Block {
    disk: Disk,
    id: [u8; VIRTIO_BLK_ID_BYTES as usize],
    features: u64,
    config: Vec<u8>,
    active: Option<Active>,
    io_errors: u64,
}

/// What the device holds between activation and reset.
struct Active {
    memory: GuestMemoryHandle,
    queue: Queue,
    interrupt: Arc<VirtioInterrupt>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("disk", &self.disk)
            .field("active", &self.active.is_some())
            .field("io_errors", &self.io_errors)
            .finish()
    }
}

/// A request's result: status byte and data bytes written to the guest.
struct Outcome {
    status: u8,
    written_bytes: u32,
}

impl Outcome {
    fn status(status: u8) -> Self {
        Self {
            status,
            written_bytes: 0,
        }
    }
}

impl Block {
    /// Opens the image named by `spec`.
    pub fn open(spec: &DiskSpec) -> Result<Block, DiskError> {
        let disk = match (&spec.nbd, &spec.vhost_user) {
            (Some(nbd), _) => Disk::open_nbd(nbd, spec.readonly)?,
            (None, Some(vhost_user)) => Disk::open_vhost_user(vhost_user, spec.readonly)?,
            (None, None) => Disk::open(&spec.path, spec.readonly)?,
        };
        Ok(Block::new(disk))
    }

    /// A device over an open disk.
    pub fn new(disk: Disk) -> Block {
        let mut features = (1u64 << VIRTIO_BLK_F_FLUSH)
            | (1 << VIRTIO_BLK_F_SEG_MAX)
            | (1 << VIRTIO_BLK_F_SIZE_MAX)
            | (1 << VIRTIO_BLK_F_BLK_SIZE)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC);
        if disk.is_readonly() {
            features |= 1 << VIRTIO_BLK_F_RO;
        }
        if disk.can_discard() {
            features |= (1 << VIRTIO_BLK_F_DISCARD) | (1 << VIRTIO_BLK_F_WRITE_ZEROES);
        }
        let config = build_config(&disk);
        let id = disk_id(&disk);
        Block {
            disk,
            id,
            features,
            config,
            active: None,
            io_errors: 0,
        }
    }

    /// Disk size in 512-byte sectors.
    pub fn capacity_sectors(&self) -> u64 {
        self.disk.capacity_bytes() / SECTOR_BYTES
    }

    /// The disk.
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// Requests that failed with an I/O error so far.
    pub fn io_error_count(&self) -> u64 {
        self.io_errors
    }
}

/// The configuration space: capacity, limits, block size, discard limits.
fn build_config(disk: &Disk) -> Vec<u8> {
    let mut config = vec![0u8; CONFIG_BYTES];
    let mut put =
        |offset: usize, bytes: &[u8]| config[offset..offset + bytes.len()].copy_from_slice(bytes);
    put(
        offset_of!(virtio_blk_config, capacity),
        &(disk.capacity_bytes() / SECTOR_BYTES).to_le_bytes(),
    );
    put(
        offset_of!(virtio_blk_config, size_max),
        &SIZE_MAX_BYTES.to_le_bytes(),
    );
    put(
        offset_of!(virtio_blk_config, seg_max),
        &SEG_MAX.to_le_bytes(),
    );
    // The direct-I/O granularity as logical block size keeps the guest's
    // requests on the O_DIRECT path; 512 to 4096 is what drivers accept.
    let blk_size = (disk.direct_align_bytes() as u32).clamp(SECTOR_BYTES as u32, 4096);
    put(
        offset_of!(virtio_blk_config, blk_size),
        &blk_size.to_le_bytes(),
    );
    if disk.can_discard() {
        put(
            offset_of!(virtio_blk_config, max_discard_sectors),
            &MAX_DISCARD_SECTORS.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, max_discard_seg),
            &MAX_DISCARD_SEGMENTS.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, discard_sector_alignment),
            &DISCARD_ALIGN_SECTORS.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, max_write_zeroes_sectors),
            &MAX_DISCARD_SECTORS.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, max_write_zeroes_seg),
            &MAX_DISCARD_SEGMENTS.to_le_bytes(),
        );
        put(offset_of!(virtio_blk_config, write_zeroes_may_unmap), &[1]);
    }
    config
}

/// The 20-byte serial the guest sees (e.g. `/sys/block/vda/serial`): the
/// image's file name, cut to fit.
fn disk_id(disk: &Disk) -> [u8; VIRTIO_BLK_ID_BYTES as usize] {
    let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
    // An NBD disk's "path" is its URI, whose last component is no name.
    let nbd_name = disk.nbd_export().map(|e| format!("nbd:{e}"));
    let name = match &nbd_name {
        Some(n) => n.as_bytes(),
        None => disk
            .path()
            .file_name()
            .map(|n| n.as_encoded_bytes())
            .unwrap_or(b"hugevmm-disk"),
    };
    let count = name.len().min(id.len());
    id[..count].copy_from_slice(&name[..count]);
    id
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // Only the write-cache toggle is writable in virtio-blk, and it is
        // not offered.
    }

    fn activate(
        &mut self,
        _acked_features: u64,
        memory: GuestMemoryHandle,
        mut queues: Vec<Queue>,
        interrupt: Arc<VirtioInterrupt>,
    ) -> Result<(), VirtioError> {
        let queue = queues.pop().ok_or(VirtioError::QueueInvalid { index: 0 })?;
        self.active = Some(Active {
            memory,
            queue,
            interrupt,
        });
        Ok(())
    }

    fn process_queue(&mut self, index: usize) -> Result<(), VirtioError> {
        let Block {
            disk,
            id,
            active,
            io_errors,
            ..
        } = self;
        let Some(active) = active.as_mut() else {
            return Ok(());
        };
        if index != 0 {
            return Ok(());
        }
        let memory = active.memory.clone();
        let mem = memory.memory();
        let mut requests = Requests {
            disk,
            id,
            io_errors,
            mem,
        };
        drain_queue(&mut active.queue, index, mem, &active.interrupt, |chain| {
            requests.handle(chain)
        })
    }

    fn reset(&mut self) {
        self.active = None;
    }
}

/// Request processing, borrowing what it needs from [`Block`].
struct Requests<'a> {
    disk: &'a Disk,
    id: &'a [u8],
    io_errors: &'a mut u64,
    mem: &'a GuestMemoryView,
}

impl Requests<'_> {
    fn handle(
        &mut self,
        chain: DescriptorChain<&GuestMemoryView>,
    ) -> Result<Disposition, VirtioError> {
        let broken = |source| VirtioError::Chain { index: 0, source };
        let parsed = parse_chain(chain, self.mem, MAX_CHAIN_DESCRIPTORS).map_err(broken)?;
        let writable_bytes = parsed.writable_len_bytes();
        if writable_bytes == 0 {
            return Err(broken(ChainError::NoStatus));
        }
        let outcome = self.execute(&parsed, writable_bytes - 1);
        parsed
            .write_at(self.mem, writable_bytes - 1, &[outcome.status])
            .map_err(broken)?;
        Ok(Disposition::Used(outcome.written_bytes + 1))
    }

    /// Runs the request; `data_in_bytes` is the writable space before the
    /// status byte.
    fn execute(&mut self, parsed: &ParsedChain, data_in_bytes: u64) -> Outcome {
        let mut header = [0u8; HEADER_BYTES as usize];
        if parsed.read_at(self.mem, 0, &mut header).is_err() {
            return Outcome::status(STATUS_IOERR);
        }
        let request_type = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let sector = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let data_out_bytes = parsed.readable_len_bytes() - HEADER_BYTES;
        match request_type {
            VIRTIO_BLK_T_IN => self.read(parsed, sector, data_in_bytes),
            VIRTIO_BLK_T_OUT => self.write(parsed, sector, data_out_bytes),
            VIRTIO_BLK_T_FLUSH => self.io_status(self.disk.flush()),
            VIRTIO_BLK_T_GET_ID => self.get_id(parsed, data_in_bytes),
            VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES if self.disk.can_discard() => {
                self.discard(parsed, request_type, data_out_bytes)
            }
            _ => Outcome::status(STATUS_UNSUPP),
        }
    }

    /// The byte offset of `[sector, +len_bytes)` if that is a valid
    /// transfer inside the disk.
    fn disk_offset(&self, sector: u64, len_bytes: u64, max_bytes: u64) -> Option<u64> {
        if len_bytes % SECTOR_BYTES != 0 || len_bytes > max_bytes {
            return None;
        }
        let offset = sector.checked_mul(SECTOR_BYTES)?;
        let end = offset.checked_add(len_bytes)?;
        (end <= self.disk.capacity_bytes()).then_some(offset)
    }

    fn read(&mut self, parsed: &ParsedChain, sector: u64, len_bytes: u64) -> Outcome {
        let Some(offset) = self.disk_offset(sector, len_bytes, MAX_REQUEST_BYTES) else {
            return Outcome::status(STATUS_IOERR);
        };
        let Ok(ranges) = stream_slice(&parsed.writable, 0, len_bytes) else {
            return Outcome::status(STATUS_IOERR);
        };
        match self.disk.read(self.mem, offset, &ranges) {
            Ok(()) => Outcome {
                status: STATUS_OK,
                // At most MAX_REQUEST_BYTES.
                written_bytes: len_bytes as u32,
            },
            Err(err) => self.io_error(err),
        }
    }

    fn write(&mut self, parsed: &ParsedChain, sector: u64, len_bytes: u64) -> Outcome {
        if self.disk.is_readonly() {
            return Outcome::status(STATUS_IOERR);
        }
        let Some(offset) = self.disk_offset(sector, len_bytes, MAX_REQUEST_BYTES) else {
            return Outcome::status(STATUS_IOERR);
        };
        let Ok(ranges) = stream_slice(&parsed.readable, HEADER_BYTES, len_bytes) else {
            return Outcome::status(STATUS_IOERR);
        };
        let result = self.disk.write(self.mem, offset, &ranges);
        self.io_status(result)
    }

    fn get_id(&mut self, parsed: &ParsedChain, space_bytes: u64) -> Outcome {
        let count = self.id.len().min(space_bytes as usize);
        match parsed.write_at(self.mem, 0, &self.id[..count]) {
            Ok(()) => Outcome {
                status: STATUS_OK,
                written_bytes: count as u32,
            },
            Err(_) => Outcome::status(STATUS_IOERR),
        }
    }

    fn discard(&mut self, parsed: &ParsedChain, request_type: u32, len_bytes: u64) -> Outcome {
        if self.disk.is_readonly() {
            return Outcome::status(STATUS_IOERR);
        }
        let segments = len_bytes / DISCARD_SEGMENT_BYTES;
        if len_bytes % DISCARD_SEGMENT_BYTES != 0
            || segments == 0
            || segments > u64::from(MAX_DISCARD_SEGMENTS)
        {
            return Outcome::status(STATUS_UNSUPP);
        }
        // Only write-zeroes may carry the unmap flag; unknown flags are
        // refused as the spec asks.
        let allowed_flags = if request_type == VIRTIO_BLK_T_WRITE_ZEROES {
            VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
        } else {
            0
        };
        let mut ranges = Vec::with_capacity(segments as usize);
        for i in 0..segments {
            let mut segment = [0u8; DISCARD_SEGMENT_BYTES as usize];
            if parsed
                .read_at(
                    self.mem,
                    HEADER_BYTES + i * DISCARD_SEGMENT_BYTES,
                    &mut segment,
                )
                .is_err()
            {
                return Outcome::status(STATUS_IOERR);
            }
            let sector = u64::from_le_bytes(segment[0..8].try_into().expect("8 bytes"));
            let sectors = u32::from_le_bytes(segment[8..12].try_into().expect("4 bytes"));
            let flags = u32::from_le_bytes(segment[12..16].try_into().expect("4 bytes"));
            if flags & !allowed_flags != 0 {
                return Outcome::status(STATUS_UNSUPP);
            }
            let len = u64::from(sectors) * SECTOR_BYTES;
            let max_bytes = u64::from(MAX_DISCARD_SECTORS) * SECTOR_BYTES;
            let Some(offset) = self.disk_offset(sector, len, max_bytes) else {
                return Outcome::status(STATUS_IOERR);
            };
            ranges.push((offset, len));
        }
        // Punching a hole reads back as zeros, which is what write-zeroes
        // promises too, with or without unmap.
        for (offset, len) in ranges {
            if len > 0 {
                let result = self.disk.discard(offset, len);
                if let Err(err) = result {
                    return self.io_error(err);
                }
            }
        }
        Outcome::status(STATUS_OK)
    }

    fn io_status(&mut self, result: Result<(), DiskError>) -> Outcome {
        match result {
            Ok(()) => Outcome::status(STATUS_OK),
            Err(err) => self.io_error(err),
        }
    }

    fn io_error(&mut self, err: DiskError) -> Outcome {
        *self.io_errors += 1;
        if *self.io_errors <= REPORTED_IO_ERRORS {
            log::warn!(
                "virtio-blk {}: {err}{}",
                self.disk.path().display(),
                if *self.io_errors == REPORTED_IO_ERRORS {
                    " (further I/O errors are counted, not printed)"
                } else {
                    ""
                }
            );
        }
        Outcome::status(STATUS_IOERR)
    }
}

#[cfg(test)]
#[path = "block_tests.rs"]
mod tests;

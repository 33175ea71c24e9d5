//! The disk behind virtio-blk: a raw image read and written between file
//! offsets and guest RAM through `blockio` (O_DIRECT + io_uring).
//!
//! O_DIRECT wants file offsets, lengths and memory addresses aligned. A
//! request whose guest buffers are misaligned in memory only goes through
//! an aligned bounce buffer; a request whose file offsets or lengths are
//! misaligned (a 512-byte sector on a filesystem with 4 KiB direct-I/O
//! granularity) goes whole through a second, buffered descriptor of the
//! same file. Requests are issued one after the other, and Linux keeps
//! direct and buffered I/O of one file coherent when they do not overlap
//! in time: direct I/O writes back and drops cached pages of its range.
//! A filesystem that refuses O_DIRECT (tmpfs) gets the buffered path only.
//!
//! An NBD export ([`Disk::open_nbd`]) is one `blockio` block file on the
//! NBD transport in the buffered role: it takes any alignment down to the
//! server's minimum block size, its writes are durable when they complete
//! (FUA or a covering flush, see `blockio::nbd`), and discards are
//! `NBD_CMD_WRITE_ZEROES` so that a discarded range reads as zeros, as
//! virtio-blk's write-zeroes promises. It is not locked: keeping other
//! clients off an export is the server's business. A vhost-user-blk
//! backend's device ([`Disk::open_vhost_user`]) is the same, on that
//! transport: its discards are `VIRTIO_BLK_T_WRITE_ZEROES`, and a guest
//! flush is a `VIRTIO_BLK_T_FLUSH` to the backend.

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use blockio::lockfile::{self, LockError, LockMode};
use blockio::nbd::{NbdOptions, DEFAULT_RECONNECT_TIMEOUT};
use blockio::vhost_user_blk::VhostUserBlkOptions;
use blockio::{AlignedBuf, BlockFile, BlockIoError, BlockOptions, OpKind, RawBlockOp};
use std::time::Duration;

use super::block_spec::{NbdDisk, VhostUserDisk};
use vm_memory::{Address, Bytes, GuestMemoryBackend};

use guestmem::GuestMemoryView;

use super::chain::GuestRange;

/// The virtio-blk sector size; capacity and request offsets count in it.
pub const SECTOR_BYTES: u64 = 512;

/// Why opening or using a disk failed.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The image could not be opened.
    #[error("cannot open disk image {}: {source}; check that it exists and is readable{}", path.display(), if *readonly { "" } else { " and writable (or add ,readonly)" })]
    Open {
        /// The image.
        path: PathBuf,
        /// Whether it was opened read-only.
        readonly: bool,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The image holds less than one sector.
    #[error("disk image {} is smaller than one {SECTOR_BYTES}-byte sector", path.display())]
    Empty {
        /// The image.
        path: PathBuf,
    },
    /// The image is in use by another VM, or by this one (another
    /// `--disk`, the swap store).
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The block backend failed.
    #[error(transparent)]
    Block(#[from] BlockIoError),
    /// A guest buffer is not in guest RAM (callers check this first).
    #[error("guest buffer [{gpa:#x}, +{len_bytes:#x}) is not in guest RAM")]
    GuestMemory {
        /// Start of the buffer.
        gpa: u64,
        /// Its length.
        len_bytes: u32,
    },
}

/// A raw disk image opened for virtio-blk.
pub struct Disk {
    path: PathBuf,
    /// O_DIRECT descriptor; None where the filesystem refuses O_DIRECT.
    direct: Option<BlockFile>,
    /// Page-cache descriptor for requests O_DIRECT cannot take.
    buffered: BlockFile,
    capacity_bytes: u64,
    readonly: bool,
    can_discard: bool,
    counters: Counters,
}

/// How transfers went, for tests and for tuning.
#[derive(Debug, Default)]
struct Counters {
    direct_transfers: AtomicU64,
    bounced_pieces: AtomicU64,
    buffered_transfers: AtomicU64,
}

/// How a disk's transfers were carried out so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskPathCounts {
    /// Transfers issued with O_DIRECT.
    pub direct_transfers: u64,
    /// Guest buffers of those that went through a bounce buffer because
    /// their memory address was misaligned.
    pub bounced_pieces: u64,
    /// Transfers issued through the page cache.
    pub buffered_transfers: u64,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("path", &self.path)
            .field("direct", &self.direct.is_some())
            .field("capacity_bytes", &self.capacity_bytes)
            .field("readonly", &self.readonly)
            .finish()
    }
}

/// One piece of a transfer: a guest buffer and where it goes in the file.
struct Piece {
    range: GuestRange,
    host_addr: *mut u8,
    file_offset: u64,
}

impl Disk {
    /// Opens the image at `path`, read-only or read-write, with O_DIRECT
    /// where the filesystem takes it. Its size, rounded down to whole
    /// sectors, is the disk's capacity.
    pub fn open(path: &Path, readonly: bool) -> Result<Disk, DiskError> {
        Self::open_with(path, readonly, true)
    }

    /// [`Disk::open`], choosing whether to try O_DIRECT at all; without it
    /// every request goes through the page cache.
    ///
    /// The image is locked (`flock`: shared when read-only, exclusive
    /// otherwise) before anything else, so a second VM, or this one naming
    /// the same file twice or as its swap store, is refused with the file
    /// unchanged.
    pub fn open_with(path: &Path, readonly: bool, try_direct: bool) -> Result<Disk, DiskError> {
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(!readonly)
                .open(path)
                .map_err(|source| DiskError::Open {
                    path: path.to_owned(),
                    readonly,
                    source,
                })
        };
        // One ring each: requests are processed one at a time per device.
        let options = BlockOptions {
            rings: 1,
            ..BlockOptions::default()
        };
        let first = open()?;
        let mode = if readonly {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        };
        // Only this descriptor is locked: a second open file description
        // of ours would conflict with our own flock. The direct one below is
        // opened after the lock is held and closed with it, so no other
        // user can come in between.
        lockfile::lock(&first, path, mode, "--disk")?;
        let buffered = BlockFile::from_file(
            first,
            path.to_owned(),
            &BlockOptions {
                direct: false,
                ..options.clone()
            },
        )?;
        let direct = if try_direct {
            match BlockFile::from_file(open()?, path.to_owned(), &options) {
                Ok(file) => Some(file),
                Err(BlockIoError::DirectIoUnsupported { .. }) => None,
                Err(err) => return Err(err.into()),
            }
        } else {
            None
        };
        let len_bytes = buffered.len_bytes()?;
        let capacity_bytes = len_bytes - len_bytes % SECTOR_BYTES;
        if capacity_bytes == 0 {
            return Err(DiskError::Empty {
                path: path.to_owned(),
            });
        }
        let can_discard = !readonly && probe_discard(&buffered, len_bytes);
        Ok(Disk {
            path: path.to_owned(),
            direct,
            buffered,
            capacity_bytes,
            readonly,
            can_discard,
            counters: Counters::default(),
        })
    }

    /// Connects to the NBD export `nbd` names. Its size, rounded down to
    /// whole sectors, is the disk's capacity; discard is offered where the
    /// server takes `NBD_CMD_WRITE_ZEROES`.
    pub fn open_nbd(nbd: &NbdDisk, readonly: bool) -> Result<Disk, DiskError> {
        let file = BlockFile::open_nbd(
            &nbd.uri,
            &NbdOptions {
                reconnect_timeout: nbd
                    .timeout_secs
                    .map_or(DEFAULT_RECONNECT_TIMEOUT, Duration::from_secs),
                read_only: readonly,
            },
        )?;
        let path = PathBuf::from(nbd.uri.to_string());
        if file.offset_align_bytes() as u64 > SECTOR_BYTES {
            return Err(DiskError::Block(BlockIoError::Nbd {
                uri: nbd.uri.to_string(),
                reason: format!(
                    "its minimum block size is {} bytes, larger than the {SECTOR_BYTES}-byte sector the guest may write",
                    file.offset_align_bytes()
                ),
            }));
        }
        let export = *file.nbd().expect("an NBD block file").export();
        let capacity_bytes = export.size_bytes - export.size_bytes % SECTOR_BYTES;
        if capacity_bytes == 0 {
            return Err(DiskError::Empty { path });
        }
        Ok(Disk {
            path,
            direct: None,
            buffered: file,
            capacity_bytes,
            readonly,
            can_discard: !readonly && export.can_write_zeroes(),
            counters: Counters::default(),
        })
    }

    /// Connects to the vhost-user-blk backend on `disk.socket`. Its
    /// capacity is the disk's; discard is offered where the device takes
    /// write-zeroes.
    pub fn open_vhost_user(disk: &VhostUserDisk, readonly: bool) -> Result<Disk, DiskError> {
        let defaults = VhostUserBlkOptions::default();
        let file = BlockFile::open_vhost_user_blk(
            &disk.socket,
            &VhostUserBlkOptions {
                timeout: disk
                    .timeout_secs
                    .map_or(defaults.timeout, Duration::from_secs),
                read_only: readonly,
                ..defaults
            },
        )?;
        if file.offset_align_bytes() as u64 > SECTOR_BYTES {
            return Err(DiskError::Block(BlockIoError::VhostUser {
                path: disk.socket.clone(),
                reason: format!(
                    "its block size is {} bytes, larger than the {SECTOR_BYTES}-byte sector the guest may write (qemu-storage-daemon: drop logical-block-size=)",
                    file.offset_align_bytes()
                ),
            }));
        }
        let client = file.vhost_user_blk().expect("a vhost-user-blk block file");
        let capacity_bytes = client.capacity_bytes();
        let can_discard = !readonly && client.can_write_zeroes();
        Ok(Disk {
            path: disk.socket.clone(),
            direct: None,
            buffered: file,
            capacity_bytes,
            readonly,
            can_discard,
            counters: Counters::default(),
        })
    }

    /// The export's name, when the disk is an NBD export.
    pub fn nbd_export(&self) -> Option<&str> {
        self.buffered.nbd().map(|c| c.uri().export.as_str())
    }

    /// The image path (the URI of an NBD export).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size in bytes, a multiple of [`SECTOR_BYTES`].
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Whether the image was opened read-only.
    pub fn is_readonly(&self) -> bool {
        self.readonly
    }

    /// Whether O_DIRECT is in use (false on filesystems that refuse it).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Whether ranges can be given back to the storage (hole punching).
    pub fn can_discard(&self) -> bool {
        self.can_discard
    }

    /// The direct-I/O granularity of file offsets and lengths (1 without
    /// O_DIRECT): requests aligned to it avoid the buffered path.
    pub fn direct_align_bytes(&self) -> usize {
        self.direct
            .as_ref()
            .map_or(1, BlockFile::offset_align_bytes)
    }

    /// How transfers were carried out so far.
    pub fn path_counts(&self) -> DiskPathCounts {
        DiskPathCounts {
            direct_transfers: self.counters.direct_transfers.load(Ordering::Relaxed),
            bounced_pieces: self.counters.bounced_pieces.load(Ordering::Relaxed),
            buffered_transfers: self.counters.buffered_transfers.load(Ordering::Relaxed),
        }
    }

    /// Fills the guest buffers `ranges`, in order, from the image at
    /// `offset`. The caller has checked that the range is inside the disk.
    pub fn read(
        &self,
        mem: &GuestMemoryView,
        offset: u64,
        ranges: &[GuestRange],
    ) -> Result<(), DiskError> {
        self.transfer(OpKind::Read, mem, offset, ranges)
    }

    /// Writes the guest buffers `ranges`, in order, to the image at `offset`.
    pub fn write(
        &self,
        mem: &GuestMemoryView,
        offset: u64,
        ranges: &[GuestRange],
    ) -> Result<(), DiskError> {
        self.transfer(OpKind::Write, mem, offset, ranges)
    }

    /// Makes completed writes durable.
    pub fn flush(&self) -> Result<(), DiskError> {
        // fdatasync covers the inode, so dirty pages written through the
        // buffered descriptor are included.
        Ok(self.buffered.flush()?)
    }

    /// Gives `[offset, offset + len_bytes)` back to the storage; it then
    /// reads as zeros.
    pub fn discard(&self, offset: u64, len_bytes: u64) -> Result<(), DiskError> {
        Ok(self.buffered.discard(offset, len_bytes)?)
    }

    fn transfer(
        &self,
        kind: OpKind,
        mem: &GuestMemoryView,
        offset: u64,
        ranges: &[GuestRange],
    ) -> Result<(), DiskError> {
        let mut pieces = Vec::with_capacity(ranges.len());
        let mut file_offset = offset;
        for &range in ranges {
            let slice = mem
                .get_slice(range.gpa, range.len_bytes as usize)
                .map_err(|_| DiskError::GuestMemory {
                    gpa: range.gpa.raw_value(),
                    len_bytes: range.len_bytes,
                })?;
            pieces.push(Piece {
                range,
                host_addr: slice.ptr_guard_mut().as_ptr(),
                file_offset,
            });
            file_offset += u64::from(range.len_bytes);
        }
        match &self.direct {
            Some(direct) if file_aligned(direct, &pieces) => {
                self.counters
                    .direct_transfers
                    .fetch_add(1, Ordering::Relaxed);
                let bounced = transfer_direct(direct, kind, mem, &pieces)?;
                self.counters
                    .bounced_pieces
                    .fetch_add(bounced, Ordering::Relaxed);
                Ok(())
            }
            _ => {
                self.counters
                    .buffered_transfers
                    .fetch_add(1, Ordering::Relaxed);
                if file_aligned(&self.buffered, &pieces) {
                    transfer_plain(&self.buffered, kind, &pieces)
                } else {
                    transfer_gathered(&self.buffered, kind, mem, &pieces)
                }
            }
        }
    }
}

/// The whole request as one transfer through one buffer: for a transport
/// whose requests must be whole blocks (a vhost-user-blk device takes
/// 512-byte sectors) while the guest's segments need not be (virtio-blk
/// only asks that the request's total be whole sectors).
fn transfer_gathered(
    file: &BlockFile,
    kind: OpKind,
    mem: &GuestMemoryView,
    pieces: &[Piece],
) -> Result<(), DiskError> {
    let total: usize = pieces.iter().map(|p| p.range.len_bytes as usize).sum();
    let mut buf = AlignedBuf::new(total, file.mem_align_bytes().max(1));
    let mut at = 0;
    if kind == OpKind::Write {
        for piece in pieces {
            let len = piece.range.len_bytes as usize;
            read_guest(mem, piece.range, &mut buf[at..at + len])?;
            at += len;
        }
    }
    let offset = pieces.first().map_or(0, |p| p.file_offset);
    match kind {
        OpKind::Write => file.write_at(offset, &buf)?,
        OpKind::Read => {
            file.read_at(offset, &mut buf)?;
            for piece in pieces {
                let len = piece.range.len_bytes as usize;
                write_guest(mem, piece.range, &buf[at..at + len])?;
                at += len;
            }
        }
    }
    Ok(())
}

/// Whether every piece's file offset and length suit O_DIRECT.
fn file_aligned(file: &BlockFile, pieces: &[Piece]) -> bool {
    let align = file.offset_align_bytes() as u64;
    pieces
        .iter()
        .all(|p| p.file_offset % align == 0 && u64::from(p.range.len_bytes) % align == 0)
}

/// O_DIRECT transfer; pieces whose guest buffer is misaligned in memory go
/// through bounce buffers. Returns how many did.
fn transfer_direct(
    file: &BlockFile,
    kind: OpKind,
    mem: &GuestMemoryView,
    pieces: &[Piece],
) -> Result<u64, DiskError> {
    let mem_align = file.mem_align_bytes();
    let mut bounces: Vec<(usize, AlignedBuf)> = Vec::new();
    let mut ops = Vec::with_capacity(pieces.len());
    for (i, piece) in pieces.iter().enumerate() {
        let len = piece.range.len_bytes as usize;
        let addr = if piece.host_addr as usize % mem_align == 0 {
            piece.host_addr
        } else {
            let mut bounce = AlignedBuf::new(len, mem_align);
            if kind == OpKind::Write {
                read_guest(mem, piece.range, &mut bounce)?;
            }
            let addr = bounce.as_mut_ptr();
            bounces.push((i, bounce));
            addr
        };
        ops.push(RawBlockOp {
            kind,
            offset: piece.file_offset,
            addr,
            len_bytes: len,
        });
    }
    // SAFETY: each op's buffer is either guest RAM that `mem` checked to be
    // mapped for its whole length (get_slice) and that stays mapped while
    // `mem` is borrowed, or a bounce buffer owned by `bounces`, which lives
    // until after this call and is not touched during it. Guest RAM is never
    // behind a Rust reference, so the kernel filling it concurrently with a
    // guest vCPU cannot break Rust's aliasing rules; what the guest sees
    // then is its own race.
    let results = unsafe { file.submit_raw(&ops) };
    for result in results {
        result?;
    }
    if kind == OpKind::Read {
        for (i, bounce) in &bounces {
            write_guest(mem, pieces[*i].range, bounce)?;
        }
    }
    Ok(bounces.len() as u64)
}

/// Transfer through the buffered descriptor, which takes any alignment.
fn transfer_plain(file: &BlockFile, kind: OpKind, pieces: &[Piece]) -> Result<(), DiskError> {
    let ops: Vec<RawBlockOp> = pieces
        .iter()
        .map(|p| RawBlockOp {
            kind,
            offset: p.file_offset,
            addr: p.host_addr,
            len_bytes: p.range.len_bytes as usize,
        })
        .collect();
    // SAFETY: every buffer is guest RAM checked by get_slice to be mapped
    // for its whole length, and it stays mapped while the caller's `mem`
    // borrow lasts, which covers this call; see transfer_direct on guest
    // vCPUs touching it meanwhile.
    let results = unsafe { file.submit_raw(&ops) };
    for result in results {
        result?;
    }
    Ok(())
}

fn read_guest(mem: &GuestMemoryView, range: GuestRange, buf: &mut [u8]) -> Result<(), DiskError> {
    mem.read_slice(buf, range.gpa)
        .map_err(|_| DiskError::GuestMemory {
            gpa: range.gpa.raw_value(),
            len_bytes: range.len_bytes,
        })
}

fn write_guest(mem: &GuestMemoryView, range: GuestRange, buf: &[u8]) -> Result<(), DiskError> {
    mem.write_slice(buf, range.gpa)
        .map_err(|_| DiskError::GuestMemory {
            gpa: range.gpa.raw_value(),
            len_bytes: range.len_bytes,
        })
}

/// Whether hole punching works on this file: punching past the end of a
/// regular file changes nothing where it is supported. Block devices take
/// it (the kernel zeroes or discards).
fn probe_discard(file: &BlockFile, len_bytes: u64) -> bool {
    if file.is_block_device() {
        return true;
    }
    let beyond_end = len_bytes.div_ceil(4096) * 4096 + 4096;
    file.discard(beyond_end, 4096).is_ok()
}

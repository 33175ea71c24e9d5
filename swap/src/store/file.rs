//! The file store: a raw image of unit-sized slots in a file or block
//! device, read and written `O_DIRECT` through [`blockio`].
//!
//! Slot `n` lives at byte `n * unit_bytes`. The image holds no metadata: the
//! slot table and one crc32 per slot stay in memory, since the image only
//! has to outlive swapping within one run of the VMM. With
//! [`FileStore::set_integrity`] and a sealer (`--swap-encrypt`), each slot
//! (or page of a paged slot) is sealed instead: the image holds only
//! ciphertext, and the generation and tag stay in memory in place of the
//! crc32 ([`super::seal`]). Every store on a [`BlockFile`] (a local file,
//! a block device, a network transport) gets this by being a `FileStore`.
//!
//! The file is not preallocated; it grows as higher slots are first written.
//! The default capacity is the guest's whole RAM, and reserving that much
//! disk up front for a store that may never hold more than a few chunks would
//! make large overcommit experiments fail for no reason. The cost is that a
//! full filesystem shows up late, as `ENOSPC` on a write, which becomes
//! [`StoreError::FilesystemFull`] (naming the filesystem's free space) for
//! that unit; [`FileStore::reserve_capacity`] (`,reserve`) allocates it all
//! at start instead. Freed slots keep their blocks (no hole punching): the
//! allocator hands out the lowest free slot next, so they are reused soon,
//! and overwriting allocated blocks is the cheapest write.
//!
//! A named store never destroys what it did not create: without
//! [`FileOptions::overwrite`] only a new file is made (`O_EXCL`). With it,
//! an existing file or block device is locked first, and a regular file is
//! truncated (and made mode 0600) only before the first unit is written, so
//! a VM that fails to start (say, because a `--disk` names the same file and
//! cannot lock it) leaves it as it was. The store does that on its first
//! write, on whatever thread makes it, unless its owner did it first
//! through [`OldContent::cut`]: a VMM whose writing threads run under
//! seccomp filters that forbid `fchmod` and `ftruncate` cuts it on its main
//! thread once every file of the run is open.
//!
//! A file the store created keeps its name until
//! [`FileStore::remove_created_name`]: after it the store works on through
//! its descriptor, and nothing of the file (guest memory) is left however
//! the process ends, a kill included.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::bounce::{Bounce, BouncePool};
use super::open_error::check_unit_bytes;
use super::paged::{PageChecksums, PAGES_PER_SLOT};
use super::seal::{Check, CheckTable, Integrity, Place};
use super::slots::SlotTable;
use super::{PageWrite, SlotId, Store, StoreError, StoreOpenError, WriteRequest, PAGE_BYTES};
use crate::index::{PageIndex, StoreKey};
use blockio::lockfile::{self, LockMode};
use blockio::{is_aligned, AlignedBuf, BlockFile, BlockIoError, BlockOp, BlockOptions};

/// How [`FileStore::create_with`] treats a path that exists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOptions {
    /// Use an existing regular file or block device, destroying its
    /// content; without it only a new file is created.
    pub overwrite: bool,
}

/// What the store's lock is taken for, in messages.
const LOCK_ROLE: &str = "the swap store";

/// Unit-sized slots in a file or block device; see the module docs.
#[derive(Debug)]
pub struct FileStore {
    block: BlockFile,
    unit_bytes: usize,
    capacity_slots: u64,
    slots: Mutex<Slots>,
    description: String,
    /// The old content of an overwritten file, still to be cut away before
    /// the first write (see the module docs).
    pending_truncate: Mutex<bool>,
    /// The path, device and inode of the file this store created, while
    /// the store has not removed its name ([`Self::remove_created_name`]).
    created: Option<CreatedFile>,
    /// Capacity allocated at start ([`Self::reserve_capacity`]); kept after
    /// the deferred truncation too.
    reserved: bool,
    /// crc32 or sealing ([`Self::set_integrity`]).
    integrity: Integrity,
    /// The huge-page buffers sealed images are made in (a sealed write
    /// cannot go from the caller's buffer, which must keep the
    /// plaintext); mapped when sealing is chosen ([`super::bounce`]).
    bounce_pool: Option<BouncePool>,
}

/// A file the store made, by path and identity: what
/// [`FileStore::remove_created_name`] checks before it unlinks the path.
#[derive(Debug)]
struct CreatedFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

/// An `,overwrite` file's old content that its store has yet to cut away
/// (see the module docs): [`OldContent::cut`] does it now, on the calling
/// thread, so that no later write has to.
#[derive(Debug, Clone)]
pub struct OldContent(std::sync::Arc<FileStore>);

impl OldContent {
    /// The old content of `store`, if it has any still to cut away (an
    /// existing regular file opened with [`FileOptions::overwrite`]).
    pub fn of(store: &std::sync::Arc<FileStore>) -> Option<Self> {
        store
            .has_old_content()
            .then(|| Self(std::sync::Arc::clone(store)))
    }

    /// Truncates the file to nothing and makes it mode 0600 (reserving the
    /// capacity again with `,reserve`); a second call, or the store's first
    /// write after it, does nothing more.
    pub fn cut(&self) -> Result<(), StoreOpenError> {
        Ok(self.0.drop_old_content()?)
    }

    /// The file, for messages.
    pub fn path(&self) -> &Path {
        self.0.block.path()
    }
}

/// The allocator and the checksums, under one lock because a slot's checksum
/// is only meaningful while it is allocated.
#[derive(Debug)]
struct Slots {
    table: SlotTable,
    /// crc32 (or seal) of each slot's unit as written, indexed by slot;
    /// grows with the highest slot written.
    crcs: CheckTable,
    /// The page checksums of paged slots (split chunks), by slot.
    paged: std::collections::HashMap<SlotId, PageChecksums>,
}

impl FileStore {
    /// Creates `path`, which must not exist, mode 0600, as a store of
    /// `unit_bytes` slots holding up to `capacity_bytes`; locked.
    pub fn create(
        path: &Path,
        unit_bytes: usize,
        capacity_bytes: u64,
    ) -> Result<Self, StoreOpenError> {
        Self::create_with(
            path,
            unit_bytes,
            capacity_bytes,
            FileOptions::default(),
            &BlockOptions::default(),
        )
    }

    /// [`Self::create`], or with `file.overwrite` an existing regular file
    /// or block device, with explicit block options (engine, rings). The
    /// file is locked exclusively before anything is changed; an existing
    /// one without `overwrite` is [`StoreOpenError::Exists`] and left as it
    /// was. A block device's capacity is cut to its size.
    pub fn create_with(
        path: &Path,
        unit_bytes: usize,
        capacity_bytes: u64,
        file: FileOptions,
        opts: &BlockOptions,
    ) -> Result<Self, StoreOpenError> {
        check_unit_bytes(unit_bytes)?;
        let open_err = |source| BlockIoError::Open {
            path: path.to_owned(),
            source,
        };
        // The name itself, not what a link points to: a link is followed
        // below only to a block device.
        let existing = match std::fs::symlink_metadata(path) {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(open_err(e).into()),
        };
        let (raw, created) = match existing {
            None => {
                // O_EXCL: a file that appeared since the check is refused
                // below as existing, never truncated.
                match OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                {
                    Ok(raw) => (raw, true),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        return Err(StoreOpenError::Exists {
                            path: path.to_owned(),
                            what: "file (it appeared while the store was being created)".into(),
                        })
                    }
                    Err(e) => return Err(open_err(e).into()),
                }
            }
            Some(named) => {
                let link = named.file_type().is_symlink();
                let symlink_error = || StoreOpenError::Symlink {
                    path: path.to_owned(),
                    target: std::fs::read_link(path).map_or_else(
                        |_| "an unreadable target".to_string(),
                        |t| t.display().to_string(),
                    ),
                };
                let meta = if link {
                    match std::fs::metadata(path) {
                        Ok(target) if target.file_type().is_block_device() => target,
                        _ => return Err(symlink_error()),
                    }
                } else {
                    named
                };
                let kind = meta.file_type();
                let what = if kind.is_file() {
                    format!("regular file of {} bytes", meta.len())
                } else if kind.is_block_device() {
                    "block device".to_string()
                } else {
                    return Err(StoreOpenError::NotStorable {
                        path: path.to_owned(),
                        what: if kind.is_dir() {
                            "directory"
                        } else if kind.is_char_device() {
                            "character device"
                        } else if kind.is_fifo() {
                            "FIFO"
                        } else {
                            "special file"
                        },
                    });
                };
                if !file.overwrite {
                    return Err(StoreOpenError::Exists {
                        path: path.to_owned(),
                        what,
                    });
                }
                let raw = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(if link { 0 } else { libc::O_NOFOLLOW })
                    .open(path)
                    .map_err(|e| {
                        if e.raw_os_error() == Some(libc::ELOOP) {
                            // Replaced by a link since the check.
                            symlink_error()
                        } else {
                            open_err(e).into()
                        }
                    })?;
                // What was opened must be what was checked: a file put in
                // its place in between is not the one the user named.
                use std::os::unix::fs::MetadataExt;
                let opened = raw.metadata().map_err(open_err)?;
                if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
                    return Err(StoreOpenError::Exists {
                        path: path.to_owned(),
                        what: "file that another took the place of while the store was opening it"
                            .into(),
                    });
                }
                (raw, false)
            }
        };
        let set_up = || -> Result<Self, StoreOpenError> {
            use std::os::unix::fs::MetadataExt;
            lockfile::lock(&raw, path, LockMode::Exclusive, LOCK_ROLE)?;
            let meta = raw.metadata().map_err(open_err)?;
            let is_regular = meta.file_type().is_file();
            let block =
                BlockFile::from_file(raw.try_clone().map_err(open_err)?, path.to_owned(), opts)?;
            let description = format!("file:{} ({})", path.display(), block.engine_name());
            let mut store = Self::from_block(block, unit_bytes, capacity_bytes, description)?;
            *store
                .pending_truncate
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()) = is_regular && !created;
            store.created = created.then(|| CreatedFile {
                path: path.to_owned(),
                dev: meta.dev(),
                ino: meta.ino(),
            });
            Ok(store)
        };
        let result = set_up();
        if result.is_err() && created {
            // Ours, empty and locked by us until `raw` closes: nothing to keep.
            let _ = std::fs::remove_file(path);
        }
        result
    }

    /// Removes the name of the file this store created, checking first that
    /// the path still names that file: the store keeps working through its
    /// descriptor, and the filesystem frees the blocks when the store is
    /// dropped or the process ends, however it ends. Nothing to do for a
    /// file the store did not create (`overwrite`, a block device) or whose
    /// name it already removed.
    pub fn remove_created_name(&mut self) -> Result<(), StoreOpenError> {
        use std::os::unix::fs::MetadataExt;
        let Some(created) = self.created.take() else {
            return Ok(());
        };
        let fail = |reason: String| StoreOpenError::RemoveName {
            path: created.path.clone(),
            reason,
        };
        // Not a proof against a rename racing the unlink (nothing is, short
        // of a directory only this user writes to), but a file put in its
        // place before the check is left alone.
        match std::fs::symlink_metadata(&created.path) {
            Ok(now) if now.dev() == created.dev && now.ino() == created.ino => {}
            Ok(_) => return Err(fail("another file took its place".into())),
            Err(e) => return Err(fail(e.to_string())),
        }
        std::fs::remove_file(&created.path).map_err(|e| fail(e.to_string()))?;
        self.description = format!(
            "file:{} (name removed at start, held open; {})",
            created.path.display(),
            self.block.engine_name()
        );
        Ok(())
    }

    /// Whether an `,overwrite` file's old content is still to be cut away
    /// before the first write ([`OldContent`]).
    pub fn has_old_content(&self) -> bool {
        *self
            .pending_truncate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Allocates the whole capacity now (`,reserve`: `fallocate` mode 0), so
    /// that a filesystem without room is [`StoreOpenError::Reserve`] at
    /// start, naming its free space, rather than a full filesystem when the
    /// store fills. Nothing to do on a block device.
    pub fn reserve_capacity(&mut self) -> Result<(), StoreOpenError> {
        if self.block.is_block_device() {
            return Ok(());
        }
        let need_bytes = self.capacity_slots * self.unit_bytes as u64;
        self.block
            .reserve(need_bytes)
            .map_err(|e| StoreOpenError::Reserve {
                path: self.block.path().to_owned(),
                need_bytes,
                free_bytes: self.block.fs_free_bytes().ok(),
                source: e.into(),
            })?;
        self.reserved = true;
        Ok(())
    }

    /// A store in an unnamed file that disappears with the store (mode
    /// 0600). Tries `dir`, then `/var/tmp`, then the current directory,
    /// because `dir` (typically `$TMPDIR` or `/tmp`) may be a filesystem that
    /// refuses `O_DIRECT`. [`Store::describe`] names the directory used and
    /// why any before it was skipped.
    pub fn temporary(
        dir: &Path,
        unit_bytes: usize,
        capacity_bytes: u64,
    ) -> Result<Self, StoreOpenError> {
        Self::temporary_with(dir, unit_bytes, capacity_bytes, &BlockOptions::default())
    }

    /// [`Self::temporary`] with explicit block options.
    pub fn temporary_with(
        dir: &Path,
        unit_bytes: usize,
        capacity_bytes: u64,
        opts: &BlockOptions,
    ) -> Result<Self, StoreOpenError> {
        check_unit_bytes(unit_bytes)?;
        let mut candidates = vec![dir.to_path_buf(), PathBuf::from("/var/tmp")];
        if let Ok(cwd) = std::env::current_dir() {
            candidates.push(cwd);
        }
        let mut skipped: Vec<String> = Vec::new();
        for (i, candidate) in candidates.iter().enumerate() {
            if candidates[..i].contains(candidate) {
                continue;
            }
            match BlockFile::temporary_in(candidate, opts) {
                Ok(block) => {
                    let mut description = format!(
                        "file:{} (unlinked temporary; {}",
                        candidate.display(),
                        block.engine_name()
                    );
                    for note in &skipped {
                        description.push_str("; ");
                        description.push_str(note);
                    }
                    description.push(')');
                    return Self::from_block(block, unit_bytes, capacity_bytes, description);
                }
                Err(BlockIoError::DirectIoUnsupported { .. }) => {
                    skipped.push(format!("{} refused O_DIRECT", candidate.display()));
                }
                Err(e) => {
                    let reason = match &e {
                        BlockIoError::Open { source, .. } => source.to_string(),
                        other => other.to_string(),
                    };
                    skipped.push(format!("{}: {reason}", candidate.display()));
                }
            }
        }
        Err(StoreOpenError::NoTemporaryDir {
            tried: skipped.join("; "),
        })
    }

    /// A store over an already open block file; `description` is what
    /// [`Store::describe`] returns. The capacity is cut to a block device's
    /// size, and to 2^32 slots (the [`SlotId`] range).
    pub fn from_block(
        block: BlockFile,
        unit_bytes: usize,
        capacity_bytes: u64,
        description: String,
    ) -> Result<Self, StoreOpenError> {
        check_unit_bytes(unit_bytes)?;
        let mut capacity_bytes = capacity_bytes;
        let mut what = "size".to_string();
        if block.is_block_device() {
            let device_bytes = block.len_bytes()?;
            if device_bytes < capacity_bytes {
                capacity_bytes = device_bytes;
                what = format!("device {}", block.path().display());
            }
        }
        let capacity_slots = (capacity_bytes / unit_bytes as u64).min(u64::from(SlotId::MAX) + 1);
        if capacity_slots == 0 {
            return Err(StoreOpenError::TooSmall {
                what,
                capacity_bytes,
                unit_bytes,
            });
        }
        if !is_aligned(unit_bytes as u64, block.offset_align_bytes()) {
            return Err(StoreOpenError::BadUnit { unit_bytes });
        }
        Ok(Self {
            block,
            unit_bytes,
            capacity_slots,
            slots: Mutex::new(Slots {
                table: SlotTable::new(capacity_slots),
                crcs: CheckTable::new(&Integrity::Checksum),
                paged: std::collections::HashMap::new(),
            }),
            description,
            pending_truncate: Mutex::new(false),
            created: None,
            reserved: false,
            integrity: Integrity::Checksum,
            bounce_pool: None,
        })
    }

    /// Chooses how slots are protected: crc32 (the default) or sealed
    /// under a [`super::Sealer`]. Before the first write: `&mut self`
    /// means the store is not shared yet.
    pub fn set_integrity(&mut self, integrity: Integrity) {
        let slots = self.slots.get_mut().unwrap_or_else(|p| p.into_inner());
        assert_eq!(
            slots.table.used_slots(),
            0,
            "integrity chosen after slots were written"
        );
        slots.crcs = CheckTable::new(&integrity);
        if integrity.is_sealed() && self.bounce_pool.is_none() {
            self.bounce_pool = BouncePool::new(self.unit_bytes);
        }
        self.integrity = integrity;
    }

    /// A buffer for an image of `len` bytes: from the pool while it has
    /// one, else from the heap.
    fn take_bounce(&self, len: usize) -> Bounce<'_> {
        Bounce::take(self.bounce_pool.as_ref(), len, self.block.mem_align_bytes())
    }

    /// Cuts away an overwritten file's old content before the first write
    /// (and reserves the capacity again if it was reserved). Other writers
    /// wait on the lock, so no write is submitted before this is done.
    fn drop_old_content(&self) -> Result<(), BlockIoError> {
        let mut pending = self
            .pending_truncate
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *pending {
            // What goes in is private; changed only now, with the content,
            // so that a VM that never wrote leaves the file as it was.
            // SAFETY: fchmod on a descriptor the block file owns; it touches
            // no memory.
            if unsafe { libc::fchmod(self.block.as_raw_fd(), 0o600) } != 0 {
                return Err(BlockIoError::Control {
                    what: "fchmod(0600)",
                    path: self.block.path().to_owned(),
                    source: io::Error::last_os_error(),
                });
            }
            self.block.set_len(0)?;
            if self.reserved {
                self.block
                    .reserve(self.capacity_slots * self.unit_bytes as u64)?;
            }
            *pending = false;
        }
        Ok(())
    }

    /// Seals the verified unit `plain` (the content of `slot`) again page
    /// by page and writes it over the slot: what a sealed slot needs to
    /// become paged (see [`Store::read_and_split`] on this store).
    fn reseal_pages(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        plain: &[u8],
    ) -> Result<PageChecksums, StoreError> {
        let mut image = self.take_bounce(plain.len());
        image.copy_from_slice(plain);
        let mut sums = PageChecksums::empty(&self.integrity);
        for (page, data) in image.chunks_exact_mut(PAGE_BYTES).enumerate() {
            let at = Place::page(
                slot,
                PageIndex::new(page),
                gpa.offset_by((page * PAGE_BYTES) as u64),
            );
            sums.set(page, self.integrity.protect(at, data)?);
        }
        let written = self.block.write_at(self.offset(slot), &image);
        drop(image);
        if let Err(e) = written {
            let mut slots = self.slots();
            if slots.table.is_used(slot) {
                slots
                    .paged
                    .insert(slot, PageChecksums::empty(&self.integrity));
            }
            let used = slots.table.used_slots();
            let cause = self.store_error(gpa, slot, used, e);
            // Not retried: the slot's old content is gone (see the docs).
            return Err(StoreError::Io {
                gpa,
                slot,
                source: io::Error::other(format!(
                    "re-sealing the pages of the split chunk failed, its stored content is lost: {cause}"
                )),
            });
        }
        Ok(sums)
    }

    /// The underlying block file (for its engine name or path).
    pub fn block(&self) -> &BlockFile {
        &self.block
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        // The table is updated by single statements, so a panic elsewhere
        // while it was held cannot leave it half changed.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn offset(&self, slot: SlotId) -> u64 {
        u64::from(slot) * self.unit_bytes as u64
    }

    fn is_aligned(&self, buf: &[u8]) -> bool {
        is_aligned(buf.as_ptr() as u64, self.block.mem_align_bytes())
    }

    fn full(&self, gpa: StoreKey) -> StoreError {
        StoreError::Full {
            gpa,
            capacity_bytes: self.capacity_slots * self.unit_bytes as u64,
            capacity_slots: self.capacity_slots,
        }
    }

    fn wrong_length(&self, gpa: StoreKey, slot: SlotId, len: usize) -> StoreError {
        StoreError::Io {
            gpa,
            slot,
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "buffer of {len} bytes given for a {}-byte unit (an engine bug)",
                    self.unit_bytes
                ),
            ),
        }
    }

    /// Reads `buf` at `offset` (through a bounce buffer when it is not
    /// aligned for O_DIRECT) and verifies it against `check` (a sealed
    /// image is opened in place).
    fn read_verified(
        &self,
        offset: u64,
        at: Place,
        check: Check,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        let (gpa, slot) = (at.gpa, at.slot);
        if self.is_aligned(buf) {
            self.block
                .read_at(offset, buf)
                .map_err(|e| self.store_error(gpa, slot, self.used_slots(), e))?;
        } else {
            let mut bounce = AlignedBuf::new(buf.len(), self.block.mem_align_bytes());
            self.block
                .read_at(offset, &mut bounce)
                .map_err(|e| self.store_error(gpa, slot, self.used_slots(), e))?;
            buf.copy_from_slice(&bounce);
        }
        self.integrity.verify(at, check, buf)
    }

    /// Maps a block error of `slot` to the store's error, keeping the file
    /// and offset in the message. `used_slots` is passed in because writers
    /// call this with the slot table locked.
    fn store_error(
        &self,
        gpa: StoreKey,
        slot: SlotId,
        used_slots: u64,
        err: BlockIoError,
    ) -> StoreError {
        match err {
            BlockIoError::ShortRead {
                got_bytes,
                want_bytes,
                ..
            } => StoreError::ShortRead {
                gpa,
                slot,
                got_bytes,
                want_bytes,
            },
            BlockIoError::Io { source, .. } | BlockIoError::Control { source, .. }
                if matches!(
                    source.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT)
                ) =>
            {
                StoreError::FilesystemFull {
                    gpa,
                    path: self.block.path().to_owned(),
                    free_bytes: self.block.fs_free_bytes().ok(),
                    used_slots,
                    capacity_slots: self.capacity_slots,
                    source,
                }
            }
            other => {
                let kind = match &other {
                    BlockIoError::Io { source, .. } => source.kind(),
                    _ => io::ErrorKind::Other,
                };
                StoreError::Io {
                    gpa,
                    slot,
                    source: io::Error::new(kind, other),
                }
            }
        }
    }
}

impl Store for FileStore {
    fn unit_bytes(&self) -> usize {
        self.unit_bytes
    }

    fn capacity_slots(&self) -> u64 {
        self.capacity_slots
    }

    fn describe(&self) -> String {
        match &self.integrity {
            Integrity::Checksum => self.description.clone(),
            sealed => format!("{} [{}]", self.description, sealed.describe()),
        }
    }

    fn sealed(&self) -> bool {
        self.integrity.is_sealed()
    }

    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Vec<Result<SlotId, StoreError>> {
        let mut results: Vec<Option<Result<SlotId, StoreError>>> =
            requests.iter().map(|_| None).collect();
        let mut allocated: Vec<(usize, SlotId)> = Vec::with_capacity(requests.len());
        {
            let mut slots = self.slots();
            for (i, req) in requests.iter().enumerate() {
                if req.data.len() != self.unit_bytes {
                    results[i] = Some(Err(self.wrong_length(
                        req.gpa,
                        SlotId::new(0),
                        req.data.len(),
                    )));
                    continue;
                }
                match slots.table.alloc() {
                    Some(slot) => allocated.push((i, slot)),
                    None => results[i] = Some(Err(self.full(req.gpa))),
                }
            }
        }
        // Sealed: every image is made in a buffer of the store's (the
        // caller's keeps the plaintext). Otherwise the trait promises
        // aligned data, so a copy is the rare exception.
        let mut bounces: Vec<Option<Bounce<'_>>> = allocated
            .iter()
            .map(|&(i, _)| {
                let data = requests[i].data;
                (self.integrity.is_sealed() || !self.is_aligned(data)).then(|| {
                    let mut b = self.take_bounce(data.len());
                    b.copy_from_slice(data);
                    b
                })
            })
            .collect();
        let mut crcs: Vec<Result<Check, StoreError>> = Vec::with_capacity(allocated.len());
        for (&(i, slot), bounce) in allocated.iter().zip(bounces.iter_mut()) {
            let at = Place::unit(slot, requests[i].gpa);
            crcs.push(match bounce {
                Some(b) if self.integrity.is_sealed() => self.integrity.protect(at, b),
                Some(b) => Ok(Check::Crc(crc32fast::hash(b))),
                None => Ok(Check::Crc(crc32fast::hash(requests[i].data))),
            });
        }
        let mut ops: Vec<BlockOp<'_>> = allocated
            .iter()
            .zip(&bounces)
            .map(|(&(i, slot), bounce)| BlockOp::Write {
                offset: self.offset(slot),
                buf: bounce.as_deref().unwrap_or(requests[i].data),
            })
            .collect();
        let outcomes = match self.drop_old_content() {
            Ok(()) => self.block.submit(&mut ops),
            Err(e) => {
                // Each request fails with the same cause, ENOSPC included.
                let e = io::Error::from(e);
                let same = || match e.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(e.kind(), e.to_string()),
                };
                ops.iter()
                    .map(|_| {
                        Err(BlockIoError::Control {
                            what: "truncating the overwritten store file",
                            path: self.block.path().to_owned(),
                            source: same(),
                        })
                    })
                    .collect()
            }
        };
        drop(ops);
        {
            let mut slots = self.slots();
            for ((&(i, slot), crc), outcome) in allocated.iter().zip(crcs).zip(outcomes) {
                results[i] = Some(match (crc, outcome) {
                    (Ok(check), Ok(())) => {
                        slots.crcs.set(slot.index(), check);
                        Ok(slot)
                    }
                    (Err(e), _) => {
                        slots.table.free(slot);
                        Err(e)
                    }
                    (Ok(_), Err(e)) => {
                        slots.table.free(slot);
                        let used = slots.table.used_slots();
                        Err(self.store_error(requests[i].gpa, slot, used, e))
                    }
                });
            }
        }
        drop(bounces);
        results
            .into_iter()
            .map(|r| r.expect("every request has a result"))
            .collect()
    }

    fn read(&self, slot: SlotId, gpa: StoreKey, buf: &mut [u8]) -> Result<(), StoreError> {
        if buf.len() != self.unit_bytes {
            return Err(self.wrong_length(gpa, slot, buf.len()));
        }
        let check = {
            let slots = self.slots();
            // A paged slot's unit checksum is stale: it is read by page.
            if !slots.table.is_used(slot) || slots.paged.contains_key(&slot) {
                return Err(StoreError::BadSlot { gpa, slot });
            }
            slots
                .crcs
                .get(slot.index())
                .ok_or(StoreError::BadSlot { gpa, slot })?
        };
        self.read_verified(self.offset(slot), Place::unit(slot, gpa), check, buf)
    }

    fn free(&self, slot: SlotId) {
        // Freeing a free slot is an engine bug with nothing to undo here.
        let mut slots = self.slots();
        slots.paged.remove(&slot);
        slots.table.free(slot);
    }

    fn supports_pages(&self) -> bool {
        self.unit_bytes == PAGES_PER_SLOT * PAGE_BYTES
    }

    fn allocate_paged(&self, gpa: StoreKey) -> Result<SlotId, StoreError> {
        let mut slots = self.slots();
        let slot = slots.table.alloc().ok_or_else(|| self.full(gpa))?;
        slots
            .paged
            .insert(slot, PageChecksums::empty(&self.integrity));
        Ok(slot)
    }

    /// Sealed, the unit's one tag cannot vouch for its pages one by one
    /// (GCM authenticates the whole message): the verified content is
    /// sealed again page by page and written back over the slot, one
    /// 2 MiB write. That write failing leaves the slot's content neither
    /// the unit nor its pages: the slot is kept paged with no page written
    /// (every read of it fails, never zeros) and the error is final.
    fn read_and_split(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        self.read(slot, gpa, buf)?;
        let sums = if self.integrity.is_sealed() {
            self.reseal_pages(slot, gpa, buf)?
        } else {
            PageChecksums::of_unit(buf)
        };
        let mut slots = self.slots();
        if !slots.table.is_used(slot) {
            return Err(StoreError::BadSlot { gpa, slot });
        }
        slots.paged.insert(slot, sums);
        Ok(())
    }

    fn write_pages(&self, slot: SlotId, pages: &[PageWrite<'_>]) -> Vec<Result<(), StoreError>> {
        let sealed = self.integrity.is_sealed();
        let paged = self.slots().paged.contains_key(&slot);
        let mut results: Vec<Option<Result<(), StoreError>>> = pages
            .iter()
            .map(|p| {
                if !paged {
                    Some(Err(StoreError::BadSlot { gpa: p.gpa, slot }))
                } else if p.data.len() != PAGE_BYTES || p.page.get() >= PAGES_PER_SLOT {
                    Some(Err(self.wrong_length(p.gpa, slot, p.data.len())))
                } else {
                    None
                }
            })
            .collect();
        let mut checks: Vec<Option<Check>> = vec![None; pages.len()];
        let mut bounces: Vec<Option<AlignedBuf>> = Vec::new();
        let mut todo: Vec<usize> = Vec::new();
        for i in 0..pages.len() {
            if results[i].is_some() {
                continue;
            }
            let (page, data) = (&pages[i], pages[i].data);
            let mut bounce = (sealed || !self.is_aligned(data)).then(|| {
                let mut b = AlignedBuf::new(data.len(), self.block.mem_align_bytes());
                b.copy_from_slice(data);
                b
            });
            let check = match bounce.as_deref_mut() {
                Some(b) if sealed => self
                    .integrity
                    .protect(Place::page(slot, page.page, page.gpa), b),
                Some(b) => Ok(Check::Crc(crc32fast::hash(b))),
                None => Ok(Check::Crc(crc32fast::hash(data))),
            };
            match check {
                Ok(check) => {
                    checks[i] = Some(check);
                    bounces.push(bounce);
                    todo.push(i);
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        let mut ops: Vec<BlockOp<'_>> = todo
            .iter()
            .zip(&bounces)
            .map(|(&i, bounce)| BlockOp::Write {
                offset: self.offset(slot) + pages[i].page.offset_bytes(),
                buf: bounce.as_deref().unwrap_or(pages[i].data),
            })
            .collect();
        let outcomes = match self.drop_old_content() {
            Ok(()) => self.block.submit(&mut ops),
            Err(e) => {
                let e = io::Error::from(e);
                ops.iter()
                    .map(|_| {
                        Err(BlockIoError::Control {
                            what: "truncating the overwritten store file",
                            path: self.block.path().to_owned(),
                            source: io::Error::new(e.kind(), e.to_string()),
                        })
                    })
                    .collect()
            }
        };
        drop(ops);
        let mut slots = self.slots();
        let used = slots.table.used_slots();
        for (&i, outcome) in todo.iter().zip(outcomes) {
            let page = &pages[i];
            results[i] = Some(match outcome {
                Ok(()) => match slots.paged.get_mut(&slot) {
                    Some(sums) => {
                        sums.set(
                            page.page.get(),
                            checks[i].expect("checked before the write"),
                        );
                        Ok(())
                    }
                    None => Err(StoreError::BadSlot {
                        gpa: page.gpa,
                        slot,
                    }),
                },
                Err(e) => Err(self.store_error(page.gpa, slot, used, e)),
            });
        }
        results
            .into_iter()
            .map(|r| r.expect("every page has a result"))
            .collect()
    }

    fn read_paged_unit(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        if buf.len() != self.unit_bytes {
            return Err(self.wrong_length(gpa, slot, buf.len()));
        }
        let sums = self
            .slots()
            .paged
            .get(&slot)
            .cloned()
            .ok_or(StoreError::BadSlot { gpa, slot })?;
        let offset = self.offset(slot);
        let mut bounce = (!self.is_aligned(buf))
            .then(|| AlignedBuf::new(buf.len(), self.block.mem_align_bytes()));
        let read = match bounce.as_deref_mut() {
            Some(bounce) => self.block.read_at(offset, bounce),
            None => self.block.read_at(offset, buf),
        };
        // The file grows as pages are written: a paged slot at its end may
        // stop short. That is fine as long as every written page was read.
        let got_bytes = match read {
            Ok(()) => buf.len(),
            Err(BlockIoError::ShortRead { got_bytes, .. })
                if (0..PAGES_PER_SLOT)
                    .filter(|&p| sums.get(p).is_some())
                    .all(|p| (p + 1) * PAGE_BYTES <= got_bytes) =>
            {
                got_bytes
            }
            Err(e) => return Err(self.store_error(gpa, slot, self.used_slots(), e)),
        };
        if let Some(bounce) = &bounce {
            buf[..got_bytes].copy_from_slice(&bounce[..got_bytes]);
        }
        buf[got_bytes..].fill(0);
        for (page, data) in buf.chunks_exact_mut(PAGE_BYTES).enumerate() {
            if let Some(check) = sums.get(page) {
                let at = Place::page(
                    slot,
                    PageIndex::new(page),
                    gpa.offset_by((page * PAGE_BYTES) as u64),
                );
                self.integrity.verify(at, check, data)?;
            }
        }
        Ok(())
    }

    fn read_page(
        &self,
        slot: SlotId,
        page: PageIndex,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        if buf.len() != PAGE_BYTES || page.get() >= PAGES_PER_SLOT {
            return Err(self.wrong_length(gpa, slot, buf.len()));
        }
        let check = self
            .slots()
            .paged
            .get(&slot)
            .and_then(|sums| sums.get(page.get()))
            .ok_or(StoreError::BadSlot { gpa, slot })?;
        let offset = self.offset(slot) + page.offset_bytes();
        self.read_verified(offset, Place::page(slot, page, gpa), check, buf)
    }

    fn used_slots(&self) -> u64 {
        self.slots().table.used_slots()
    }

    fn corrupt_slot(&self, slot: SlotId) -> io::Result<()> {
        if !self.slots().table.is_used(slot) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {slot} is not allocated"),
            ));
        }
        // A paged slot: damage its first written page (the others are
        // never read).
        let target = self
            .slots()
            .paged
            .get(&slot)
            .and_then(|sums| (0..PAGES_PER_SLOT).find(|&p| sums.get(p).is_some()))
            .map_or(self.unit_bytes / 2, |page| {
                page * PAGE_BYTES + PAGE_BYTES / 2
            });
        let mut image = AlignedBuf::new(self.unit_bytes, self.block.mem_align_bytes().max(4096));
        self.block.read_at(self.offset(slot), &mut image)?;
        image[target] ^= 0x5a;
        self.block.write_at(self.offset(slot), &image)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_support::{
        check_concurrent, check_paged, check_round_trip, check_slot_reuse, unit_image,
    };
    use blockio::{test_support::with_ramfs, Engine};
    use std::os::unix::fs::FileExt;

    const MIB2: usize = 2 << 20;
    const KIB4: usize = 4096;

    fn test_dir() -> PathBuf {
        blockio::test_support::test_dir()
    }

    fn temp(unit: usize, slots: u64, engine: Engine) -> FileStore {
        let opts = BlockOptions {
            engine,
            ..BlockOptions::default()
        };
        FileStore::temporary_with(&test_dir(), unit, slots * unit as u64, &opts).unwrap()
    }

    #[test]
    fn round_trip_both_units_both_engines() {
        for engine in [Engine::IoUring, Engine::Sync] {
            check_round_trip(&temp(MIB2, 64, engine), 40);
            check_round_trip(&temp(KIB4, 4096, engine), 1000);
        }
    }

    #[test]
    fn paged_slots_keep_a_split_chunks_pages() {
        let (store, _path) = created("paged", MIB2, 8);
        check_paged(&store);
    }

    #[test]
    fn slots_are_reused_after_free() {
        check_slot_reuse(&temp(MIB2, 8, Engine::IoUring));
        check_slot_reuse(&temp(KIB4, 8, Engine::Sync));
    }

    #[test]
    fn concurrent_readers_and_a_batch_writer() {
        check_concurrent(std::sync::Arc::new(temp(MIB2, 64, Engine::IoUring)));
        check_concurrent(std::sync::Arc::new(temp(KIB4, 2048, Engine::Sync)));
    }

    fn created(name: &str, unit: usize, slots: u64) -> (FileStore, PathBuf) {
        let path = test_dir().join(format!(".filestore-{name}-{}", std::process::id()));
        let store = FileStore::create(&path, unit, slots * unit as u64).unwrap();
        (store, path)
    }

    #[test]
    fn create_makes_a_private_file_and_describes_it() {
        use std::os::unix::fs::PermissionsExt;
        let (store, path) = created("mode", KIB4, 4);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        std::fs::remove_file(&path).unwrap();
        assert_eq!(mode, 0o600);
        assert!(store
            .describe()
            .starts_with(&format!("file:{}", path.display())));
        assert_eq!(store.capacity_slots(), 4);
    }

    #[test]
    fn corruption_behind_the_stores_back_is_a_checksum_error() {
        let (store, path) = created("crc", MIB2, 4);
        let a = unit_image(1, MIB2);
        let b = unit_image(2, MIB2);
        let slots: Vec<SlotId> = store
            .write_batch(&[
                WriteRequest {
                    gpa: StoreKey::new(0x20_0000),
                    data: &a,
                },
                WriteRequest {
                    gpa: StoreKey::new(0x40_0000),
                    data: &b,
                },
            ])
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let plain = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        plain
            .write_all_at(b"garbage", store.offset(slots[1]) + 12345)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        store
            .read(slots[0], StoreKey::new(0x20_0000), &mut buf)
            .unwrap();
        match store.read(slots[1], StoreKey::new(0x40_0000), &mut buf) {
            Err(e @ StoreError::Checksum { gpa, .. }) if gpa == StoreKey::new(0x40_0000) => {
                assert!(e.to_string().contains("0x400000"), "{e}");
            }
            other => panic!("expected a checksum error, got {other:?}"),
        }
    }

    #[test]
    fn truncated_file_is_a_short_read() {
        let (store, path) = created("short", MIB2, 4);
        let a = unit_image(3, MIB2);
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0x60_0000),
            data: &a,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        let plain = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        plain.set_len(MIB2 as u64 / 2).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        match store.read(slot, StoreKey::new(0x60_0000), &mut buf) {
            Err(StoreError::ShortRead {
                gpa,
                got_bytes,
                want_bytes,
                ..
            }) if gpa == StoreKey::new(0x60_0000) => {
                assert_eq!(got_bytes, MIB2 / 2);
                assert_eq!(want_bytes, MIB2);
            }
            other => panic!("expected a short read, got {other:?}"),
        }
    }

    #[test]
    fn tiny_capacity_is_full() {
        let store = temp(MIB2, 2, Engine::IoUring);
        let a = unit_image(4, MIB2);
        let reqs: Vec<WriteRequest> = (0..3)
            .map(|k| WriteRequest {
                gpa: StoreKey::new(k << 21),
                data: &a,
            })
            .collect();
        let res = store.write_batch(&reqs);
        assert!(res[0].is_ok() && res[1].is_ok());
        match &res[2] {
            Err(StoreError::Full {
                gpa,
                capacity_slots: 2,
                capacity_bytes,
            }) => {
                assert_eq!(*gpa, StoreKey::new(2 << 21));
                assert_eq!(*capacity_bytes, 2 * MIB2 as u64);
            }
            other => panic!("expected Full, got {other:?}"),
        }
        assert_eq!(store.used_slots(), 2);
        assert!(matches!(
            FileStore::temporary(&test_dir(), MIB2, MIB2 as u64 - 1),
            Err(StoreOpenError::TooSmall { .. })
        ));
        assert!(matches!(
            FileStore::temporary(&test_dir(), 1000, 1 << 30),
            Err(StoreOpenError::BadUnit { unit_bytes: 1000 })
        ));
    }

    #[test]
    fn read_of_a_free_slot_is_bad_slot() {
        let store = temp(KIB4, 4, Engine::IoUring);
        let mut buf = AlignedBuf::new(KIB4, 4096);
        assert!(matches!(
            store.read(SlotId::new(2), StoreKey::new(0x1000), &mut buf),
            Err(StoreError::BadSlot { slot, gpa }) if slot == SlotId::new(2) && gpa == StoreKey::new(0x1000)
        ));
    }

    #[test]
    fn unaligned_caller_buffers_still_work() {
        let store = temp(KIB4, 4, Engine::IoUring);
        let mut backing = vec![0u8; 2 * KIB4 + 1];
        let img = unit_image(5, KIB4);
        backing[1..KIB4 + 1].copy_from_slice(&img);
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0),
            data: &backing[1..KIB4 + 1],
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        let mut out = vec![0u8; KIB4 + 1];
        store.read(slot, StoreKey::new(0), &mut out[1..]).unwrap();
        assert_eq!(&out[1..], &img[..]);
    }

    #[test]
    fn corrupt_slot_hook_damages_the_image() {
        let store = temp(MIB2, 2, Engine::IoUring);
        let a = unit_image(6, MIB2);
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0),
            data: &a,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        store.corrupt_slot(slot).unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        assert!(matches!(
            store.read(slot, StoreKey::new(0), &mut buf),
            Err(StoreError::Checksum { .. })
        ));
    }

    #[test]
    fn temporary_skips_directories_that_refuse_o_direct() {
        let described = with_ramfs(|ramfs_dir| {
            FileStore::temporary(ramfs_dir, MIB2, 4 * MIB2 as u64).map(|s| s.describe())
        });
        match described {
            Some(Ok(d)) => {
                assert!(d.contains("refused O_DIRECT"), "{d}");
                assert!(d.contains("/var/tmp"), "{d}");
            }
            Some(Err(e)) => panic!("temporary store failed: {e}"),
            None => test_resources::skip(
                "the temporary store falls back from a ramfs",
                test_resources::Resource::Mount,
                "cannot mount a ramfs here (needs root)",
            ),
        }
        let store =
            FileStore::temporary(Path::new("/nonexistent-dir"), MIB2, 4 * MIB2 as u64).unwrap();
        let d = store.describe();
        assert!(d.starts_with("file:/var/tmp (unlinked temporary;"), "{d}");
        assert!(d.contains("/nonexistent-dir: No such file"), "{d}");
    }

    fn existing(name: &str, len: usize) -> (PathBuf, Vec<u8>) {
        let path = test_dir().join(format!(".filestore-{name}-{}", std::process::id()));
        let content: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        (path, content)
    }

    #[test]
    fn an_existing_file_is_refused_and_kept_byte_for_byte() {
        use std::os::unix::fs::PermissionsExt;
        let (path, content) = existing("exists", 3 * MIB2 + 5);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = FileStore::create(&path, MIB2, 8 * MIB2 as u64).unwrap_err();
        let kept = std::fs::read(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        std::fs::remove_file(&path).unwrap();
        let text = err.to_string();
        assert!(matches!(err, StoreOpenError::Exists { .. }), "{text}");
        assert!(text.contains(",overwrite"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(kept == content, "the existing file must be kept");
        assert_eq!(mode, 0o644, "nor its mode changed");
        let err = FileStore::create(&test_dir(), MIB2, 8 * MIB2 as u64).unwrap_err();
        assert!(
            matches!(
                err,
                StoreOpenError::NotStorable {
                    what: "directory",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_symlink_to_a_file_is_refused_even_with_overwrite_and_its_target_kept() {
        let (target, content) = existing("link-target", MIB2 + 3);
        let link = test_dir().join(format!(".filestore-link-{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let results: Vec<_> = [false, true]
            .into_iter()
            .map(|overwrite| {
                FileStore::create_with(
                    &link,
                    MIB2,
                    4 * MIB2 as u64,
                    FileOptions { overwrite },
                    &BlockOptions::default(),
                )
                .map(|_| ())
            })
            .collect();
        let kept = std::fs::read(&target).unwrap();
        // A link to nothing is refused the same way, not created through.
        std::fs::remove_file(&target).unwrap();
        let dangling = FileStore::create(&link, MIB2, 4 * MIB2 as u64).map(|_| ());
        let created_through = target.exists();
        std::fs::remove_file(&link).unwrap();
        let _ = std::fs::remove_file(&target);
        for result in results.into_iter().chain([dangling]) {
            let err = result.unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, StoreOpenError::Symlink { .. }), "{text}");
            assert!(text.contains(&target.display().to_string()), "{text}");
        }
        assert!(
            kept == content,
            "the link's target must be kept byte for byte"
        );
        assert!(!created_through, "nothing created where a link points");
    }

    #[test]
    fn overwrite_uses_an_existing_file_and_truncates_it_only_when_writing() {
        let (path, content) = existing("overwrite", 3 * MIB2);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let store = FileStore::create_with(
            &path,
            MIB2,
            4 * MIB2 as u64,
            FileOptions { overwrite: true },
            &BlockOptions::default(),
        )
        .unwrap();
        assert!(
            std::fs::read(&path).unwrap() == content,
            "nothing is destroyed before the store writes"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = || std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(), 0o644, "nor its mode changed");
        let a = unit_image(8, MIB2);
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0),
            data: &a,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), MIB2 as u64);
        assert_eq!(mode(), 0o600, "a store's content is private");
        let mut buf = AlignedBuf::new(MIB2, 4096);
        store.read(slot, StoreKey::new(0), &mut buf).unwrap();
        assert!(buf[..] == a[..]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_created_file_loses_its_name_and_the_store_works_on() {
        let (mut store, path) = created("unnamed", MIB2, 4);
        store.remove_created_name().unwrap();
        assert!(!path.exists(), "{} is still there", path.display());
        assert!(
            store.describe().contains("name removed at start"),
            "{}",
            store.describe()
        );
        let a = unit_image(10, MIB2);
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0),
            data: &a,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        let mut buf = AlignedBuf::new(MIB2, 4096);
        store.read(slot, StoreKey::new(0), &mut buf).unwrap();
        assert!(buf[..] == a[..]);
        // Once only; and a file the store did not create keeps its name.
        store.remove_created_name().unwrap();
        let (path, content) = existing("not-ours", MIB2);
        let mut theirs = FileStore::create_with(
            &path,
            MIB2,
            4 * MIB2 as u64,
            FileOptions { overwrite: true },
            &BlockOptions::default(),
        )
        .unwrap();
        theirs.remove_created_name().unwrap();
        drop(theirs);
        let kept = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(kept == content);
    }

    #[test]
    fn a_file_put_in_the_stores_place_keeps_its_name() {
        let (mut store, path) = created("replaced", KIB4, 4);
        let (other, content) = existing("replacement", 4096);
        std::fs::rename(&other, &path).unwrap();
        let err = store.remove_created_name().unwrap_err();
        let kept = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(err, StoreOpenError::RemoveName { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("another file took its place"), "{text}");
        assert!(text.contains(",keep"), "{text}");
        assert!(kept == content, "the other file is left as it was");
    }

    #[test]
    fn old_content_cut_by_its_handle_is_not_cut_again() {
        use std::os::unix::fs::PermissionsExt;
        let (path, _) = existing("cut", 3 * MIB2);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let store = std::sync::Arc::new(
            FileStore::create_with(
                &path,
                MIB2,
                4 * MIB2 as u64,
                FileOptions { overwrite: true },
                &BlockOptions::default(),
            )
            .unwrap(),
        );
        let old = OldContent::of(&store).expect("an overwritten file has old content");
        old.cut().unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert!(!store.has_old_content());
        assert!(OldContent::of(&store).is_none());
        // Whatever changes the file now is not undone by the first write.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let a = unit_image(11, MIB2);
        store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0),
            data: &a,
        }])[0]
            .as_ref()
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        std::fs::remove_file(&path).unwrap();
        assert_eq!(mode, 0o640, "the first write did not cut again");
        let (new, _path) = created("no-old-content", MIB2, 2);
        assert!(OldContent::of(&std::sync::Arc::new(new)).is_none());
        let _ = std::fs::remove_file(&_path);
    }

    #[test]
    fn a_locked_file_is_refused_and_unchanged() {
        let (path, content) = existing("locked", MIB2);
        let other = std::fs::File::open(&path).unwrap();
        lockfile::lock(&other, &path, LockMode::Shared, "--disk").unwrap();
        let err = FileStore::create_with(
            &path,
            MIB2,
            4 * MIB2 as u64,
            FileOptions { overwrite: true },
            &BlockOptions::default(),
        )
        .unwrap_err();
        let kept = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let text = err.to_string();
        assert!(matches!(err, StoreOpenError::Lock(_)), "{text}");
        assert!(text.contains("in use"), "{text}");
        assert!(text.contains("the swap store"), "{text}");
        assert!(kept == content);
        // Two stores on one new path: the second is refused as existing.
        let (store, path) = created("twice", KIB4, 4);
        let err = FileStore::create_with(
            &path,
            KIB4,
            4 * KIB4 as u64,
            FileOptions { overwrite: true },
            &BlockOptions::default(),
        )
        .unwrap_err();
        std::fs::remove_file(&path).unwrap();
        drop(store);
        assert!(matches!(err, StoreOpenError::Lock(_)), "{err}");
    }

    /// Runs `f` in a fresh 16 MiB tmpfs; skips `test` through
    /// `test_resources` (a failure where mounting is required) and returns
    /// None where mounting is not allowed.
    fn with_small_tmpfs<R: Send>(test: &str, f: impl FnOnce(&Path) -> R + Send) -> Option<R> {
        let r = blockio::test_support::with_mount(c"tmpfs", Some(c"size=16m"), f);
        if r.is_none() {
            test_resources::skip(
                test,
                test_resources::Resource::Mount,
                "cannot mount a tmpfs here (needs root and unshare)",
            );
        }
        r
    }

    #[test]
    fn a_full_filesystem_is_named_as_such_not_as_a_full_store() {
        let outcome = with_small_tmpfs(
            "a_full_filesystem_is_named_as_such_not_as_a_full_store",
            |dir| {
                let store =
                    FileStore::temporary(dir, MIB2, 64 * MIB2 as u64).map_err(|e| e.to_string())?;
                let a = unit_image(9, MIB2);
                for k in 0..64u64 {
                    let res = store.write_batch(&[WriteRequest {
                        gpa: StoreKey::new(k << 21),
                        data: &a,
                    }]);
                    if let Err(e) = &res[0] {
                        return Ok((
                            k,
                            e.to_string(),
                            matches!(e, StoreError::FilesystemFull { .. }),
                        ));
                    }
                }
                Err("64 units fitted in a 16 MiB tmpfs".to_string())
            },
        );
        let Some(outcome) = outcome else { return };
        let (written, text, is_fs_full) = outcome.unwrap();
        assert!(is_fs_full, "{text}");
        assert!(written < 16, "{written} units written");
        assert!(text.contains("no space left on the filesystem"), "{text}");
        assert!(text.contains("bytes free"), "{text}");
        assert!(text.contains(&format!("{written} of 64 slots")), "{text}");
        assert!(!text.contains("store is full"), "{text}");
        assert!(
            text.contains("TMPDIR") && text.contains(",reserve"),
            "{text}"
        );
    }

    #[test]
    fn reserve_on_a_too_small_filesystem_is_refused_at_open() {
        let outcome = with_small_tmpfs(
            "reserve_on_a_too_small_filesystem_is_refused_at_open",
            |dir| {
                let path = dir.join("store");
                let mut big =
                    FileStore::create(&path, MIB2, 64 * MIB2 as u64).map_err(|e| e.to_string())?;
                let err = big.reserve_capacity().err().map(|e| e.to_string());
                drop(big);
                let _ = std::fs::remove_file(&path);
                let mut small =
                    FileStore::temporary(dir, MIB2, 4 * MIB2 as u64).map_err(|e| e.to_string())?;
                small.reserve_capacity().map_err(|e| e.to_string())?;
                Ok::<_, String>((err, small.block.len_bytes().unwrap()))
            },
        );
        let Some(outcome) = outcome else { return };
        let (err, small_len) = outcome.unwrap();
        let text = err.expect("reserving 128 MiB on a 16 MiB tmpfs must fail");
        assert!(text.contains("cannot reserve 134217728 bytes"), "{text}");
        assert!(text.contains("bytes free"), "{text}");
        assert!(!text.contains("unknown number"), "{text}");
        assert_eq!(small_len, 4 * MIB2 as u64);
    }
}

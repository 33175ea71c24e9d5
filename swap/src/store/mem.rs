//! The compressed in-memory store (zram-like): each slot holds one unit
//! compressed with LZ4 or zstd, on the heap.
//!
//! Slots are spread over independently locked shards, and a lock is held
//! only to take or place a slot's reference-counted image: compression and
//! decompression run outside every lock, so readers and writers on different
//! threads do not wait for each other's CPU work.
//!
//! Sealed ([`MemStore::set_integrity`], `--swap-encrypt`), each image is
//! compressed first and the compressed bytes sealed: ciphertext does not
//! compress, so the other order would keep every unit at full size. The
//! tag and generation take the crc32's place in the entry.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::codec::Codec;
use super::open_error::check_unit_bytes;
use super::paged::PAGES_PER_SLOT;
use super::seal::{Check, Integrity, Place};
use super::slots::SlotTable;
use super::{PageWrite, SlotId, Store, StoreError, StoreOpenError, WriteRequest, PAGE_BYTES};
use crate::index::{PageIndex, StoreKey};
use std::collections::HashMap;

/// Shards of the slot map: enough that a fault-service thread, an eviction
/// thread and prefetchers rarely meet on one lock.
const SHARDS: usize = 16;

/// A stored unit.
struct Entry {
    /// The compressed unit, or the unit itself when compression did not
    /// make it smaller (random data).
    data: Arc<[u8]>,
    /// Whether `data` is the unit uncompressed.
    raw: bool,
    /// crc32 of the uncompressed unit, or the seal of `data`.
    check: Check,
}

/// A stored image taken out of its lock: data, raw flag, check.
type Image = (Arc<[u8]>, bool, Check);

/// Compressed units in memory; see the module docs.
pub struct MemStore {
    codec: Codec,
    unit_bytes: usize,
    budget_bytes: Option<u64>,
    table: Mutex<SlotTable>,
    /// Slot `s` is at `shards[s % SHARDS][s / SHARDS]`.
    shards: Box<[Mutex<Vec<Option<Entry>>>]>,
    /// Paged slots (split chunks): each page compressed alone, with its
    /// own checksum.
    paged: Mutex<HashMap<SlotId, Vec<Option<Entry>>>>,
    stored_bytes: AtomicU64,
    /// crc32 or sealing.
    integrity: Integrity,
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore")
            .field("codec", &self.codec)
            .field("unit_bytes", &self.unit_bytes)
            .field("budget_bytes", &self.budget_bytes)
            .field("stored_bytes", &self.stored_bytes())
            .finish()
    }
}

impl MemStore {
    /// A store of `unit_bytes` units with room for `capacity_slots` of them,
    /// whose compressed images may take at most `budget_bytes` in total
    /// (`None`: no limit beyond the slot count).
    pub fn new(
        codec: Codec,
        unit_bytes: usize,
        capacity_slots: u64,
        budget_bytes: Option<u64>,
    ) -> Result<Self, StoreOpenError> {
        check_unit_bytes(unit_bytes)?;
        if capacity_slots == 0 {
            return Err(StoreOpenError::TooSmall {
                what: "slot count".to_string(),
                capacity_bytes: 0,
                unit_bytes,
            });
        }
        if budget_bytes == Some(0) {
            return Err(StoreOpenError::TooSmall {
                what: "memory budget".to_string(),
                capacity_bytes: 0,
                unit_bytes,
            });
        }
        Ok(Self {
            codec,
            unit_bytes,
            budget_bytes,
            table: Mutex::new(SlotTable::new(capacity_slots)),
            shards: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
            paged: Mutex::new(HashMap::new()),
            stored_bytes: AtomicU64::new(0),
            integrity: Integrity::Checksum,
        })
    }

    /// Chooses how images are protected: crc32 (the default) or sealed.
    /// Before the first write (`&mut self`: not shared yet).
    pub fn set_integrity(&mut self, integrity: Integrity) {
        assert_eq!(
            self.table().used_slots(),
            0,
            "integrity chosen after slots were written"
        );
        self.integrity = integrity;
    }

    /// The compression algorithm.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Heap bytes the stored images take (compressed sizes, not counting
    /// the per-slot bookkeeping): what the store costs the host, to compare
    /// with `used_slots * unit_bytes` for the compression ratio.
    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes.load(Ordering::Relaxed)
    }

    /// Replaces the image kept for `slot` with `image`, read back as
    /// compressed, keeping the slot's checksum: what a codec bug or a
    /// flipped bit in the heap would leave. The store never does this; it
    /// is how the fuzzer (`fuzz/`, target `mem_store`) feeds
    /// [`Store::read`] corrupt images.
    pub fn replace_image(&self, slot: SlotId, image: &[u8]) -> io::Result<()> {
        let (mut shard, idx) = self.shard(slot);
        let Some(entry) = shard.get_mut(idx).and_then(Option::as_mut) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {slot} is not allocated"),
            ));
        };
        self.stored_bytes
            .fetch_add(image.len() as u64, Ordering::Relaxed);
        self.stored_bytes
            .fetch_sub(entry.data.len() as u64, Ordering::Relaxed);
        entry.data = Arc::from(image);
        entry.raw = false;
        Ok(())
    }

    /// Test aid: the stored bytes of `slot` (or of one page of a paged
    /// slot), as the medium holds them.
    #[cfg(test)]
    pub(crate) fn raw_image(&self, slot: SlotId, page: Option<usize>) -> Option<Arc<[u8]>> {
        match page {
            None => {
                let (shard, idx) = self.shard(slot);
                shard.get(idx)?.as_ref().map(|e| Arc::clone(&e.data))
            }
            Some(p) => self.paged().get(&slot)?[p]
                .as_ref()
                .map(|e| Arc::clone(&e.data)),
        }
    }

    /// Test aid: replaces the stored bytes of `slot` (or of a page),
    /// keeping the store's record of them: what an attacker with write
    /// access to the medium can do.
    #[cfg(test)]
    pub(crate) fn set_raw_image(&self, slot: SlotId, page: Option<usize>, bytes: &[u8]) {
        match page {
            None => {
                let (mut shard, idx) = self.shard(slot);
                shard[idx].as_mut().expect("slot in use").data = Arc::from(bytes);
            }
            Some(p) => {
                self.paged().get_mut(&slot).expect("paged slot")[p]
                    .as_mut()
                    .expect("page written")
                    .data = Arc::from(bytes)
            }
        }
    }

    fn table(&self) -> MutexGuard<'_, SlotTable> {
        // Single-statement updates: a panic elsewhere cannot leave it torn.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn shard(&self, slot: SlotId) -> (MutexGuard<'_, Vec<Option<Entry>>>, usize) {
        let guard = self.shards[slot.index() % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        (guard, slot.index() / SHARDS)
    }

    fn full(&self, gpa: StoreKey) -> StoreError {
        let capacity_slots = self.table().capacity_slots();
        StoreError::Full {
            gpa,
            capacity_bytes: self
                .budget_bytes
                .unwrap_or(capacity_slots * self.unit_bytes as u64),
            capacity_slots,
        }
    }

    fn paged(&self) -> MutexGuard<'_, HashMap<SlotId, Vec<Option<Entry>>>> {
        self.paged.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wrong_length(gpa: StoreKey, slot: SlotId, got: usize, want: usize) -> StoreError {
        StoreError::Io {
            gpa,
            slot,
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("buffer of {got} bytes given for a {want}-byte unit (an engine bug)"),
            ),
        }
    }

    /// Compresses `data` (a unit, or a page of a paged slot, as `at`
    /// says), seals it when sealed, and charges its size to the budget.
    fn pack(&self, data: &[u8], at: Place) -> Result<Entry, StoreError> {
        let (gpa, slot) = (at.gpa, at.slot);
        let crc = (!self.integrity.is_sealed()).then(|| crc32fast::hash(data));
        let packed =
            self.codec
                .compress(data)
                .map_err(|source| StoreError::Io { gpa, slot, source })?;
        let (mut bytes, raw): (Box<[u8]>, bool) = if packed.len() < data.len() {
            (packed, false)
        } else {
            (Box::from(data), true)
        };
        let check = match crc {
            Some(crc) => Check::Crc(crc),
            None => self.integrity.protect(at, &mut bytes)?,
        };
        let data: Arc<[u8]> = Arc::from(bytes);
        let len = data.len() as u64;
        let before = self.stored_bytes.fetch_add(len, Ordering::Relaxed);
        if self
            .budget_bytes
            .is_some_and(|budget| before + len > budget)
        {
            self.stored_bytes.fetch_sub(len, Ordering::Relaxed);
            return Err(self.full(gpa));
        }
        Ok(Entry { data, raw, check })
    }

    /// Gives back an entry's budget.
    fn unpack_budget(&self, entry: &Entry) {
        self.stored_bytes
            .fetch_sub(entry.data.len() as u64, Ordering::Relaxed);
    }

    /// Decompresses `image` into `buf`, which it must fill exactly.
    fn decompress_exact(&self, image: &[u8], at: Place, buf: &mut [u8]) -> Result<(), StoreError> {
        let (gpa, slot) = (at.gpa, at.slot);
        let got = self
            .codec
            .decompress_into(image, buf)
            .map_err(|source| StoreError::Io { gpa, slot, source })?;
        if got != buf.len() {
            return Err(StoreError::ShortRead {
                gpa,
                slot,
                got_bytes: got,
                want_bytes: buf.len(),
            });
        }
        Ok(())
    }

    /// Decompresses an entry into `buf` (its exact length) and verifies it
    /// (sealed: opens it first, then decompresses what it vouched for).
    fn unpack(
        &self,
        (data, raw, check): Image,
        at: Place,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        let (gpa, slot) = (at.gpa, at.slot);
        let expected = match check {
            Check::Crc(crc) => crc,
            Check::Sealed(_) if raw => {
                if data.len() != buf.len() {
                    return Err(Self::wrong_length(gpa, slot, data.len(), buf.len()));
                }
                buf.copy_from_slice(&data);
                return self.integrity.verify(at, check, buf);
            }
            Check::Sealed(_) => {
                // The shared image stays sealed: open a copy of it.
                let mut opened = data.to_vec();
                self.integrity.verify(at, check, &mut opened)?;
                return self.decompress_exact(&opened, at, buf);
            }
        };
        if raw {
            buf.copy_from_slice(&data);
        } else {
            self.decompress_exact(&data, at, buf)?;
        }
        let found = crc32fast::hash(buf);
        if found != expected {
            return Err(StoreError::Checksum {
                gpa,
                slot,
                expected,
                found,
            });
        }
        Ok(())
    }

    /// Compresses one unit and places it in a new slot.
    fn write_one(&self, req: &WriteRequest<'_>) -> Result<SlotId, StoreError> {
        if req.data.len() != self.unit_bytes {
            return Err(Self::wrong_length(
                req.gpa,
                SlotId::new(0),
                req.data.len(),
                self.unit_bytes,
            ));
        }
        // The slot first: a sealed image is bound to it.
        let Some(slot) = self.table().alloc() else {
            return Err(self.full(req.gpa));
        };
        let entry = match self.pack(req.data, Place::unit(slot, req.gpa)) {
            Ok(entry) => entry,
            Err(e) => {
                self.table().free(slot);
                return Err(e);
            }
        };
        let (mut shard, idx) = self.shard(slot);
        if shard.len() <= idx {
            shard.resize_with(idx + 1, || None);
        }
        shard[idx] = Some(entry);
        Ok(slot)
    }
}

impl Store for MemStore {
    fn unit_bytes(&self) -> usize {
        self.unit_bytes
    }

    fn capacity_slots(&self) -> u64 {
        self.table().capacity_slots()
    }

    fn describe(&self) -> String {
        let plain = match self.budget_bytes {
            Some(b) => format!("mem:{} (budget {} MiB)", self.codec, b >> 20),
            None => format!("mem:{}", self.codec),
        };
        match &self.integrity {
            Integrity::Checksum => plain,
            sealed => format!("{plain} [{}]", sealed.describe()),
        }
    }

    fn sealed(&self) -> bool {
        self.integrity.is_sealed()
    }

    /// Compresses the batch on the calling thread, one unit after another.
    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Vec<Result<SlotId, StoreError>> {
        requests.iter().map(|req| self.write_one(req)).collect()
    }

    fn read(&self, slot: SlotId, gpa: StoreKey, buf: &mut [u8]) -> Result<(), StoreError> {
        let image = {
            let (shard, idx) = self.shard(slot);
            match shard.get(idx).and_then(Option::as_ref) {
                Some(e) => (Arc::clone(&e.data), e.raw, e.check),
                None => return Err(StoreError::BadSlot { gpa, slot }),
            }
        };
        if buf.len() != self.unit_bytes {
            return Err(Self::wrong_length(gpa, slot, buf.len(), self.unit_bytes));
        }
        self.unpack(image, Place::unit(slot, gpa), buf)
    }

    fn supports_pages(&self) -> bool {
        self.unit_bytes == PAGES_PER_SLOT * PAGE_BYTES
    }

    fn allocate_paged(&self, gpa: StoreKey) -> Result<SlotId, StoreError> {
        let slot = self.table().alloc().ok_or_else(|| self.full(gpa))?;
        self.paged()
            .insert(slot, (0..PAGES_PER_SLOT).map(|_| None).collect());
        Ok(slot)
    }

    /// Verifies the unit, then keeps its pages compressed one by one (so
    /// that each can be read alone) in place of the unit's image.
    fn read_and_split(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        self.read(slot, gpa, buf)?;
        let mut pages = Vec::with_capacity(PAGES_PER_SLOT);
        for (page, data) in buf.chunks_exact(PAGE_BYTES).enumerate() {
            match self.pack(
                data,
                Place::page(
                    slot,
                    PageIndex::new(page),
                    gpa.offset_by((page * PAGE_BYTES) as u64),
                ),
            ) {
                Ok(entry) => pages.push(Some(entry)),
                Err(e) => {
                    pages.iter().flatten().for_each(|e| self.unpack_budget(e));
                    return Err(e);
                }
            }
        }
        let whole = {
            let (mut shard, idx) = self.shard(slot);
            shard.get_mut(idx).and_then(Option::take)
        };
        if let Some(whole) = whole {
            self.unpack_budget(&whole);
        }
        self.paged().insert(slot, pages);
        Ok(())
    }

    fn write_pages(&self, slot: SlotId, pages: &[PageWrite<'_>]) -> Vec<Result<(), StoreError>> {
        pages
            .iter()
            .map(|p| {
                if p.data.len() != PAGE_BYTES || p.page.get() >= PAGES_PER_SLOT {
                    return Err(Self::wrong_length(p.gpa, slot, p.data.len(), PAGE_BYTES));
                }
                if !self.paged().contains_key(&slot) {
                    return Err(StoreError::BadSlot { gpa: p.gpa, slot });
                }
                let entry = self.pack(p.data, Place::page(slot, p.page, p.gpa))?;
                let mut paged = self.paged();
                match paged.get_mut(&slot) {
                    Some(pages) => {
                        if let Some(old) = pages[p.page.get()].replace(entry) {
                            self.unpack_budget(&old);
                        }
                        Ok(())
                    }
                    None => {
                        self.unpack_budget(&entry);
                        Err(StoreError::BadSlot { gpa: p.gpa, slot })
                    }
                }
            })
            .collect()
    }

    fn read_paged_unit(
        &self,
        slot: SlotId,
        gpa: StoreKey,
        buf: &mut [u8],
    ) -> Result<(), StoreError> {
        if buf.len() != self.unit_bytes {
            return Err(Self::wrong_length(gpa, slot, buf.len(), self.unit_bytes));
        }
        let images: Vec<Option<Image>> = self
            .paged()
            .get(&slot)
            .ok_or(StoreError::BadSlot { gpa, slot })?
            .iter()
            .map(|e| e.as_ref().map(|e| (Arc::clone(&e.data), e.raw, e.check)))
            .collect();
        for (page, (image, data)) in images
            .into_iter()
            .zip(buf.chunks_exact_mut(PAGE_BYTES))
            .enumerate()
        {
            if let Some(image) = image {
                let at = Place::page(
                    slot,
                    PageIndex::new(page),
                    gpa.offset_by((page * PAGE_BYTES) as u64),
                );
                self.unpack(image, at, data)?;
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
            return Err(Self::wrong_length(gpa, slot, buf.len(), PAGE_BYTES));
        }
        let image = self
            .paged()
            .get(&slot)
            .and_then(|pages| pages[page.get()].as_ref())
            .map(|e| (Arc::clone(&e.data), e.raw, e.check))
            .ok_or(StoreError::BadSlot { gpa, slot })?;
        self.unpack(image, Place::page(slot, page, gpa), buf)
    }

    fn free(&self, slot: SlotId) {
        // The image goes before the slot number is released, so that a
        // writer reusing the number cannot have its new image dropped here.
        let entry = {
            let (mut shard, idx) = self.shard(slot);
            shard.get_mut(idx).and_then(Option::take)
        };
        if let Some(e) = entry {
            self.unpack_budget(&e);
            self.table().free(slot);
        } else if let Some(pages) = self.paged().remove(&slot) {
            pages.iter().flatten().for_each(|e| self.unpack_budget(e));
            self.table().free(slot);
        }
    }

    fn used_slots(&self) -> u64 {
        self.table().used_slots()
    }

    fn stored_bytes(&self) -> u64 {
        MemStore::stored_bytes(self)
    }

    /// Decompresses the image, flips a byte and compresses it again, keeping
    /// the old checksum: the next read then decompresses fine and fails the
    /// checksum, as real corruption of the unit would.
    fn corrupt_slot(&self, slot: SlotId) -> io::Result<()> {
        let (mut shard, idx) = self.shard(slot);
        let mut paged = self.paged();
        // A paged slot: damage its first written page.
        let page = paged
            .get_mut(&slot)
            .and_then(|pages| pages.iter_mut().flatten().next());
        let (entry, unit_bytes) = match (shard.get_mut(idx).and_then(Option::as_mut), page) {
            (Some(entry), _) => (entry, self.unit_bytes),
            (None, Some(page)) => (page, PAGE_BYTES),
            (None, None) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("slot {slot} is not allocated (or a paged slot with no page)"),
                ))
            }
        };
        if self.integrity.is_sealed() {
            // Sealed bytes: flip one of them (flipping it again undoes it,
            // which the faulty store's transient corruption relies on).
            let mut sealed = entry.data.to_vec();
            let at = sealed.len() / 2;
            sealed[at] ^= 0x5a;
            entry.data = Arc::from(sealed);
            return Ok(());
        }
        let mut unit = vec![0u8; unit_bytes];
        if entry.raw {
            unit.copy_from_slice(&entry.data);
        } else {
            self.codec.decompress_into(&entry.data, &mut unit)?;
        }
        unit[unit_bytes / 2] ^= 0x5a;
        let packed: Arc<[u8]> = if entry.raw {
            Arc::from(unit)
        } else {
            Arc::from(self.codec.compress(&unit)?)
        };
        let old_len = entry.data.len() as u64;
        self.stored_bytes
            .fetch_add(packed.len() as u64, Ordering::Relaxed);
        self.stored_bytes.fetch_sub(old_len, Ordering::Relaxed);
        entry.data = packed;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_support::{
        check_concurrent, check_paged, check_round_trip, check_slot_reuse, unit_image,
    };
    use blockio::AlignedBuf;

    const MIB2: usize = 2 << 20;
    const KIB4: usize = 4096;

    #[test]
    fn round_trip_both_units_both_codecs() {
        for codec in [Codec::Lz4, Codec::Zstd] {
            check_round_trip(&MemStore::new(codec, MIB2, 64, None).unwrap(), 40);
            check_round_trip(&MemStore::new(codec, KIB4, 4096, None).unwrap(), 1000);
        }
    }

    #[test]
    fn paged_slots_keep_a_split_chunks_pages() {
        check_paged(&MemStore::new(Codec::Lz4, MIB2, 8, None).unwrap());
        check_paged(&MemStore::new(Codec::Zstd, MIB2, 8, None).unwrap());
    }

    #[test]
    fn slots_are_reused_after_free() {
        check_slot_reuse(&MemStore::new(Codec::Lz4, MIB2, 8, None).unwrap());
        check_slot_reuse(&MemStore::new(Codec::Zstd, KIB4, 8, None).unwrap());
    }

    #[test]
    fn concurrent_readers_and_a_batch_writer() {
        check_concurrent(Arc::new(MemStore::new(Codec::Lz4, MIB2, 64, None).unwrap()));
        check_concurrent(Arc::new(
            MemStore::new(Codec::Zstd, KIB4, 2048, None).unwrap(),
        ));
    }

    #[test]
    fn stored_bytes_counts_compressed_images() {
        let store = MemStore::new(Codec::Lz4, MIB2, 8, None).unwrap();
        let img = unit_image(1, MIB2);
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0),
            data: &img,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        let stored = store.stored_bytes();
        assert!(stored > 0 && stored < MIB2 as u64 * 3 / 4, "{stored}");
        // Random data does not compress and is kept as it is.
        let mut random = vec![0u8; MIB2];
        let mut x = 0x1234_5678_9abc_def1u64;
        for b in random.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let raw_slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(1 << 21),
            data: &random,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        assert_eq!(store.stored_bytes(), stored + MIB2 as u64);
        let mut out = AlignedBuf::new(MIB2, 4096);
        store
            .read(raw_slot, StoreKey::new(1 << 21), &mut out)
            .unwrap();
        assert!(out[..] == random[..]);
        store.free(slot);
        store.free(raw_slot);
        assert_eq!(store.stored_bytes(), 0);
    }

    #[test]
    fn budget_makes_the_store_full() {
        let img = unit_image(2, MIB2);
        let one = Codec::Zstd.compress(&img).unwrap().len() as u64;
        let store = MemStore::new(Codec::Zstd, MIB2, 64, Some(2 * one + one / 2)).unwrap();
        let reqs: Vec<WriteRequest> = (0..3)
            .map(|k| WriteRequest {
                gpa: StoreKey::new(k << 21),
                data: &img,
            })
            .collect();
        let res = store.write_batch(&reqs);
        assert!(res[0].is_ok() && res[1].is_ok());
        assert!(
            matches!(res[2], Err(StoreError::Full { gpa, .. }) if gpa == StoreKey::new(0x40_0000)),
            "{:?}",
            res[2]
        );
        assert_eq!(store.used_slots(), 2);
        // The slot count limits too.
        let store = MemStore::new(Codec::Lz4, KIB4, 1, None).unwrap();
        let small = unit_image(3, KIB4);
        let res = store.write_batch(&[
            WriteRequest {
                gpa: StoreKey::new(0),
                data: &small,
            },
            WriteRequest {
                gpa: StoreKey::new(0x1000),
                data: &small,
            },
        ]);
        assert!(res[0].is_ok());
        assert!(matches!(
            res[1],
            Err(StoreError::Full {
                capacity_slots: 1,
                ..
            })
        ));
    }

    #[test]
    fn corruption_is_a_checksum_error() {
        for codec in [Codec::Lz4, Codec::Zstd] {
            let store = MemStore::new(codec, MIB2, 4, None).unwrap();
            let img = unit_image(4, MIB2);
            let slot = store.write_batch(&[WriteRequest {
                gpa: StoreKey::new(0x80_0000),
                data: &img,
            }])[0]
                .as_ref()
                .copied()
                .unwrap();
            store.corrupt_slot(slot).unwrap();
            let mut out = AlignedBuf::new(MIB2, 4096);
            assert!(
                matches!(
                    store.read(slot, StoreKey::new(0x80_0000), &mut out),
                    Err(StoreError::Checksum { gpa, .. }) if gpa == StoreKey::new(0x80_0000)
                ),
                "{codec}"
            );
        }
    }

    #[test]
    fn bad_slot_and_bad_unit() {
        let store = MemStore::new(Codec::Lz4, KIB4, 4, None).unwrap();
        let mut out = vec![0u8; KIB4];
        assert!(matches!(
            store.read(SlotId::new(3), StoreKey::new(0), &mut out),
            Err(StoreError::BadSlot { slot, .. }) if slot == SlotId::new(3)
        ));
        assert!(matches!(
            MemStore::new(Codec::Lz4, 100, 4, None),
            Err(StoreOpenError::BadUnit { unit_bytes: 100 })
        ));
        assert_eq!(store.describe(), "mem:lz4");
    }
}

//! Sealed stores (`--swap-encrypt`) against someone who reads or writes
//! their medium: the file store's image file and the memory store's heap
//! images. Each kind of tampering (a flipped bit, a slot copied over
//! another, an older image written back) must fail to open, naming the
//! guest address, on whole units and on the pages of split chunks; and
//! the medium must not hold the plaintext.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::codec::Codec;
use super::retry::{RetryPolicy, RetryingStore};
use super::seal::{Integrity, Sealer};
use super::test_support::{check_concurrent, check_paged, check_round_trip, unit_image};
use super::{FileStore, MemStore, PageWrite, SlotId, Store, StoreError, WriteRequest, PAGE_BYTES};
use crate::index::{PageIndex, StoreKey};
use blockio::AlignedBuf;

const MIB2: usize = 2 << 20;
const GPA_A: StoreKey = StoreKey::new(0x20_0000);
const GPA_B: StoreKey = StoreKey::new(0x40_0000);

fn sealed() -> Integrity {
    Integrity::Sealed(Arc::new(Sealer::random().expect("a random key")))
}

/// Raw access to a store's medium, as an attacker has it.
trait Medium {
    fn store(&self) -> &dyn Store;
    /// The stored bytes of a unit (`page` None) or of one page.
    fn get(&self, slot: SlotId, page: Option<usize>) -> Vec<u8>;
    fn put(&self, slot: SlotId, page: Option<usize>, bytes: &[u8]);
}

struct FileMedium {
    store: FileStore,
    path: PathBuf,
    file: std::fs::File,
}

impl FileMedium {
    fn new(name: &str, integrity: Integrity) -> FileMedium {
        let path = blockio::test_support::test_dir()
            .join(format!(".sealtest-{name}-{}", std::process::id()));
        let mut store = FileStore::create(&path, MIB2, 16 * MIB2 as u64).unwrap();
        store.set_integrity(integrity);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        FileMedium { store, path, file }
    }

    fn range(slot: SlotId, page: Option<usize>) -> (u64, usize) {
        let base = u64::from(slot) * MIB2 as u64;
        match page {
            None => (base, MIB2),
            Some(p) => (base + (p * PAGE_BYTES) as u64, PAGE_BYTES),
        }
    }

    fn whole_file(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }
}

impl Drop for FileMedium {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Medium for FileMedium {
    fn store(&self) -> &dyn Store {
        &self.store
    }
    fn get(&self, slot: SlotId, page: Option<usize>) -> Vec<u8> {
        let (offset, len) = Self::range(slot, page);
        let mut out = vec![0u8; len];
        self.file.read_exact_at(&mut out, offset).unwrap();
        out
    }
    fn put(&self, slot: SlotId, page: Option<usize>, bytes: &[u8]) {
        let (offset, _) = Self::range(slot, page);
        self.file.write_all_at(bytes, offset).unwrap();
        self.file.sync_data().unwrap();
    }
}

struct MemMedium(MemStore);

impl MemMedium {
    fn new(codec: Codec, integrity: Integrity) -> MemMedium {
        let mut store = MemStore::new(codec, MIB2, 16, None).unwrap();
        store.set_integrity(integrity);
        MemMedium(store)
    }
}

impl Medium for MemMedium {
    fn store(&self) -> &dyn Store {
        &self.0
    }
    fn get(&self, slot: SlotId, page: Option<usize>) -> Vec<u8> {
        self.0.raw_image(slot, page).expect("stored").to_vec()
    }
    fn put(&self, slot: SlotId, page: Option<usize>, bytes: &[u8]) {
        self.0.set_raw_image(slot, page, bytes)
    }
}

fn write(store: &dyn Store, gpa: StoreKey, data: &[u8]) -> SlotId {
    store
        .write_batch(&[WriteRequest { gpa, data }])
        .remove(0)
        .expect("write")
}

/// The error must be an authentication failure naming `want_gpa`.
fn assert_auth(result: Result<(), StoreError>, want_gpa: StoreKey, what: &str) {
    match result {
        Err(e @ StoreError::Authentication { gpa, .. }) => {
            assert_eq!(gpa, want_gpa, "{what}: {e}");
            assert!(e.to_string().contains(&format!("{want_gpa:#x}")), "{e}");
        }
        other => panic!("{what}: expected an authentication failure, got {other:?}"),
    }
}

/// Every kind of tampering with whole units, then with the pages of a
/// split chunk, on one medium.
fn check_tampering(m: &dyn Medium) {
    let store = m.store();
    assert!(store.sealed());
    let a = unit_image(1, MIB2);
    let b = unit_image(2, MIB2);
    let sa = write(store, GPA_A, &a);
    let sb = write(store, GPA_B, &b);
    let mut buf = AlignedBuf::new(MIB2, 4096);

    // A flipped bit.
    let original_b = m.get(sb, None);
    let mut flipped = original_b.clone();
    let third = flipped.len() / 3;
    flipped[third] ^= 0x04;
    m.put(sb, None, &flipped);
    assert_auth(store.read(sb, GPA_B, &mut buf), GPA_B, "flipped bit");
    m.put(sb, None, &original_b);
    store.read(sb, GPA_B, &mut buf).unwrap();
    assert!(buf[..] == b[..]);

    // A slot copied over another (the copy is a valid image, of A).
    m.put(sb, None, &m.get(sa, None));
    assert_auth(
        store.read(sb, GPA_B, &mut buf),
        GPA_B,
        "slot copied over another",
    );
    m.put(sb, None, &original_b);
    // The right slot read for the wrong chunk fails too.
    assert_auth(
        store.read(sb, GPA_A, &mut buf),
        GPA_A,
        "slot read as another chunk",
    );
    store.read(sa, GPA_A, &mut buf).unwrap();
    assert!(buf[..] == a[..]);

    // An older image written back: the chunk at A is evicted again with
    // new content into the same (lowest free) slot, then its first image
    // is put back.
    let old_a = m.get(sa, None);
    store.free(sa);
    let a2 = unit_image(3, MIB2);
    let sa2 = write(store, GPA_A, &a2);
    assert_eq!(sa2, sa, "the freed slot is reused");
    m.put(sa2, None, &old_a);
    assert_auth(
        store.read(sa2, GPA_A, &mut buf),
        GPA_A,
        "old image written back",
    );

    // Pages of a split chunk: each page is sealed alone.
    store.read_and_split(sb, GPA_B, &mut buf).unwrap();
    assert!(buf[..] == b[..]);
    let page_gpa = |p: usize| GPA_B.offset_by((p * PAGE_BYTES) as u64);
    let mut page = AlignedBuf::new(PAGE_BYTES, 4096);
    store
        .read_page(sb, PageIndex::new(7), page_gpa(7), &mut page)
        .unwrap();
    assert!(page[..] == b[7 * PAGE_BYTES..8 * PAGE_BYTES]);
    let v1 = unit_image(10, PAGE_BYTES);
    let v2 = unit_image(11, PAGE_BYTES);
    for v in [&v1, &v2] {
        let r = store.write_pages(
            sb,
            &[PageWrite {
                page: PageIndex::new(5),
                gpa: page_gpa(5),
                data: v,
            }],
        );
        assert!(r.into_iter().all(|r| r.is_ok()));
    }
    let page5 = m.get(sb, Some(5));
    // Flipped bit in a page.
    let mut flipped = page5.clone();
    flipped[0] ^= 0x80;
    m.put(sb, Some(5), &flipped);
    assert_auth(
        store.read_page(sb, PageIndex::new(5), page_gpa(5), &mut page),
        page_gpa(5),
        "flipped bit in a page",
    );
    // Another page (a valid image) copied over it.
    m.put(sb, Some(5), &m.get(sb, Some(7)));
    assert_auth(
        store.read_page(sb, PageIndex::new(5), page_gpa(5), &mut page),
        page_gpa(5),
        "page copied over another",
    );
    // The whole-chunk read of a collapse finds it too, naming the page.
    assert_auth(
        store.read_paged_unit(sb, GPA_B, &mut buf),
        page_gpa(5),
        "collapse read of a damaged page",
    );
    m.put(sb, Some(5), &page5);
    store
        .read_page(sb, PageIndex::new(5), page_gpa(5), &mut page)
        .unwrap();
    assert!(page[..] == v2[..]);
    // An older image of the page written back.
    let r = store.write_pages(
        sb,
        &[PageWrite {
            page: PageIndex::new(6),
            gpa: page_gpa(6),
            data: &v1,
        }],
    );
    assert!(r.into_iter().all(|r| r.is_ok()));
    let old6 = m.get(sb, Some(6));
    let r = store.write_pages(
        sb,
        &[PageWrite {
            page: PageIndex::new(6),
            gpa: page_gpa(6),
            data: &v2,
        }],
    );
    assert!(r.into_iter().all(|r| r.is_ok()));
    m.put(sb, Some(6), &old6);
    assert_auth(
        store.read_page(sb, PageIndex::new(6), page_gpa(6), &mut page),
        page_gpa(6),
        "old page image written back",
    );
    store.free(sb);
    store.free(sa2);
    assert_eq!(store.used_slots(), 0);
}

#[test]
fn tampering_with_a_sealed_file_store_is_detected_with_the_address() {
    check_tampering(&FileMedium::new("tamper", sealed()));
}

#[test]
fn tampering_with_a_sealed_mem_store_is_detected_with_the_address() {
    for codec in [Codec::Lz4, Codec::Zstd] {
        check_tampering(&MemMedium::new(codec, sealed()));
    }
}

#[test]
fn sealed_stores_pass_the_common_store_checks() {
    let file = FileMedium::new("common", sealed());
    check_round_trip(&file.store, 12);
    check_paged(&file.store);
    for codec in [Codec::Lz4, Codec::Zstd] {
        let mem = MemMedium::new(codec, sealed());
        check_round_trip(&mem.0, 12);
        check_paged(&mem.0);
    }
    let mut mem = MemStore::new(Codec::Lz4, MIB2, 64, None).unwrap();
    mem.set_integrity(sealed());
    check_concurrent(Arc::new(mem));
    let dir = blockio::test_support::test_dir();
    let mut file = FileStore::temporary(&dir, MIB2, 64 * MIB2 as u64).unwrap();
    file.set_integrity(sealed());
    assert!(
        file.describe().contains("sealed: AES-256-GCM"),
        "{}",
        file.describe()
    );
    check_concurrent(Arc::new(file));
}

/// Counts occurrences of `needle` in `hay`.
fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[test]
fn the_medium_holds_no_plaintext_when_sealed_and_does_without() {
    // The text pages of `unit_image` repeat these words; the control run
    // (crc32 only) shows the scan finds them.
    let needle = b"kernel ";
    let write_all = |m: &FileMedium| {
        for k in 0..6u64 {
            write(&m.store, StoreKey::new(k << 21), &unit_image(20 + k, MIB2));
        }
        // And the pages of a split chunk.
        let slot = write(&m.store, StoreKey::new(6 << 21), &unit_image(30, MIB2));
        let mut buf = AlignedBuf::new(MIB2, 4096);
        m.store
            .read_and_split(slot, StoreKey::new(6 << 21), &mut buf)
            .unwrap();
        let page = unit_image(31, PAGE_BYTES);
        let r = m.store.write_pages(
            slot,
            &[PageWrite {
                page: PageIndex::new(9),
                gpa: StoreKey::new((6 << 21) + 9 * PAGE_BYTES as u64),
                data: &page,
            }],
        );
        assert!(r.into_iter().all(|r| r.is_ok()));
    };
    let plain = FileMedium::new("plain", Integrity::Checksum);
    write_all(&plain);
    assert!(count(&plain.whole_file(), needle) > 100);
    let sealed_m = FileMedium::new("sealed", sealed());
    write_all(&sealed_m);
    let image = sealed_m.whole_file();
    assert_eq!(image.len(), plain.whole_file().len());
    assert_eq!(count(&image, needle), 0);
    // Ciphertext: no long runs of zeros although half the pages were zero.
    assert!(image.chunks(PAGE_BYTES).all(|p| p.iter().any(|&b| b != 0)));
    // The mem store keeps its compression: compress, then seal.
    let mem = MemMedium::new(Codec::Lz4, sealed());
    let img = unit_image(40, MIB2);
    let slot = write(&mem.0, StoreKey::new(0), &img);
    assert!(
        mem.0.stored_bytes() < MIB2 as u64 * 3 / 4,
        "{}",
        mem.0.stored_bytes()
    );
    assert_eq!(count(&mem.get(slot, None), needle), 0);
}

#[test]
fn authentication_failures_are_read_twice_then_fatal_and_counted() {
    let policy = RetryPolicy {
        first_backoff: std::time::Duration::ZERO,
        max_backoff: std::time::Duration::ZERO,
        ..RetryPolicy::default()
    };
    let mem = Arc::new(MemMedium::new(Codec::Lz4, sealed()));
    let store = RetryingStore::new(Arc::new(ArcMem(Arc::clone(&mem))) as Arc<dyn Store>, policy);
    let img = unit_image(50, MIB2);
    let slot = write(&store, GPA_A, &img);
    let mut bytes = mem.get(slot, None);
    bytes[10] ^= 1;
    mem.put(slot, None, &bytes);
    let mut buf = AlignedBuf::new(MIB2, 4096);
    assert_auth(
        store.read(slot, GPA_A, &mut buf),
        GPA_A,
        "through the retry policy",
    );
    assert!(
        buf.iter().all(|&b| b == 0),
        "nothing of a forged image is handed on"
    );
    let r = store.report();
    assert_eq!(
        (
            r.retry.auth_rereads,
            r.retry.auth_fatal,
            r.retry.auth_recovered
        ),
        (1, 1, 0),
        "{r:?}"
    );
    assert_eq!((r.retry.checksum_rereads, r.retry.retries), (0, 0), "{r:?}");
    assert!(r.sealed, "the report says the store is sealed");
}

#[test]
fn a_transient_corruption_of_a_sealed_slot_is_recovered_by_the_reread() {
    use super::faulty::{Faults, FaultyStore};
    let policy = RetryPolicy {
        first_backoff: std::time::Duration::ZERO,
        max_backoff: std::time::Duration::ZERO,
        ..RetryPolicy::default()
    };
    let mut mem = MemStore::new(Codec::Zstd, MIB2, 8, None).unwrap();
    mem.set_integrity(sealed());
    let faults = Faults {
        transient_corrupt_every: Some(1),
        ..Faults::default()
    };
    let store = RetryingStore::new(Arc::new(FaultyStore::new(Arc::new(mem), faults)), policy);
    assert!(store.sealed());
    let img = unit_image(60, MIB2);
    let slot = write(&store, GPA_B, &img);
    let mut buf = AlignedBuf::new(MIB2, 4096);
    store.read(slot, GPA_B, &mut buf).unwrap();
    assert!(buf[..] == img[..]);
    let r = store.report();
    assert_eq!(
        (r.retry.auth_rereads, r.retry.auth_recovered),
        (1, 1),
        "{r:?}"
    );
}

/// A shared mem medium as a store (the retry policy takes ownership).
struct ArcMem(Arc<MemMedium>);

impl Store for ArcMem {
    fn unit_bytes(&self) -> usize {
        self.0 .0.unit_bytes()
    }
    fn capacity_slots(&self) -> u64 {
        self.0 .0.capacity_slots()
    }
    fn describe(&self) -> String {
        self.0 .0.describe()
    }
    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Vec<Result<SlotId, StoreError>> {
        self.0 .0.write_batch(requests)
    }
    fn read(&self, slot: SlotId, gpa: StoreKey, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0 .0.read(slot, gpa, buf)
    }
    fn free(&self, slot: SlotId) {
        self.0 .0.free(slot)
    }
    fn used_slots(&self) -> u64 {
        self.0 .0.used_slots()
    }
    fn sealed(&self) -> bool {
        self.0 .0.sealed()
    }
}

#[test]
fn a_spec_opens_sealed_stores_of_every_kind() {
    let integrity = sealed();
    for spec in ["mem:lz4", "mem:zstd", "default", "faulty:inner=mem:lz4"] {
        let spec: super::StoreSpec = spec.parse().unwrap();
        let store = spec.open_with(MIB2, 8 * MIB2 as u64, &integrity).unwrap();
        assert!(store.sealed(), "{spec}");
        let img = unit_image(70, MIB2);
        let slot = write(&*store, GPA_A, &img);
        let mut buf = AlignedBuf::new(MIB2, 4096);
        store.read(slot, GPA_A, &mut buf).unwrap();
        assert!(buf[..] == img[..]);
        let plain = spec.open(MIB2, 8 * MIB2 as u64).unwrap();
        assert!(!plain.sealed(), "{spec}");
    }
}

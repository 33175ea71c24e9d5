//! Checks every store must pass, shared by the stores' unit tests.

use std::collections::HashMap;
use std::sync::Arc;

use super::{SlotId, Store, WriteRequest};
use crate::index::{PageIndex, StoreKey};
use blockio::AlignedBuf;

/// A deterministic, guest-like unit: per 4 KiB page, about half zero, a
/// quarter text-like, a quarter random; every page starts with the seed so
/// that no two seeds give the same unit.
pub(crate) fn unit_image(seed: u64, len: usize) -> AlignedBuf {
    const WORDS: [&str; 8] = [
        "the ", "kernel ", "page ", "swap ", "chunk ", "guest ", "memory ", "\n",
    ];
    let mut buf = AlignedBuf::new(len, 4096);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for page in buf.chunks_mut(4096) {
        match next() % 4 {
            0 | 1 => {}
            2 => {
                let mut at = 0;
                while at < page.len() {
                    let w = WORDS[(next() % 8) as usize].as_bytes();
                    let n = w.len().min(page.len() - at);
                    page[at..at + n].copy_from_slice(&w[..n]);
                    at += n;
                }
            }
            _ => {
                for word in page.chunks_mut(8) {
                    word.copy_from_slice(&next().to_le_bytes()[..word.len()]);
                }
            }
        }
        page[..8].copy_from_slice(&seed.to_le_bytes());
    }
    buf
}

fn write_all(store: &dyn Store, seeds: &[u64]) -> Vec<SlotId> {
    let unit = store.unit_bytes();
    let images: Vec<AlignedBuf> = seeds.iter().map(|&s| unit_image(s, unit)).collect();
    let mut slots = Vec::new();
    for (batch_seeds, batch) in seeds.chunks(16).zip(images.chunks(16)) {
        let reqs: Vec<WriteRequest<'_>> = batch_seeds
            .iter()
            .zip(batch)
            .map(|(&s, img)| WriteRequest {
                gpa: StoreKey::new(s * unit as u64),
                data: img,
            })
            .collect();
        for r in store.write_batch(&reqs) {
            slots.push(r.expect("write"));
        }
    }
    slots
}

fn check_slot(store: &dyn Store, slot: SlotId, seed: u64, buf: &mut [u8]) {
    let unit = store.unit_bytes();
    store
        .read(slot, StoreKey::new(seed * unit as u64), buf)
        .unwrap_or_else(|e| panic!("read of slot {slot}: {e}"));
    assert!(
        buf[..] == unit_image(seed, unit)[..],
        "slot {slot} holds the wrong unit"
    );
}

/// Writes `count` units in batches, reads them all back, frees them all.
pub(crate) fn check_round_trip(store: &dyn Store, count: u64) {
    let seeds: Vec<u64> = (1..=count).collect();
    let slots = write_all(store, &seeds);
    let mut distinct = slots.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), slots.len(), "slots handed out twice");
    assert_eq!(store.used_slots(), count);
    assert!(store.stored_bytes() > 0);
    let mut buf = AlignedBuf::new(store.unit_bytes(), 4096);
    for (&slot, &seed) in slots.iter().zip(&seeds).rev() {
        check_slot(store, slot, seed, &mut buf);
    }
    for slot in slots {
        store.free(slot);
    }
    assert_eq!(store.used_slots(), 0);
    assert_eq!(store.stored_bytes(), 0);
}

/// A freed slot is handed out again and the others keep their content.
pub(crate) fn check_slot_reuse(store: &dyn Store) {
    let slots = write_all(store, &[1, 2, 3]);
    store.free(slots[1]);
    let again = write_all(store, &[4]);
    assert_eq!(again[0], slots[1], "the lowest free slot is reused");
    let mut buf = AlignedBuf::new(store.unit_bytes(), 4096);
    check_slot(store, slots[0], 1, &mut buf);
    check_slot(store, again[0], 4, &mut buf);
    check_slot(store, slots[2], 3, &mut buf);
    for s in [slots[0], again[0], slots[2]] {
        store.free(s);
    }
}

/// Three threads read and check prefilled slots while a fourth writes
/// batches; then everything written is checked.
pub(crate) fn check_concurrent(store: Arc<dyn Store>) {
    let prefilled: Vec<(SlotId, u64)> = write_all(&*store, &(1..=16).collect::<Vec<_>>())
        .into_iter()
        .zip(1..)
        .collect();
    let prefilled = Arc::new(prefilled);
    let writer = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            let mut written = HashMap::new();
            for round in 0..4u64 {
                let seeds: Vec<u64> = (0..8).map(|k| 100 + round * 8 + k).collect();
                for (slot, seed) in write_all(&*store, &seeds).into_iter().zip(seeds) {
                    written.insert(slot, seed);
                }
            }
            written
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|t| {
            let store = Arc::clone(&store);
            let prefilled = Arc::clone(&prefilled);
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(store.unit_bytes(), 4096);
                for k in 0..40 {
                    let (slot, seed) = prefilled[(k * 5 + t) % prefilled.len()];
                    check_slot(&*store, slot, seed, &mut buf);
                }
            })
        })
        .collect();
    for r in readers {
        r.join().expect("reader");
    }
    let written = writer.join().expect("writer");
    assert_eq!(written.len(), 32);
    let mut buf = AlignedBuf::new(store.unit_bytes(), 4096);
    for (&slot, &seed) in &written {
        check_slot(&*store, slot, seed, &mut buf);
    }
    assert_eq!(store.used_slots(), 48);
}

/// Paged slots (split chunks): a unit written whole, split by
/// `read_and_split`, its pages rewritten and read one by one and all
/// together; a fresh paged slot; corruption found per page with the page's
/// address; `free` releases a paged slot.
pub(crate) fn check_paged(store: &dyn Store) {
    use super::{PageWrite, StoreError, PAGE_BYTES};
    const GPA: StoreKey = StoreKey::new(0x4000_0000);
    assert!(store.supports_pages(), "{}", store.describe());
    let unit = store.unit_bytes();
    let image = unit_image(7, unit);
    let slot = store
        .write_batch(&[WriteRequest {
            gpa: GPA,
            data: &image,
        }])
        .remove(0)
        .unwrap();
    let mut whole = AlignedBuf::new(unit, 4096);
    store.read_and_split(slot, GPA, &mut whole).unwrap();
    assert_eq!(&whole[..], &image[..]);
    assert!(
        matches!(
            store.read(slot, GPA, &mut whole),
            Err(StoreError::BadSlot { .. })
        ),
        "a paged slot is read by page"
    );
    let new_page = unit_image(99, PAGE_BYTES);
    let results = store.write_pages(
        slot,
        &[PageWrite {
            page: PageIndex::new(3),
            gpa: GPA.offset_by(3 * PAGE_BYTES as u64),
            data: &new_page,
        }],
    );
    assert!(results.into_iter().all(|r| r.is_ok()));
    let mut page = AlignedBuf::new(PAGE_BYTES, 4096);
    // A page is named by its own guest address (a sealed store binds it).
    let page_gpa = |p: usize| GPA.offset_by((p * PAGE_BYTES) as u64);
    store
        .read_page(slot, PageIndex::new(3), page_gpa(3), &mut page)
        .unwrap();
    assert_eq!(&page[..], &new_page[..]);
    store
        .read_page(slot, PageIndex::new(4), page_gpa(4), &mut page)
        .unwrap();
    assert_eq!(&page[..], &image[4 * PAGE_BYTES..5 * PAGE_BYTES]);
    store.read_paged_unit(slot, GPA, &mut whole).unwrap();
    assert_eq!(&whole[3 * PAGE_BYTES..4 * PAGE_BYTES], &new_page[..]);
    assert_eq!(&whole[5 * PAGE_BYTES..], &image[5 * PAGE_BYTES..]);
    // A fresh paged slot: only written pages can be read.
    let fresh = store.allocate_paged(GPA).unwrap();
    assert!(store
        .read_page(fresh, PageIndex::FIRST, page_gpa(0), &mut page)
        .is_err());
    assert!(store
        .write_pages(
            fresh,
            &[PageWrite {
                page: PageIndex::new(511),
                gpa: page_gpa(511),
                data: &new_page,
            }],
        )
        .into_iter()
        .all(|r| r.is_ok()));
    store
        .read_page(fresh, PageIndex::new(511), page_gpa(511), &mut page)
        .unwrap();
    assert_eq!(&page[..], &new_page[..]);
    store.read_paged_unit(fresh, GPA, &mut whole).unwrap();
    assert_eq!(&whole[511 * PAGE_BYTES..], &new_page[..]);
    // A fresh paged slot at the end of a file that grows as pages are
    // written: only its first page exists on the medium.
    let last = store.allocate_paged(GPA).unwrap();
    assert!(store
        .write_pages(
            last,
            &[PageWrite {
                page: PageIndex::FIRST,
                gpa: GPA,
                data: &new_page,
            }],
        )
        .into_iter()
        .all(|r| r.is_ok()));
    store.read_paged_unit(last, GPA, &mut whole).unwrap();
    assert_eq!(&whole[..PAGE_BYTES], &new_page[..]);
    store.free(last);
    // Damage is found, naming a page of the chunk.
    if store.corrupt_slot(fresh).is_ok() {
        match store.read_paged_unit(fresh, GPA, &mut whole) {
            Err(StoreError::Checksum { gpa, .. } | StoreError::Authentication { gpa, .. }) => {
                assert!((GPA..GPA.offset_by(unit as u64)).contains(&gpa), "{gpa:#x}")
            }
            other => panic!("expected a checksum error, got {other:?}"),
        }
    }
    let used = store.used_slots();
    store.free(slot);
    store.free(fresh);
    assert_eq!(store.used_slots(), used - 2);
}

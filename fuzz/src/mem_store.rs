//! A corrupt compressed slot in the `mem:` stores: `MemStore::read` of an
//! image that is not what the codec wrote. `Store::read` promises never to
//! return `Ok` with anything but the written bytes, and corrupt input must
//! be an error, not a panic.

use swap::store::{Codec, MemStore, Store, StoreError, WriteRequest};

use crate::input::Input;
use swap::index::StoreKey;

/// Runs one input: a selector byte (codec, unit size of 4 KiB to 64 KiB), the unit's content
/// as a pattern repeated over the unit (length-prefixed), then the image
/// that replaces the compressed one.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let selector = input.u8();
    let codec = if selector & 1 == 0 {
        Codec::Lz4
    } else {
        Codec::Zstd
    };
    // 4 KiB to 64 KiB units: the decoding is the same as for 2 MiB ones,
    // at a fraction of the time per input.
    let unit_bytes = 4096 << ((selector >> 1) % 5);
    let unit = unit_content(input.short_bytes(), unit_bytes);
    let image = input.rest();

    let store = MemStore::new(codec, unit_bytes, 4, None).expect("a valid store");
    let gpa = StoreKey::new(0x4000_0000);
    let slot = store
        .write_batch(&[WriteRequest { gpa, data: &unit }])
        .pop()
        .expect("one result per request")
        .expect("an empty store takes a unit");
    store
        .replace_image(slot, image)
        .expect("the slot is allocated");
    let mut out = vec![0u8; unit_bytes];
    match store.read(slot, gpa, &mut out) {
        Ok(()) => assert!(out == unit, "{codec}: Ok with other bytes than written"),
        Err(err) => assert!(err.to_string().contains("0x40000000"), "{err}"),
    }
    store.free(slot);
    assert_eq!(store.used_slots(), 0);
    assert_eq!(
        store.stored_bytes(),
        0,
        "{codec}: bytes accounted after free"
    );
    assert!(matches!(
        store.read(slot, gpa, &mut out),
        Err(StoreError::BadSlot { .. })
    ));
}

/// `pattern` repeated over `unit_bytes` (zeros for an empty pattern).
pub fn unit_content(pattern: &[u8], unit_bytes: usize) -> Vec<u8> {
    if pattern.is_empty() {
        return vec![0u8; unit_bytes];
    }
    pattern.iter().copied().cycle().take(unit_bytes).collect()
}

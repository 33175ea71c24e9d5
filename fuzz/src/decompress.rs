//! The size-bounded wrapper around the kernel decompressors
//! (`linux::decompress::decompress_within`) and the LZ4 legacy framing
//! hugevmm does itself (`linux::lz4_legacy`).
//!
//! The decoders are C libraries (zlib via flate2's Rust backend aside,
//! liblzma, libzstd) that get no coverage feedback; what is fuzzed is our
//! side: format detection, the appended size and its bound, output sizing,
//! and the mapping of every decoder failure to an error.

use crate::input::Input;
use vmm::linux::decompress::{decompress_within, PayloadFormat};
use vmm::linux::lz4_legacy;

/// Decompression bounds (guest RAM in the VMM): small enough that a claimed
/// size never costs much to allocate.
const LIMITS: [u64; 4] = [0, 4 << 10, 256 << 10, 4 << 20];

/// Runs one input: a byte choosing the bound, then the payload.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let selector = input.u8();
    let limit = LIMITS[usize::from(selector) % LIMITS.len()];
    let payload = input.rest();
    if selector & 0x80 != 0 {
        // The legacy LZ4 frame on its own, into a buffer of the bound's size.
        let mut out = vec![0u8; limit as usize];
        if let Ok(produced) = lz4_legacy::decode_into(payload, &mut out) {
            assert!(produced <= out.len());
        }
        return;
    }
    match decompress_within(payload, limit) {
        Ok((PayloadFormat::Uncompressed, out)) => assert_eq!(out, payload),
        Ok((format, out)) => {
            let claimed = u32::from_le_bytes(payload[payload.len() - 4..].try_into().unwrap());
            assert_eq!(out.len() as u64, u64::from(claimed), "{format:?}");
            assert!(
                out.len() as u64 <= limit,
                "{format:?}: {} > {limit}",
                out.len()
            );
        }
        Err(err) => {
            // Every error renders (the CLI prints it).
            let _ = err.to_string();
        }
    }
}

//! One pass over a unit's bytes: is it all zero, and a 64-bit content hash.
//!
//! The hash guards clean drops of 2 MiB anonymous units: a restore moves
//! the filled buffer into the guest (UFFDIO_MOVE clears uffd-wp bits, so
//! the unit cannot be installed write-protected) and write-protects it
//! right after; a vCPU that first touches the unit inside that window
//! writes without a fault. Comparing the hash recorded when the copy was
//! written with the hash at eviction catches such writes. It detects
//! accidental change, it is not a cryptographic hash.

/// Result of [`scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentScan {
    /// Every byte is zero.
    pub zero: bool,
    /// Content hash (stable for equal content of equal length).
    pub hash: u64,
}

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;

fn mix(lane: u64, word: u64) -> u64 {
    (lane ^ word).wrapping_mul(K1).rotate_left(31)
}

/// Scans `data` (length a multiple of 32 bytes, as units are).
pub fn scan(data: &[u8]) -> ContentScan {
    let mut lanes = [K2, K2 ^ 1, K2 ^ 2, K2 ^ 3];
    let mut any = 0u64;
    for block in data.chunks_exact(32) {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&block[i * 8..i * 8 + 8]);
            let word = u64::from_ne_bytes(w);
            any |= word;
            *lane = mix(*lane, word);
        }
    }
    let mut hash = data.len() as u64;
    for lane in lanes {
        hash = (hash ^ lane).wrapping_mul(K2).rotate_left(27);
    }
    ContentScan {
        zero: any == 0,
        hash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_zero_and_single_byte_changes() {
        let mut data = vec![0u8; 4096];
        let a = scan(&data);
        assert!(a.zero);
        data[4095] = 1;
        let b = scan(&data);
        assert!(!b.zero);
        assert_ne!(a.hash, b.hash);
        data[4095] = 0;
        data[7] = 1;
        assert_ne!(scan(&data).hash, b.hash);
    }
}

//! The LZ4 legacy frame (`lz4 -l`), which the kernel build uses for
//! CONFIG_KERNEL_LZ4: a magic, then blocks each prefixed by its compressed
//! length, with no end marker and no checksums. lz4_flex decodes the blocks;
//! the framing is done here because lz4_flex's frame reader does not know
//! where a legacy frame ends when more data follows it.

use super::le;

/// The legacy frame's magic number.
pub const MAGIC: u32 = 0x184c_2102;

/// A legacy frame that does not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Lz4LegacyError {
    /// The magic is missing.
    #[error("not an LZ4 legacy frame (no magic 02 21 4c 18)")]
    NoMagic,
    /// A block header or block runs past the end of the input.
    #[error("the LZ4 block at input offset {offset:#x} ({len_bytes} bytes) runs past the end of the data")]
    Truncated {
        /// Where the block starts.
        offset: usize,
        /// Its stated length.
        len_bytes: u64,
    },
    /// A block does not decode, or decodes to more than expected.
    #[error("the LZ4 block at input offset {offset:#x} is corrupt or larger than the stated size: {reason}")]
    BadBlock {
        /// Where the block starts.
        offset: usize,
        /// What lz4_flex reported.
        reason: String,
    },
}

/// Decodes a legacy frame into exactly `out.len()` bytes; returns how many
/// bytes were produced (the caller compares with what it expected).
pub fn decode_into(input: &[u8], out: &mut [u8]) -> Result<usize, Lz4LegacyError> {
    if le::u32_at(input, 0) != Some(MAGIC) {
        return Err(Lz4LegacyError::NoMagic);
    }
    let mut offset = 4;
    let mut produced = 0;
    while offset < input.len() {
        let len_bytes = le::u32_at(input, offset).ok_or(Lz4LegacyError::Truncated {
            offset,
            len_bytes: 4,
        })?;
        // `lz4 -l` output concatenated with another frame repeats the magic.
        if len_bytes == MAGIC {
            offset += 4;
            continue;
        }
        let block_start = offset + 4;
        let block = input
            .get(block_start..block_start + len_bytes as usize)
            .ok_or(Lz4LegacyError::Truncated {
                offset,
                len_bytes: u64::from(len_bytes),
            })?;
        let written =
            lz4_flex::block::decompress_into(block, &mut out[produced..]).map_err(|e| {
                Lz4LegacyError::BadBlock {
                    offset,
                    reason: e.to_string(),
                }
            })?;
        produced += written;
        offset = block_start + len_bytes as usize;
    }
    Ok(produced)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Frames `data` the way `lz4 -l` does, in blocks of `block_bytes`.
    pub(crate) fn encode(data: &[u8], block_bytes: usize) -> Vec<u8> {
        let mut out = MAGIC.to_le_bytes().to_vec();
        for chunk in data.chunks(block_bytes) {
            let block = lz4_flex::block::compress(chunk);
            out.extend_from_slice(&(block.len() as u32).to_le_bytes());
            out.extend_from_slice(&block);
        }
        out
    }

    #[test]
    fn round_trips_several_blocks() {
        let data: Vec<u8> = (0..100_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 9) as u8)
            .collect();
        let frame = encode(&data, 8 << 10);
        let mut out = vec![0u8; data.len()];
        assert_eq!(decode_into(&frame, &mut out), Ok(data.len()));
        assert_eq!(out, data);
    }

    #[test]
    fn reports_truncation_and_overflow() {
        let data = vec![7u8; 50_000];
        let frame = encode(&data, 20_000);
        let mut out = vec![0u8; data.len()];
        let cut = &frame[..frame.len() - 1];
        assert!(matches!(
            decode_into(cut, &mut out),
            Err(Lz4LegacyError::Truncated { .. })
        ));
        let mut small = vec![0u8; 30_000];
        assert!(matches!(
            decode_into(&frame, &mut small),
            Err(Lz4LegacyError::BadBlock { .. })
        ));
        assert_eq!(
            decode_into(b"\x04\x22\x4d\x18", &mut out),
            Err(Lz4LegacyError::NoMagic)
        );
    }
}

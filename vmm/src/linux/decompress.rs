//! Decompressing a bzImage's payload on the host, which yields the kernel's
//! vmlinux ELF. Running the guest's own decompressor is not an option on
//! hosts that emulate guest CPL 0 (it takes minutes there), and a host
//! decoder is faster everywhere.
//!
//! The kernel build appends the decompressed size as a little-endian `u32`
//! to every payload (for gzip it is the stream's own ISIZE field); it sizes
//! the output buffer and checks the result.

use std::io::Read;

use super::lz4_legacy;

/// Largest decompressed kernel accepted: the appended size is only a
/// 32-bit number, and no vmlinux comes near this.
const MAX_KERNEL_BYTES: u32 = 1 << 30;

/// A payload compression format, by its magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// gzip (CONFIG_KERNEL_GZIP).
    Gzip,
    /// bzip2 (CONFIG_KERNEL_BZIP2).
    Bzip2,
    /// LZMA "alone" format (CONFIG_KERNEL_LZMA).
    Lzma,
    /// xz (CONFIG_KERNEL_XZ), usually with the x86 BCJ filter.
    Xz,
    /// LZO (CONFIG_KERNEL_LZO).
    Lzo,
    /// LZ4 legacy frame (CONFIG_KERNEL_LZ4).
    Lz4Legacy,
    /// zstd (CONFIG_KERNEL_ZSTD).
    Zstd,
    /// Not compressed: the payload is the ELF (CONFIG_KERNEL_UNCOMPRESSED).
    Uncompressed,
}

impl PayloadFormat {
    /// Recognizes a payload by its first bytes.
    pub fn detect(payload: &[u8]) -> Option<PayloadFormat> {
        const MAGICS: &[(&[u8], PayloadFormat)] = &[
            (&[0x1f, 0x8b], PayloadFormat::Gzip),
            (b"BZh", PayloadFormat::Bzip2),
            (&[0x5d, 0x00, 0x00], PayloadFormat::Lzma),
            (&[0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00], PayloadFormat::Xz),
            (&[0x89, 0x4c, 0x5a, 0x4f], PayloadFormat::Lzo),
            (&[0x02, 0x21, 0x4c, 0x18], PayloadFormat::Lz4Legacy),
            (&[0x28, 0xb5, 0x2f, 0xfd], PayloadFormat::Zstd),
            (&[0x7f, b'E', b'L', b'F'], PayloadFormat::Uncompressed),
        ];
        MAGICS
            .iter()
            .find(|(magic, _)| payload.starts_with(magic))
            .map(|(_, format)| *format)
    }

    /// The name the kernel's Kconfig uses.
    pub fn name(self) -> &'static str {
        match self {
            PayloadFormat::Gzip => "gzip",
            PayloadFormat::Bzip2 => "bzip2",
            PayloadFormat::Lzma => "lzma",
            PayloadFormat::Xz => "xz",
            PayloadFormat::Lzo => "lzo",
            PayloadFormat::Lz4Legacy => "lz4",
            PayloadFormat::Zstd => "zstd",
            PayloadFormat::Uncompressed => "uncompressed",
        }
    }
}

/// Why a payload cannot be decompressed.
#[derive(Debug, thiserror::Error)]
pub enum DecompressError {
    /// The magic matches no known format.
    #[error(
        "the kernel payload starts with {magic:02x?}, which is no compression format Linux uses"
    )]
    UnknownFormat {
        /// The first bytes.
        magic: Vec<u8>,
    },
    /// A format Linux supports but hugevmm does not decode.
    #[error(
        "the kernel is compressed with {}, which hugevmm cannot decompress; rebuild it with \
         CONFIG_KERNEL_GZIP, _XZ, _LZMA, _LZ4 or _ZSTD, or pass the vmlinux ELF instead",
        format.name()
    )]
    Unsupported {
        /// The format.
        format: PayloadFormat,
    },
    /// The payload is too short to hold the appended size.
    #[error("the {} kernel payload is only {len_bytes} bytes: truncated", format.name())]
    Truncated {
        /// The format.
        format: PayloadFormat,
        /// Payload size.
        len_bytes: usize,
    },
    /// The appended size is implausible.
    #[error("the {} kernel payload claims a decompressed size of {size_bytes} bytes, over the {limit_bytes}-byte limit (1 GiB, and no more than guest RAM, which the kernel must fit in); give a smaller kernel or more --mem", format.name())]
    TooLarge {
        /// The format.
        format: PayloadFormat,
        /// The claimed size.
        size_bytes: u32,
        /// The bound it exceeds.
        limit_bytes: u64,
    },
    /// The decoder failed.
    #[error("the {} kernel payload does not decompress: {reason}", format.name())]
    Corrupt {
        /// The format.
        format: PayloadFormat,
        /// What the decoder said.
        reason: String,
    },
    /// The result differs from the appended size.
    #[error(
        "the {} kernel payload decompressed to {actual_bytes} bytes, but the image says {expected_bytes}: \
         the image is corrupt",
        format.name()
    )]
    SizeMismatch {
        /// The format.
        format: PayloadFormat,
        /// The appended size.
        expected_bytes: u32,
        /// What came out.
        actual_bytes: usize,
    },
}

/// Decompresses a bzImage payload into the vmlinux ELF.
#[cfg(test)]
pub fn decompress(payload: &[u8]) -> Result<(PayloadFormat, Vec<u8>), DecompressError> {
    decompress_within(payload, u64::from(MAX_KERNEL_BYTES))
}

/// Decompresses a bzImage payload into the vmlinux ELF, refusing one that
/// would be larger than `max_bytes` (and than 1 GiB) before allocating
/// anything for it: the output is sized by the size the image claims, and
/// decoding stops one byte past it, so a decompression bomb costs nothing.
pub fn decompress_within(
    payload: &[u8],
    max_bytes: u64,
) -> Result<(PayloadFormat, Vec<u8>), DecompressError> {
    let format = PayloadFormat::detect(payload).ok_or_else(|| DecompressError::UnknownFormat {
        magic: payload[..payload.len().min(6)].to_vec(),
    })?;
    if format == PayloadFormat::Uncompressed {
        return Ok((format, payload.to_vec()));
    }
    if payload.len() < 8 {
        return Err(DecompressError::Truncated {
            format,
            len_bytes: payload.len(),
        });
    }
    let (stream, size_field) = payload.split_at(payload.len() - 4);
    let expected_bytes = u32::from_le_bytes(size_field.try_into().expect("split at len - 4"));
    let limit_bytes = max_bytes.min(u64::from(MAX_KERNEL_BYTES));
    if u64::from(expected_bytes) > limit_bytes {
        return Err(DecompressError::TooLarge {
            format,
            size_bytes: expected_bytes,
            limit_bytes,
        });
    }
    let corrupt = |reason: String| DecompressError::Corrupt { format, reason };
    let capacity = expected_bytes as usize;
    let out = match format {
        // ISIZE is part of the gzip stream, so gzip gets it back.
        PayloadFormat::Gzip => {
            read_all(flate2::read::GzDecoder::new(payload), capacity).map_err(corrupt)?
        }
        PayloadFormat::Xz => {
            let stream_decoder = xz2::stream::Stream::new_stream_decoder(u64::MAX, 0)
                .map_err(|e| corrupt(format!("cannot start the xz decoder: {e}")))?;
            read_all(
                xz2::read::XzDecoder::new_stream(stream, stream_decoder),
                capacity,
            )
            .map_err(corrupt)?
        }
        PayloadFormat::Lzma => {
            let stream_decoder = xz2::stream::Stream::new_lzma_decoder(u64::MAX)
                .map_err(|e| corrupt(format!("cannot start the lzma decoder: {e}")))?;
            read_all(
                xz2::read::XzDecoder::new_stream(stream, stream_decoder),
                capacity,
            )
            .map_err(corrupt)?
        }
        // The one-shot API, because the kernel's `zstd -22 --ultra` frames
        // can have windows beyond what the streaming decoder allows by
        // default, and the output size is known anyway.
        PayloadFormat::Zstd => {
            zstd::bulk::decompress(stream, capacity).map_err(|e| corrupt(e.to_string()))?
        }
        PayloadFormat::Lz4Legacy => {
            let mut out = vec![0u8; capacity];
            let produced =
                lz4_legacy::decode_into(stream, &mut out).map_err(|e| corrupt(e.to_string()))?;
            out.truncate(produced);
            out
        }
        PayloadFormat::Bzip2 | PayloadFormat::Lzo => {
            return Err(DecompressError::Unsupported { format })
        }
        PayloadFormat::Uncompressed => unreachable!("returned above"),
    };
    if out.len() != capacity {
        return Err(DecompressError::SizeMismatch {
            format,
            expected_bytes,
            actual_bytes: out.len(),
        });
    }
    Ok((format, out))
}

/// Reads a decoder to its end, at most one byte more than expected (which
/// is enough to notice a size mismatch without unbounded output).
fn read_all(reader: impl Read, expected_bytes: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(expected_bytes);
    reader
        .take(expected_bytes as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn sample() -> Vec<u8> {
        let mut data = b"\x7fELF".to_vec();
        data.extend((0..300_000u32).map(|i| ((i * 7) % 253) as u8 ^ (i >> 11) as u8));
        data
    }

    fn with_size(mut stream: Vec<u8>, len: usize) -> Vec<u8> {
        stream.extend_from_slice(&(len as u32).to_le_bytes());
        stream
    }

    fn roundtrip(payload: &[u8], expected_format: PayloadFormat, data: &[u8]) {
        let (format, out) = decompress(payload).unwrap();
        assert_eq!(format, expected_format);
        assert!(out == data, "{} output differs", format.name());
    }

    #[test]
    fn gzip() {
        let data = sample();
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(&data).unwrap();
        roundtrip(&encoder.finish().unwrap(), PayloadFormat::Gzip, &data);
    }

    #[test]
    fn xz_with_the_x86_filter_as_the_kernel_builds_it() {
        let data = sample();
        let mut filters = xz2::stream::Filters::new();
        filters.x86();
        filters.lzma2(&xz2::stream::LzmaOptions::new_preset(6).unwrap());
        let stream =
            xz2::stream::Stream::new_stream_encoder(&filters, xz2::stream::Check::Crc32).unwrap();
        let mut encoder = xz2::write::XzEncoder::new_stream(Vec::new(), stream);
        encoder.write_all(&data).unwrap();
        roundtrip(
            &with_size(encoder.finish().unwrap(), data.len()),
            PayloadFormat::Xz,
            &data,
        );
    }

    #[test]
    fn lzma_alone() {
        let data = sample();
        let options = xz2::stream::LzmaOptions::new_preset(6).unwrap();
        let stream = xz2::stream::Stream::new_lzma_encoder(&options).unwrap();
        let mut encoder = xz2::write::XzEncoder::new_stream(Vec::new(), stream);
        encoder.write_all(&data).unwrap();
        roundtrip(
            &with_size(encoder.finish().unwrap(), data.len()),
            PayloadFormat::Lzma,
            &data,
        );
    }

    #[test]
    fn zstd_frame() {
        let data = sample();
        let stream = zstd::bulk::compress(&data, 19).unwrap();
        roundtrip(&with_size(stream, data.len()), PayloadFormat::Zstd, &data);
    }

    #[test]
    fn lz4_legacy_frame() {
        let data = sample();
        let stream = lz4_legacy::tests::encode(&data, 64 << 10);
        roundtrip(
            &with_size(stream, data.len()),
            PayloadFormat::Lz4Legacy,
            &data,
        );
    }

    #[test]
    fn a_decompression_bomb_is_refused_by_its_claimed_size() {
        // 64 MiB of zeros squeeze into a few KiB; guest RAM of 16 MiB
        // cannot hold the result, so it is refused before decoding.
        let zeros = vec![0u8; 64 << 20];
        let stream = zstd::bulk::compress(&zeros, 3).unwrap();
        assert!(stream.len() < 64 << 10);
        let bomb = with_size(stream.clone(), zeros.len());
        let err = decompress_within(&bomb, 16 << 20).unwrap_err();
        assert!(
            matches!(err, DecompressError::TooLarge { limit_bytes, .. } if limit_bytes == 16 << 20),
            "{err}"
        );
        assert!(err.to_string().contains("guest RAM"), "{err}");
        // A size that lies low stops the decoder one byte past it.
        let liar = with_size(stream, 1 << 20);
        assert!(decompress_within(&liar, 16 << 20).is_err());
    }

    #[test]
    fn uncompressed_elf_passes_through() {
        let data = sample();
        roundtrip(&data, PayloadFormat::Uncompressed, &data);
    }

    #[test]
    fn wrong_size_is_an_error() {
        let data = sample();
        let stream = zstd::bulk::compress(&data, 3).unwrap();
        let err = decompress(&with_size(stream.clone(), data.len() + 1)).unwrap_err();
        assert!(
            matches!(
                err,
                DecompressError::SizeMismatch { .. } | DecompressError::Corrupt { .. }
            ),
            "{err}"
        );
        let err = decompress(&with_size(
            lz4_legacy::tests::encode(&data, 4096),
            data.len() - 1,
        ))
        .unwrap_err();
        assert!(err.to_string().contains("lz4"), "{err}");
    }

    #[test]
    fn unsupported_and_unknown_formats_are_named() {
        let err = decompress(b"BZh91AY&SY\0\0\0\0").unwrap_err();
        assert!(err.to_string().contains("compressed with bzip2"), "{err}");
        let err = decompress(b"\x89LZO\0\r\n\x1a\n\0\0").unwrap_err();
        assert!(err.to_string().contains("compressed with lzo"), "{err}");
        let err = decompress(b"\x00\x01\x02\x03\x04\x05\x06\x07").unwrap_err();
        assert!(
            err.to_string().contains("[00, 01, 02, 03, 04, 05]"),
            "{err}"
        );
    }
}

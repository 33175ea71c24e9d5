//! Compression of units for the in-memory store.

use std::cell::RefCell;
use std::io;

/// zstd level used by [`Codec::Zstd`]. Level 1 rather than 3: on a
/// guest-like 2 MiB chunk (half zero pages, a quarter text, a quarter
/// random) level 3 compressed 10-20% slower (0.83-0.91 vs 1.00 GiB/s on the
/// development machine) for a ratio only 1.5% better (3.36 vs 3.31), and
/// compression sits on the eviction path (`examples/store_bench.rs`).
pub const ZSTD_LEVEL: i32 = 1;

/// A compression algorithm for [`super::mem::MemStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// LZ4 block format: the fastest, lower ratio.
    Lz4,
    /// zstd at [`ZSTD_LEVEL`]: a better ratio at a higher CPU cost.
    Zstd,
}

thread_local! {
    /// Per-thread output space for compression, so a unit costs no
    /// unit-sized allocation beyond the exact-size result.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Per-thread zstd contexts: creating one costs more than compressing
    /// a small unit, and they cannot be shared between threads.
    static ZSTD_CCTX: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static ZSTD_DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

impl Codec {
    /// The name used in `--swap-store` (`lz4`, `zstd`).
    pub fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// Compresses `src` into an exactly sized buffer.
    pub fn compress(self, src: &[u8]) -> io::Result<Box<[u8]>> {
        SCRATCH.with_borrow_mut(|scratch| {
            let len = match self {
                Codec::Lz4 => {
                    scratch.resize(lz4_flex::block::get_maximum_output_size(src.len()), 0);
                    lz4_flex::block::compress_into(src, scratch).map_err(io::Error::other)?
                }
                Codec::Zstd => {
                    scratch.clear();
                    scratch.reserve(zstd::zstd_safe::compress_bound(src.len()));
                    ZSTD_CCTX.with_borrow_mut(|cctx| {
                        let cctx = match cctx {
                            Some(c) => c,
                            None => cctx.insert(zstd::bulk::Compressor::new(ZSTD_LEVEL)?),
                        };
                        cctx.compress_to_buffer(src, scratch)
                    })?
                }
            };
            Ok(Box::from(&scratch[..len]))
        })
    }

    /// Decompresses `src` into `dst`, returning the decompressed length.
    /// Corrupt input is an `InvalidData` error, never a panic.
    pub fn decompress_into(self, src: &[u8], dst: &mut [u8]) -> io::Result<usize> {
        match self {
            Codec::Lz4 => lz4_flex::block::decompress_into(src, dst)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Codec::Zstd => ZSTD_DCTX.with_borrow_mut(|dctx| {
                let dctx = match dctx {
                    Some(d) => d,
                    None => dctx.insert(zstd::bulk::Decompressor::new()?),
                };
                dctx.decompress_to_buffer(src, dst)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            }),
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_support::unit_image;

    #[test]
    fn both_codecs_round_trip_and_shrink_guest_like_data() {
        let src = unit_image(11, 2 << 20);
        for codec in [Codec::Lz4, Codec::Zstd] {
            let packed = codec.compress(&src).unwrap();
            assert!(
                packed.len() < src.len() * 3 / 4,
                "{codec}: {} bytes",
                packed.len()
            );
            let mut out = vec![0u8; src.len()];
            assert_eq!(codec.decompress_into(&packed, &mut out).unwrap(), src.len());
            assert!(out[..] == src[..]);
        }
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        let src = unit_image(12, 64 << 10);
        for codec in [Codec::Lz4, Codec::Zstd] {
            let mut packed = codec.compress(&src).unwrap().into_vec();
            packed.truncate(packed.len() / 2);
            let mut out = vec![0u8; src.len()];
            let res = codec.decompress_into(&packed, &mut out);
            assert!(res.is_err() || res.unwrap() != src.len(), "{codec}");
        }
    }
}

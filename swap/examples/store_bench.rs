//! Prints store throughput: batched 2 MiB writes and single-chunk reads for
//! each store, and codec speeds on a guest-like chunk. Figures only, no
//! verdicts: run with `cargo run --release -p swap --example store_bench
//! [CHUNKS]` (default 512 chunks = 1 GiB per store).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use blockio::{AlignedBuf, BlockOptions, Engine};
use swap::index::StoreKey;
use swap::store::{Codec, FileStore, MemStore, SharedStore, SlotId, WriteRequest};

const CHUNK_BYTES: usize = guestmem::CHUNK_BYTES as usize;
const BATCH: usize = 16;
const DISTINCT_IMAGES: usize = 16;
const GIB: f64 = (1u64 << 30) as f64;

/// Half zero pages, a quarter text-like, a quarter random: roughly what an
/// idle Linux guest's memory looks like to a compressor.
fn guest_like_chunk(seed: u64) -> AlignedBuf {
    const WORDS: [&str; 12] = [
        "the ", "kernel ", "page ", "swap ", "chunk ", "guest ", "memory ", "\n", "struct ",
        "0x0000 ", "return ", "{ ",
    ];
    let mut buf = AlignedBuf::new(CHUNK_BYTES, 4096);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (i, page) in buf.chunks_mut(4096).enumerate() {
        match i % 4 {
            0 | 2 => {}
            1 => {
                let mut at = 0;
                while at < page.len() {
                    let w = WORDS[(next() % WORDS.len() as u64) as usize].as_bytes();
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
    }
    buf
}

/// Writes and reads back `chunks` chunks, `passes` times: a file store's
/// first pass grows the file, later ones overwrite allocated blocks.
fn bench_store(
    name: &str,
    store: SharedStore,
    images: &[AlignedBuf],
    chunks: usize,
    passes: usize,
) {
    for pass in 1..=passes {
        let label = if passes > 1 {
            format!("{name} pass {pass}")
        } else {
            name.to_string()
        };
        bench_pass(&label, &store, images, chunks);
    }
}

fn bench_pass(name: &str, store: &SharedStore, images: &[AlignedBuf], chunks: usize) {
    let start = Instant::now();
    let mut slots: Vec<SlotId> = Vec::with_capacity(chunks);
    for batch_start in (0..chunks).step_by(BATCH) {
        let reqs: Vec<WriteRequest<'_>> = (batch_start..(batch_start + BATCH).min(chunks))
            .map(|i| WriteRequest {
                gpa: StoreKey::new((i * CHUNK_BYTES) as u64),
                data: &images[i % images.len()],
            })
            .collect();
        for r in store.write_batch(&reqs) {
            slots.push(r.expect("write"));
        }
    }
    let write_s = start.elapsed().as_secs_f64();
    let mut buf = AlignedBuf::new(CHUNK_BYTES, 4096);
    let start = Instant::now();
    for (i, &slot) in slots.iter().enumerate() {
        store
            .read(slot, StoreKey::new((i * CHUNK_BYTES) as u64), &mut buf)
            .expect("read");
    }
    let read_s = start.elapsed().as_secs_f64();
    let total = (chunks * CHUNK_BYTES) as f64;
    println!(
        "{name:<28} write {:6.2} GiB/s (batches of {BATCH})   read {:6.2} GiB/s (one chunk at a time)   stored {:7.1} MiB for {:.0} MiB",
        total / write_s / GIB,
        total / read_s / GIB,
        store.stored_bytes() as f64 / (1 << 20) as f64,
        total / (1 << 20) as f64,
    );
    for slot in slots {
        store.free(slot);
    }
}

fn bench_codec(
    name: &str,
    chunk: &[u8],
    compress: impl Fn(&[u8]) -> Vec<u8>,
    decompress: impl Fn(&[u8], &mut [u8]),
) {
    let rounds = 100;
    let packed = compress(chunk);
    let start = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(compress(std::hint::black_box(chunk)));
    }
    let c_s = start.elapsed().as_secs_f64();
    let mut out = vec![0u8; chunk.len()];
    let start = Instant::now();
    for _ in 0..rounds {
        decompress(std::hint::black_box(&packed), &mut out);
    }
    let d_s = start.elapsed().as_secs_f64();
    assert!(out[..] == chunk[..], "{name} round trip");
    let total = (rounds * chunk.len()) as f64;
    println!(
        "{name:<28} compress {:6.2} GiB/s   decompress {:6.2} GiB/s   ratio {:5.2} ({} -> {} bytes)",
        total / c_s / GIB,
        total / d_s / GIB,
        chunk.len() as f64 / packed.len() as f64,
        chunk.len(),
        packed.len(),
    );
}

fn main() {
    let chunks: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("CHUNKS must be a number"))
        .unwrap_or(512);
    let images: Vec<AlignedBuf> = (0..DISTINCT_IMAGES as u64)
        .map(|s| guest_like_chunk(s + 1))
        .collect();
    let capacity = (chunks * CHUNK_BYTES) as u64;
    let dir = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);

    println!("{chunks} chunks of 2 MiB per store, {DISTINCT_IMAGES} distinct guest-like images");
    let uring = FileStore::temporary(&dir, CHUNK_BYTES, capacity).expect("file store");
    println!("file store: {}", swap::store::Store::describe(&uring));
    bench_store("file (io_uring)", Arc::new(uring), &images, chunks, 2);
    let sync_opts = BlockOptions {
        engine: Engine::Sync,
        ..BlockOptions::default()
    };
    let sync =
        FileStore::temporary_with(&dir, CHUNK_BYTES, capacity, &sync_opts).expect("file store");
    bench_store("file (pread/pwrite)", Arc::new(sync), &images, chunks, 2);
    let slots = chunks as u64;
    bench_store(
        "mem:lz4",
        Arc::new(MemStore::new(Codec::Lz4, CHUNK_BYTES, slots, None).unwrap()),
        &images,
        chunks,
        1,
    );
    bench_store(
        "mem:zstd",
        Arc::new(MemStore::new(Codec::Zstd, CHUNK_BYTES, slots, None).unwrap()),
        &images,
        chunks,
        1,
    );

    println!(
        "codecs on one guest-like 2 MiB chunk (half zero pages, quarter text, quarter random):"
    );
    let chunk = &images[0][..];
    bench_codec(
        "lz4",
        chunk,
        |c| Codec::Lz4.compress(c).unwrap().into_vec(),
        |p, out| {
            Codec::Lz4.decompress_into(p, out).unwrap();
        },
    );
    for level in [1, 3] {
        let cctx = std::cell::RefCell::new(zstd::bulk::Compressor::new(level).unwrap());
        let dctx = std::cell::RefCell::new(zstd::bulk::Decompressor::new().unwrap());
        bench_codec(
            &format!("zstd level {level}"),
            chunk,
            |c| cctx.borrow_mut().compress(c).unwrap(),
            |p, out| {
                dctx.borrow_mut().decompress_to_buffer(p, out).unwrap();
            },
        );
    }
}

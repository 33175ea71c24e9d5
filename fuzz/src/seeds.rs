//! The seed corpus: small valid inputs for each target, from which
//! libFuzzer mutates towards the error paths. `hugevmm-fuzz-seeds` writes
//! them to `fuzz/corpus/TARGET/`; `tests/seeds.rs` checks that the
//! committed files are these and that they reach what they are meant to.

use std::io::Write as _;

use swap::engine::SwapUnit;
use swap::store::{Codec, Faults};

use crate::engine::{self, Op, Setup};
use crate::mem_store::unit_content;
use crate::virtio::Script;
use vmm::linux::setup_header::{field, HDRS_MAGIC};

/// Seeds of `target`, as (name, bytes).
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let named = |items: Vec<(&str, Vec<u8>)>| {
        items
            .into_iter()
            .map(|(n, b)| (n.to_string(), b))
            .collect::<Vec<_>>()
    };
    match target {
        "payload_elf" => ["hello", "selftest"]
            .iter()
            .map(|name| {
                let elf = payloads::find(name).expect("built-in payload").elf;
                (name.to_string(), [&[1u8][..], elf].concat())
            })
            .collect(),
        "kernel_image" => {
            let mut out = vec![(
                "vmlinux".to_string(),
                kernel_input(&tiny_vmlinux()),
            )];
            for (name, payload) in compressed_payloads() {
                out.push((format!("bzimage-{name}"), kernel_input(&bzimage(&payload))));
            }
            out
        }
        "decompress" => compressed_payloads()
            .into_iter()
            .map(|(name, payload)| (name.to_string(), [&[2u8][..], &payload].concat()))
            .collect(),
        "nbd_handshake" => {
            use crate::nbd_handshake::{option_reply, server_bytes};
            let error = option_reply((1 << 31) | 6, b"no such export");
            named(vec![
                ("good", server_bytes(8 << 30, Some([512, 4096, 32 << 20]), &[])),
                ("no-block-sizes", server_bytes(1 << 30, None, &[])),
                (
                    "name-and-description",
                    server_bytes(
                        1 << 30,
                        None,
                        &[option_reply(3, b"\x00\x01swap"), option_reply(3, b"\x00\x02a disk")],
                    ),
                ),
                ("unknown-export", {
                    let mut b = server_bytes(0, None, &[]);
                    // Greeting and flags (18 bytes), then the refusal.
                    b.truncate(18);
                    b.extend(error);
                    b
                }),
            ])
        }
        "store_spec" => named(
            [
                "default",
                "default,reserve",
                "file:/var/tmp/swap.img,size=8G,overwrite,reserve",
                "mem:lz4",
                "mem:zstd,size=512M",
                "faulty:read-error-after=3,corrupt-after=1,write-error-after=2,full-after=4,inner=mem:zstd,size=1G",
                "nbd://[::1]:10900/swap%20a,size=8G,timeout=120",
                "nbd+unix:///swap?socket=/run/nbd.sock,timeout=5",
                "vhost-user-blk:/run/vhost.sock,queues=2,size=4G,timeout=10",
            ]
            .iter()
            .enumerate()
            .map(|(i, s)| (["default", "reserve", "file", "lz4", "zstd", "faulty", "nbd", "nbd-unix", "vhost-user"][i], s.as_bytes().to_vec()))
            .collect(),
        ),
        "disk_spec" => named(vec![
            ("path", b"/img/a.raw".to_vec()),
            ("readonly", b"/img/a,b.raw,readonly".to_vec()),
            ("nbd", b"nbd://10.0.0.1:10809/disk,timeout=9,readonly".to_vec()),
            ("nbd-unix", b"nbd+unix:///?socket=/run/nbd.sock".to_vec()),
            ("vhost-user", b"vhost-user-blk:/run/vhost.sock,timeout=9,readonly".to_vec()),
        ]),
        "mem_store" => {
            let mut out = Vec::new();
            for (i, codec) in [Codec::Lz4, Codec::Zstd].into_iter().enumerate() {
                let pattern = b"hugevmm chunk \x00\x01\x02\x03";
                let unit = unit_content(pattern, 4096);
                let image = codec.compress(&unit).expect("compress");
                let mut input = vec![i as u8, pattern.len() as u8];
                input.extend_from_slice(pattern);
                input.extend_from_slice(&image);
                out.push((codec.name().to_string(), input));
            }
            out
        }
        "virtio_mmio" => named(vec![
            ("balloon", [&[0u8][..], &driver_setup_script()].concat()),
            ("blk", [&[1u8][..], &driver_setup_script()].concat()),
        ]),
        "virtio_blk" => blk_seeds(),
        "virtio_balloon" => balloon_seeds(),
        "engine" => engine_seeds(),
        "api_request" => api_request_seeds(),
        _ => Vec::new(),
    }
}

/// Requests as curl sends them to the API (whole, and a keep-alive pair
/// arriving in 7-byte pieces), for the api_request target.
fn api_request_seeds() -> Vec<(String, Vec<u8>)> {
    let get =
        b"GET /stats HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"
            .to_vec();
    let body = br#"{"mem_limit_bytes": 268435456}"#;
    let put = [
        format!(
            "PUT /mem-limit HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
        body,
    ]
    .concat();
    let close = b"PUT /actions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 20\r\n\r\n{\"action\": \"quit\"}\n\n".to_vec();
    vec![
        ("get".to_string(), [&[0u8][..], &get].concat()),
        ("put".to_string(), [&[0u8][..], &put].concat()),
        ("pipelined".to_string(), [&[7u8][..], &get, &put].concat()),
        ("close".to_string(), [&[1u8][..], &close].concat()),
    ]
}

/// Register-level setup as a driver does it, for the virtio_mmio target.
fn driver_setup_script() -> Vec<u8> {
    let mut s = Script::new();
    s.read32(0x000).read32(0x004).read32(0x008);
    s.write32(0x070, 0).write32(0x070, 1).write32(0x070, 3);
    s.write32(0x014, 0)
        .read32(0x010)
        .write32(0x014, 1)
        .read32(0x010);
    s.write32(0x024, 1).write32(0x020, 1).write32(0x070, 0xb);
    s.write32(0x030, 0).read32(0x034).write32(0x038, 64);
    s.write32(0x080, 0x20_0000)
        .write32(0x090, 0x21_0000)
        .write32(0x0a0, 0x21_8000);
    s.write32(0x044, 1).write32(0x070, 0xf).read32(0x0fc);
    s.notify(0).ack_interrupt();
    s.finish()
}

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

fn blk_header(kind: u32, sector: u64) -> Vec<u8> {
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

/// One request: header at 0x1000, data at 0x2000 (device-writable for
/// reads), status at 0x3000.
fn blk_request(kind: u32, sector: u64, data_len: u32, device_writes_data: bool) -> Vec<u8> {
    let mut s = Script::new();
    s.raw(&[0]).setup(0, &[0]);
    s.memory(0x1000, &blk_header(kind, sector));
    s.desc(0, 0, 0x1000, 16, NEXT, 1);
    if data_len > 0 {
        let flags = NEXT | if device_writes_data { WRITE } else { 0 };
        s.desc(0, 1, 0x2000, data_len, flags, 2);
        s.desc(0, 2, 0x3000, 1, WRITE, 0);
    } else {
        s.desc(0, 1, 0x3000, 1, WRITE, 0);
    }
    s.publish(0, 0).notify(0).ack_interrupt();
    s.finish()
}

fn blk_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("read".to_string(), blk_request(0, 1, 1024, true)),
        ("write".to_string(), blk_request(1, 2, 512, false)),
        ("flush".to_string(), blk_request(4, 0, 0, false)),
        ("get-id".to_string(), blk_request(8, 0, 20, true)),
    ];
    // Discard and write-zeroes: one segment (sector, sectors, flags).
    for (name, kind) in [("discard", 11u32), ("write-zeroes", 13)] {
        let mut s = Script::new();
        s.raw(&[0]).setup(0, &[0]);
        let mut segment = 8u64.to_le_bytes().to_vec();
        segment.extend_from_slice(&8u32.to_le_bytes());
        segment.extend_from_slice(&0u32.to_le_bytes());
        s.memory(0x1000, &blk_header(kind, 0))
            .memory(0x2000, &segment);
        s.desc(0, 0, 0x1000, 16, NEXT, 1)
            .desc(0, 1, 0x2000, 16, NEXT, 2)
            .desc(0, 2, 0x3000, 1, WRITE, 0);
        s.publish(0, 0).notify(0);
        out.push((name.to_string(), s.finish()));
    }
    // A read through an indirect table at 0x4000.
    let mut s = Script::new();
    s.raw(&[0]).setup(0, &[0]);
    s.memory(0x1000, &blk_header(0, 3));
    let mut table = Vec::new();
    for (addr, len, flags, next) in [
        (0x1000u64, 16u32, NEXT, 1u16),
        (0x2000, 512, NEXT | WRITE, 2),
        (0x3000, 1, WRITE, 0),
    ] {
        table.extend_from_slice(&addr.to_le_bytes());
        table.extend_from_slice(&len.to_le_bytes());
        table.extend_from_slice(&flags.to_le_bytes());
        table.extend_from_slice(&next.to_le_bytes());
    }
    s.memory(0x4000, &table);
    s.desc(0, 0, 0x4000, 48, INDIRECT, 0);
    s.publish(0, 0).notify(0);
    out.push(("indirect".to_string(), s.finish()));
    out
}

/// Writes `bytes` at `addr` in pieces a memory operation takes.
fn memory_pieces(s: &mut Script, addr: u64, bytes: &[u8]) {
    for (i, piece) in bytes.chunks(255).enumerate() {
        s.memory(addr + 255 * i as u64, piece);
    }
}

fn balloon_seeds() -> Vec<(String, Vec<u8>)> {
    // Every feature accepted: inflate 0, deflate 1, stats 2, reporting 3.
    let start = |s: &mut Script| {
        s.setup(0, &[0, 0, 0, 0]);
    };
    // The first chunk of RAM region 1 (8 MiB), as 512 PFNs.
    let pfns: Vec<u8> = (0..512u32)
        .flat_map(|i| ((8 << 20 >> 12) + i).to_le_bytes())
        .collect();
    let mut out = Vec::new();
    let mut s = Script::new();
    start(&mut s);
    memory_pieces(&mut s, 0x1_0000, &pfns);
    s.desc(0, 0, 0x1_0000, pfns.len() as u32, 0, 0)
        .publish(0, 0)
        .notify(0);
    s.host(0, 1024);
    out.push(("inflate".to_string(), s.finish()));

    let mut s = Script::new();
    start(&mut s);
    memory_pieces(&mut s, 0x1_0000, &pfns[..64]);
    s.desc(0, 0, 0x1_0000, 64, 0, 0).publish(0, 0).notify(0);
    s.desc(1, 0, 0x1_0000, 64, 0, 0).publish(1, 0).notify(1);
    out.push(("deflate".to_string(), s.finish()));

    let mut s = Script::new();
    start(&mut s);
    let mut stats = Vec::new();
    for (tag, value) in [(4u16, 1u64 << 30), (5, 2 << 30), (8, 1 << 29)] {
        stats.extend_from_slice(&tag.to_le_bytes());
        stats.extend_from_slice(&value.to_le_bytes());
    }
    s.memory(0x2_0000, &stats);
    s.desc(2, 0, 0x2_0000, stats.len() as u32, 0, 0)
        .publish(2, 0)
        .notify(2);
    s.host(1, 0);
    out.push(("stats".to_string(), s.finish()));

    let mut s = Script::new();
    start(&mut s);
    // One free 2 MiB range, device-writable, in region 1.
    s.raw(&[crate::virtio::Op::Desc as u8, 3])
        .raw(&0u16.to_le_bytes())
        .raw(&[1])
        .raw(&0u64.to_le_bytes())
        .raw(&(2u32 << 20).to_le_bytes())
        .raw(&WRITE.to_le_bytes())
        .raw(&0u16.to_le_bytes());
    s.publish(3, 0).notify(3);
    out.push(("report".to_string(), s.finish()));
    out
}

fn engine_seeds() -> Vec<(String, Vec<u8>)> {
    let setup = |unit, limit_units, faults| Setup {
        unit,
        fault_threads: 2,
        track_clean: true,
        limit_units,
        faults,
        retry: false,
        sealed: false,
    };
    let write = |thread, page, value| Op::Write {
        thread,
        page,
        value,
    };
    let read = |thread, page| Op::Read { thread, page };
    let swap_2m = setup(SwapUnit::Huge2M, Some(2), Faults::default());
    let mixed = vec![
        write(0, 0, 1),
        write(1, 600, 2),
        write(2, 1100, 3),
        read(0, 600),
        Op::EvictRange { unit: 1, count: 2 },
        read(1, 1100),
        write(2, 0, 4),
        Op::EvictAll,
        read(0, 0),
        Op::Discard {
            page: 512,
            pages: 1024,
        },
        read(1, 600),
        Op::SetLimit { units: None },
        write(0, 2000, 5),
        Op::CheckAll,
    ];
    let small = setup(SwapUnit::Small4K, Some(4), Faults::default());
    let pages: Vec<Op> = (0..12)
        .map(|p| write(p as usize % 3, p * 3, p + 1))
        .chain([Op::EvictAll, Op::Sync])
        .chain((0..12).map(|p| read((p as usize + 1) % 3, p * 3)))
        .collect();
    let failing = setup(
        SwapUnit::Huge2M,
        None,
        Faults {
            write_error_after: Some(1),
            ..Faults::default()
        },
    );
    let failing_ops = vec![
        write(0, 0, 7),
        write(1, 512, 8),
        Op::EvictAll,
        read(2, 0),
        read(2, 512),
    ];
    // `auto`, the default unit: one page in each of the 12 chunks,
    // touched round after round over an 8-chunk limit, so that each chunk
    // faults back soon after its eviction, off any stream (more chunks
    // than stream slots), and splits; its pages then move alone. Then
    // pages written densely in two chunks again, for the collapse.
    let auto = setup(SwapUnit::Auto, Some(8), Faults::default());
    let hot = |c: u64| 512 * c + 100 + (c * 37) % 300;
    let mut refaults: Vec<Op> = (0..12)
        .map(|c| write(c as usize % 3, hot(c), c + 1))
        .collect();
    for _ in 0..6 {
        refaults.push(Op::Sync);
        refaults.extend((0..12).map(|c| read(c as usize % 3, hot(c))));
    }
    refaults.extend((0..20).map(|p| write(p as usize % 3, 512 * (p % 2) + 400 + p, 50 + p)));
    refaults.push(Op::CheckAll);
    // The retry layer around a store that fails now and then: every 3rd
    // operation an EIO, every 2nd whole-unit read a checksum failure, and
    // delays; nothing may reach the guest or end the run.
    let retrying = Setup {
        retry: true,
        ..setup(
            SwapUnit::Huge2M,
            Some(2),
            Faults {
                transient_eio_every: Some(3),
                transient_corrupt_every: Some(2),
                delay_us: Some(50),
                ..Faults::default()
            },
        )
    };
    let churn: Vec<Op> = (0..6)
        .map(|c| write(c as usize % 3, 512 * c, c + 1))
        .chain([Op::Sync, Op::EvictAll])
        .chain((0..6).map(|c| read((c as usize + 1) % 3, 512 * c)))
        .chain([Op::Sync, Op::EvictAll, Op::CheckAll])
        .collect();
    // A sealed store (`--swap-encrypt`) under `auto`, retried, then a
    // slot damaged for good: authentication fails twice, the VM ends
    // naming the chunk.
    let sealed = Setup {
        retry: true,
        sealed: true,
        ..setup(
            SwapUnit::Auto,
            None,
            Faults {
                corrupt_after: Some(2),
                transient_eio_every: Some(4),
                ..Faults::default()
            },
        )
    };
    let sealed_ops: Vec<Op> = (0..4)
        .map(|c| write(c as usize % 3, 512 * c, c + 7))
        .chain([Op::Sync, Op::EvictAll])
        .chain((0..4).map(|c| read(2, 512 * c)))
        .collect();
    vec![
        ("mixed-2m".to_string(), engine::encode(&swap_2m, &mixed)),
        (
            "auto-refaults".to_string(),
            engine::encode(&auto, &refaults),
        ),
        (
            "retry-transient".to_string(),
            engine::encode(&retrying, &churn),
        ),
        (
            "sealed-auto".to_string(),
            engine::encode(&sealed, &sealed_ops),
        ),
        ("pages-4k".to_string(), engine::encode(&small, &pages)),
        (
            "write-error".to_string(),
            engine::encode(&failing, &failing_ops),
        ),
    ]
}

/// A vmlinux ELF: one PT_LOAD segment at 16 MiB (linked in the upper
/// half, as x86-64 Linux is), entry at its start.
pub fn tiny_vmlinux() -> Vec<u8> {
    let vaddr: u64 = 0xffff_ffff_8100_0000;
    let paddr: u64 = 0x100_0000;
    let mut elf = vec![0u8; 64 + 56];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    elf[5] = 1;
    elf[6] = 1;
    elf[16..18].copy_from_slice(&2u16.to_le_bytes());
    elf[18..20].copy_from_slice(&62u16.to_le_bytes());
    elf[24..32].copy_from_slice(&vaddr.to_le_bytes());
    elf[32..40].copy_from_slice(&64u64.to_le_bytes());
    elf[52..54].copy_from_slice(&64u16.to_le_bytes());
    elf[54..56].copy_from_slice(&56u16.to_le_bytes());
    elf[56..58].copy_from_slice(&1u16.to_le_bytes());
    let ph = &mut elf[64..];
    ph[..4].copy_from_slice(&1u32.to_le_bytes());
    ph[4..8].copy_from_slice(&7u32.to_le_bytes());
    ph[8..16].copy_from_slice(&120u64.to_le_bytes());
    ph[16..24].copy_from_slice(&vaddr.to_le_bytes());
    ph[24..32].copy_from_slice(&paddr.to_le_bytes());
    ph[32..40].copy_from_slice(&16u64.to_le_bytes());
    ph[40..48].copy_from_slice(&0x1000u64.to_le_bytes());
    elf.extend_from_slice(&[0x90; 16]);
    elf
}

/// The tiny vmlinux compressed in each format hugevmm decodes, with the
/// decompressed size appended as the kernel build does.
pub fn compressed_payloads() -> Vec<(&'static str, Vec<u8>)> {
    let elf = tiny_vmlinux();
    let size = (elf.len() as u32).to_le_bytes();
    let with_size = |mut v: Vec<u8>| {
        v.extend_from_slice(&size);
        v
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&elf).expect("gzip");
    // gzip's own trailer ends with ISIZE, the size the kernel appends.
    let gzip = gz.finish().expect("gzip");
    let xz = with_size(
        xz2::read::XzEncoder::new(&elf[..], 6)
            .bytes_vec()
            .expect("xz"),
    );
    let lzma = {
        let options = xz2::stream::LzmaOptions::new_preset(6).expect("lzma options");
        let stream = xz2::stream::Stream::new_lzma_encoder(&options).expect("lzma");
        with_size(
            xz2::read::XzEncoder::new_stream(&elf[..], stream)
                .bytes_vec()
                .expect("lzma"),
        )
    };
    let zstd = with_size(zstd::bulk::compress(&elf, 19).expect("zstd"));
    let block = lz4_flex::block::compress(&elf);
    let mut lz4 = 0x184c_2102u32.to_le_bytes().to_vec();
    lz4.extend_from_slice(&(block.len() as u32).to_le_bytes());
    lz4.extend_from_slice(&block);
    let lz4 = with_size(lz4);
    vec![
        ("gzip", gzip),
        ("xz", xz),
        ("lzma", lzma),
        ("zstd", zstd),
        ("lz4", lz4),
        ("uncompressed", elf),
    ]
}

trait ReadAll {
    fn bytes_vec(self) -> std::io::Result<Vec<u8>>;
}

impl<R: std::io::Read> ReadAll for R {
    fn bytes_vec(mut self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_to_end(&mut out)?;
        Ok(out)
    }
}

/// A bzImage around `payload`: boot protocol 2.15, loaded high, 64-bit
/// entry, one setup sector, the payload right after it.
pub fn bzimage(payload: &[u8]) -> Vec<u8> {
    let mut image = vec![0u8; 1024];
    let put = |image: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        image[at..at + bytes.len()].copy_from_slice(bytes)
    };
    image[field::SETUP_SECTS] = 1;
    put(&mut image, field::BOOT_FLAG, &0xaa55u16.to_le_bytes());
    image[field::JUMP] = 0xeb;
    image[field::JUMP + 1] = 0x6a;
    put(&mut image, field::HEADER, HDRS_MAGIC);
    put(&mut image, field::VERSION, &0x020fu16.to_le_bytes());
    image[field::LOADFLAGS] = 0x01;
    put(
        &mut image,
        field::INITRD_ADDR_MAX,
        &0x7fff_ffffu32.to_le_bytes(),
    );
    put(
        &mut image,
        field::KERNEL_ALIGNMENT,
        &(2u32 << 20).to_le_bytes(),
    );
    put(&mut image, field::XLOADFLAGS, &1u16.to_le_bytes());
    put(&mut image, field::CMDLINE_SIZE, &2047u32.to_le_bytes());
    put(&mut image, field::PAYLOAD_OFFSET, &0u32.to_le_bytes());
    put(
        &mut image,
        field::PAYLOAD_LENGTH,
        &(payload.len() as u32).to_le_bytes(),
    );
    put(&mut image, field::INIT_SIZE, &(4u32 << 20).to_le_bytes());
    image.extend_from_slice(payload);
    image
}

/// A kernel_image input: 64 MiB of RAM, an 8 KiB initrd, a command line.
fn kernel_input(kernel: &[u8]) -> Vec<u8> {
    let cmdline = b"console=ttyS0 panic=-1";
    let mut input = vec![2u8];
    input.extend_from_slice(&8192u32.to_le_bytes());
    input.push(cmdline.len() as u8);
    input.extend_from_slice(cmdline);
    input.extend_from_slice(kernel);
    input
}

//! The vhost-user-blk client against a real backend, qemu-storage-daemon,
//! started by each test on a Unix socket of its own; a test without it
//! skips visibly (see `test_resources`).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::test_support::{test_dir, StorageServer};
use crate::tests::{pattern, UNIT};
use crate::{AlignedBuf, BlockOp};

/// A raw image of `len_bytes` for a test, removed when dropped.
struct Image(PathBuf);

impl Image {
    fn new(tag: &str, len_bytes: u64) -> Image {
        let path = test_dir().join(format!(".blockio-vub-{}-{tag}.img", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(len_bytes).unwrap();
        Image(path)
    }

    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        std::fs::File::open(&self.0)
            .unwrap()
            .read_exact_at(&mut buf, offset)
            .unwrap();
        buf
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn options(timeout: Duration) -> VhostUserBlkOptions {
    VhostUserBlkOptions {
        timeout,
        ..VhostUserBlkOptions::default()
    }
}

fn open(server: &StorageServer, opts: &VhostUserBlkOptions) -> BlockFile {
    BlockFile::open_vhost_user_blk(Path::new(server.uri()), opts)
        .unwrap_or_else(|e| panic!("open {}: {e}", server.uri()))
}

fn write_batch(f: &BlockFile, bufs: &[AlignedBuf], first_slot: usize) {
    let mut ops: Vec<BlockOp> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| BlockOp::Write {
            offset: ((first_slot + i) * UNIT) as u64,
            buf: b,
        })
        .collect();
    for r in f.submit(&mut ops) {
        r.expect("write");
    }
}

#[test]
fn the_device_is_negotiated_and_batches_round_trip_to_the_file() {
    let image = Image::new("round-trip", 64 << 20);
    let Some(server) =
        StorageServer::qemu_storage_daemon("vhost-user-blk round trip", &image.0, &[])
    else {
        return;
    };
    let f = open(&server, &VhostUserBlkOptions::default());
    assert_eq!(f.engine_name(), "vhost-user-blk");
    assert_eq!(f.len_bytes().unwrap(), 64 << 20);
    assert!(f.is_block_device());
    assert_eq!((f.offset_align_bytes(), f.mem_align_bytes()), (512, 1));
    let client = f.vhost_user_blk().unwrap();
    assert!(client.can_flush());
    // More requests than one queue holds, and more data than the shared
    // buffers: placement waits for room.
    let count = 200;
    let bufs: Vec<AlignedBuf> = (0..count).map(|i| pattern(i as u64, UNIT)).collect();
    write_batch(&f, &bufs, 0);
    f.flush().unwrap();
    for i in [0, 77, count - 1] {
        assert!(
            image.read((i * UNIT) as u64, UNIT) == bufs[i][..],
            "slot {i} in the file"
        );
    }
    let mut back: Vec<AlignedBuf> = (0..count).map(|_| AlignedBuf::new(UNIT, 4096)).collect();
    let mut ops: Vec<BlockOp> = back
        .iter_mut()
        .enumerate()
        .map(|(i, b)| BlockOp::Read {
            offset: (i * UNIT) as u64,
            buf: b,
        })
        .collect();
    for r in f.submit(&mut ops) {
        r.expect("read");
    }
    for i in 0..count {
        assert!(back[i][..] == bufs[i][..], "request {i} differs");
    }
    // Unaligned buffers are fine (data is copied), pieces larger than the
    // largest request are split, odd sectors work.
    let big = pattern(99, 5 * MAX_PIECE_BYTES / 2);
    f.write_at(512, &big[..]).unwrap();
    let mut odd = vec![0u8; big.len() + 1];
    f.read_at(512, &mut odd[1..]).unwrap();
    assert!(odd[1..] == big[..]);
    assert!(client.completed_requests() >= 2 * count as u64);
}

#[test]
fn threads_share_the_queues_of_a_multiqueue_device() {
    let image = Image::new("mq", 64 << 20);
    let Some(server) = StorageServer::qemu_storage_daemon(
        "vhost-user-blk multiqueue",
        &image.0,
        &["num-queues=2"],
    ) else {
        return;
    };
    let f = Arc::new(open(
        &server,
        &VhostUserBlkOptions {
            queues: 2,
            ..VhostUserBlkOptions::default()
        },
    ));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                for round in 0..10 {
                    let slot = t * 10 + round;
                    let data = pattern(slot as u64 + 1000, UNIT);
                    f.write_at((slot * UNIT) as u64, &data).unwrap();
                    let mut back = AlignedBuf::new(UNIT, 4096);
                    f.read_at((slot * UNIT) as u64, &mut back).unwrap();
                    assert!(back[..] == data[..], "thread {t} round {round}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // While one frontend is connected, the backend serves no other: a
    // second is told so within the setup bound.
    let err =
        BlockFile::open_vhost_user_blk(Path::new(server.uri()), &VhostUserBlkOptions::default())
            .unwrap_err()
            .to_string();
    assert!(err.contains("is another one connected?"), "{err}");
    drop(f);
    // Asking for more queues than the device has is refused, saying so.
    let err = BlockFile::open_vhost_user_blk(
        Path::new(server.uri()),
        &VhostUserBlkOptions {
            queues: 3,
            ..VhostUserBlkOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("3 queues were asked for"), "{err}");
}

#[test]
fn a_4k_block_device_takes_whole_blocks_only() {
    let image = Image::new("4k", 8 << 20);
    let Some(server) = StorageServer::qemu_storage_daemon(
        "vhost-user-blk 4k blocks",
        &image.0,
        &["logical-block-size=4096"],
    ) else {
        return;
    };
    let f = open(&server, &VhostUserBlkOptions::default());
    assert_eq!(f.offset_align_bytes(), 4096);
    let err = f.write_at(512, &pattern(1, 4096)).unwrap_err();
    assert!(matches!(err, BlockIoError::Misaligned { .. }), "{err}");
    f.write_at(4096, &pattern(1, 4096)).unwrap();
    assert!(image.read(4096, 4096) == pattern(1, 4096)[..]);
    // Past the end: refused before anything is sent.
    let err = f
        .write_at(8 << 20, &pattern(1, 4096))
        .unwrap_err()
        .to_string();
    assert!(err.contains("past the device's end"), "{err}");
}

#[test]
fn discards_and_zeroes_reach_the_file() {
    let image = Image::new("discard", 8 << 20);
    let Some(server) = StorageServer::qemu_storage_daemon("vhost-user-blk discard", &image.0, &[])
    else {
        return;
    };
    let f = open(&server, &VhostUserBlkOptions::default());
    f.write_at(0, &pattern(5, 2 * UNIT)).unwrap();
    f.discard(0, UNIT as u64).unwrap();
    let mut buf = AlignedBuf::new(2 * UNIT, 4096);
    f.read_at(0, &mut buf).unwrap();
    assert!(buf[..UNIT].iter().all(|&b| b == 0), "zeroed");
    assert!(buf[UNIT..] == pattern(5, 2 * UNIT)[UNIT..]);
    f.trim(UNIT as u64, UNIT as u64).unwrap();
    let err = f.discard(100, 512).unwrap_err().to_string();
    assert!(err.contains("not whole blocks"), "{err}");
}

#[test]
fn a_backend_that_is_missing_refuses_or_exports_nothing_is_named_at_open() {
    let missing = test_dir().join(format!(".blockio-vub-{}-none.sock", std::process::id()));
    let err = BlockFile::open_vhost_user_blk(&missing, &VhostUserBlkOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no socket there: start the backend first"),
        "{err}"
    );
    let empty = Image::new("empty", 0);
    if let Some(server) = StorageServer::qemu_storage_daemon("vhost-user-blk size 0", &empty.0, &[])
    {
        let err = BlockFile::open_vhost_user_blk(
            Path::new(server.uri()),
            &VhostUserBlkOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("capacity of 0 sectors"), "{err}");
    }
    let image = Image::new("ro", 1 << 20);
    let Some(server) =
        StorageServer::qemu_storage_daemon("vhost-user-blk read-only", &image.0, &["writable=off"])
    else {
        return;
    };
    let err =
        BlockFile::open_vhost_user_blk(Path::new(server.uri()), &VhostUserBlkOptions::default())
            .unwrap_err()
            .to_string();
    assert!(err.contains("read-only"), "{err}");
    let f = open(
        &server,
        &VhostUserBlkOptions {
            read_only: true,
            ..VhostUserBlkOptions::default()
        },
    );
    let mut buf = AlignedBuf::new(4096, 4096);
    f.read_at(0, &mut buf).unwrap();
}

/// Writes batches on a thread while the backend is killed and started
/// again: every write completes, and the file holds every one.
#[test]
fn a_restarted_backend_is_reconnected_and_unfinished_requests_are_sent_again() {
    let image = Image::new("restart", 64 << 20);
    let Some(mut server) =
        StorageServer::qemu_storage_daemon("vhost-user-blk restart", &image.0, &[])
    else {
        return;
    };
    let f = Arc::new(open(&server, &options(Duration::from_secs(30))));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rounds_max = (64 << 20) / (8 * UNIT);
    let writer = {
        let (f, stop) = (Arc::clone(&f), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut round = 0;
            while round < rounds_max && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let bufs: Vec<AlignedBuf> = (0..8)
                    .map(|i| pattern((round * 8 + i) as u64, UNIT))
                    .collect();
                write_batch(&f, &bufs, round * 8);
                round += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            round
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    server.kill();
    std::thread::sleep(Duration::from_millis(500));
    server.restart();
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = writer.join().expect("every write completed");
    assert_eq!(
        f.vhost_user_blk().unwrap().reconnects(),
        1,
        "the kill came while it wrote"
    );
    assert!(rounds < rounds_max, "it wrote on after the restart");
    for slot in 0..rounds * 8 {
        assert!(
            image.read((slot * UNIT) as u64, UNIT) == pattern(slot as u64, UNIT)[..],
            "slot {slot}"
        );
    }
    let mut back = AlignedBuf::new(UNIT, 4096);
    f.read_at(3 * UNIT as u64, &mut back).unwrap();
    assert!(back[..] == pattern(3, UNIT)[..]);
}

#[test]
fn a_backend_gone_for_good_fails_requests_within_the_bound_naming_it() {
    let image = Image::new("gone", 8 << 20);
    let Some(mut server) = StorageServer::qemu_storage_daemon("vhost-user-blk gone", &image.0, &[])
    else {
        return;
    };
    let f = open(&server, &options(Duration::from_secs(2)));
    f.write_at(0, &pattern(1, UNIT)).unwrap();
    server.kill();
    let started = Instant::now();
    let err = f.write_at(0, &pattern(2, UNIT)).unwrap_err().to_string();
    assert!(
        err.contains("could not be reached again within 2 s"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "bounded");
    // The client stays dead: later requests fail at once, with the reason.
    let err = f.write_at(0, &pattern(2, UNIT)).unwrap_err().to_string();
    assert!(err.contains("could not be reached again"), "{err}");
}

#[test]
fn a_backend_that_never_completes_a_request_is_given_up_within_the_bound() {
    let image = Image::new("frozen", 8 << 20);
    let Some(server) = StorageServer::qemu_storage_daemon("vhost-user-blk frozen", &image.0, &[])
    else {
        return;
    };
    let f = open(&server, &options(Duration::from_secs(2)));
    f.write_at(0, &pattern(1, UNIT)).unwrap();
    server.freeze();
    let started = Instant::now();
    let err = f.write_at(0, &pattern(2, UNIT)).unwrap_err().to_string();
    assert!(err.contains("could not be reached again"), "{err}");
    // 2 s unanswered, then 2 s of reconnecting whose last try may wait for
    // a message (5 s): well under a minute either way.
    assert!(started.elapsed() < Duration::from_secs(60), "bounded");
}

/// A backend whose device fails reads (QEMU's blkdebug): the read fails
/// with EIO saying what the backend answered, and its buffer is not
/// filled; writes still work.
#[test]
fn an_io_error_status_fails_the_request_naming_it() {
    let image = Image::new("ioerr", 8 << 20);
    let Some(server) =
        StorageServer::qemu_storage_daemon_failing("vhost-user-blk io error", &image.0, "read_aio")
    else {
        return;
    };
    let f = open(&server, &VhostUserBlkOptions::default());
    f.write_at(0, &pattern(1, UNIT)).unwrap();
    let mut buf = vec![7u8; UNIT];
    let err = f.read_at(0, &mut buf).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("VIRTIO_BLK_S_IOERR"), "{text}");
    assert_eq!(std::io::Error::from(err).raw_os_error(), None);
    assert!(
        buf.iter().all(|&b| b == 7),
        "nothing of a failed read is delivered"
    );
    assert!(image.read(0, UNIT) == pattern(1, UNIT)[..]);
}

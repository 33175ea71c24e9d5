//! The NBD client against real servers (nbdkit, qemu-nbd) started by each
//! test on a Unix socket of its own; a test without its server skips
//! visibly (see `test_resources`).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::test_support::{test_dir, FakeNbdServer, Misbehaviour, NbdServer};
use crate::tests::{pattern, UNIT};
use crate::{AlignedBuf, BlockOp};

fn open(server: &NbdServer, reconnect_timeout: Duration) -> BlockFile {
    let uri: NbdUri = server.uri().parse().expect("the server's URI parses");
    BlockFile::open_nbd(
        &uri,
        &NbdOptions {
            reconnect_timeout,
            read_only: false,
        },
    )
    .unwrap_or_else(|e| panic!("open {}: {e}", server.uri()))
}

fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hugevmm-nbd-{}-{name}.log", std::process::id()))
}

#[test]
fn handshake_reports_the_export() {
    let Some(server) = NbdServer::nbdkit("nbd handshake", &["memory", "size=64M"]) else {
        return;
    };
    let f = open(&server, DEFAULT_RECONNECT_TIMEOUT);
    assert_eq!(f.len_bytes().unwrap(), 64 << 20);
    assert_eq!(f.engine_name(), "nbd");
    assert!(f.is_block_device());
    let export = *f.nbd().unwrap().export();
    assert!(export.can_flush() && export.can_fua() && export.can_trim());
    assert!(!export.read_only());
    assert!(export.max_block_bytes >= export.min_block_bytes);
    assert_eq!(f.offset_align_bytes(), export.min_block_bytes as usize);
    assert_eq!(f.mem_align_bytes(), 1);
}

#[test]
fn a_tcp_server_is_reached_too() {
    let Some(server) = NbdServer::nbdkit_tcp("nbd over tcp", &["memory", "size=8M"]) else {
        return;
    };
    let f = open(&server, DEFAULT_RECONNECT_TIMEOUT);
    assert_eq!(f.len_bytes().unwrap(), 8 << 20);
    let data = pattern(11, UNIT);
    f.write_at(UNIT as u64, &data).unwrap();
    let mut back = AlignedBuf::new(UNIT, 4096);
    f.read_at(UNIT as u64, &mut back).unwrap();
    assert!(back[..] == data[..]);
}

#[test]
fn a_tcp_connection_is_dropped_by_the_kernel_once_its_server_stops_answering() {
    let Some(server) = NbdServer::nbdkit_tcp("nbd tcp keepalive", &["memory", "size=8M"]) else {
        return;
    };
    let uri: NbdUri = server.uri().parse().expect("the server's URI parses");
    let addrs = uri.resolve().expect("the server's address resolves");
    let timeout = Duration::from_secs(10);
    let (stream, _) = handshake::connect(&uri, &addrs, None, timeout)
        .unwrap_or_else(|e| panic!("connect {}: {}", server.uri(), e.message));
    let handshake::Stream::Tcp(tcp) = &stream else {
        panic!("{} gave a Unix socket", server.uri());
    };
    let socket = socket2::SockRef::from(tcp);
    // Unacknowledged data for the timeout ends the connection ...
    assert_eq!(socket.tcp_user_timeout().unwrap(), Some(timeout));
    // ... and so do 4 unanswered probes, one every fifth of it, when idle.
    assert!(socket.keepalive().unwrap());
    assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(2));
    assert_eq!(
        socket.tcp_keepalive_interval().unwrap(),
        Duration::from_secs(2)
    );
    assert_eq!(socket.tcp_keepalive_retries().unwrap(), 4);
}

#[test]
fn a_read_only_export_is_refused_for_writing_and_opened_read_only() {
    let Some(server) = NbdServer::nbdkit("nbd read-only", &["-r", "memory", "size=8M"]) else {
        return;
    };
    let uri: NbdUri = server.uri().parse().unwrap();
    let err = BlockFile::open_nbd(&uri, &NbdOptions::default()).unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    let f = BlockFile::open_nbd(
        &uri,
        &NbdOptions {
            read_only: true,
            ..NbdOptions::default()
        },
    )
    .unwrap();
    let mut buf = AlignedBuf::new(4096, 4096);
    f.read_at(0, &mut buf).unwrap();
    let err = f.write_at(0, &buf).unwrap_err();
    assert!(
        matches!(&err, BlockIoError::Io { source, .. } if source.raw_os_error() == Some(libc::EPERM)),
        "{err}"
    );
}

#[test]
fn an_unknown_export_is_named() {
    let file = test_dir().join(format!(".nbd-export-{}", std::process::id()));
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let server = NbdServer::qemu_nbd("nbd unknown export", &file);
    let _ = std::fs::remove_file(&file);
    let Some(server) = server else { return };
    let uri: NbdUri = server
        .uri()
        .replace(":///?", ":///nosuch?")
        .parse()
        .unwrap();
    let err = BlockFile::open_nbd(&uri, &NbdOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no export named \"nosuch\""), "{text}");
    assert!(text.contains("nosuch?socket="), "{text}");
}

#[test]
fn nothing_listening_is_a_clear_error_at_open() {
    let uri: NbdUri = format!(
        "nbd+unix:///x?socket={}",
        std::env::temp_dir()
            .join(format!("hugevmm-no-server-{}", std::process::id()))
            .display()
    )
    .parse()
    .unwrap();
    let err = BlockFile::open_nbd(&uri, &NbdOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("cannot use the NBD export nbd+unix:///x"),
        "{text}"
    );
    assert!(text.contains("connect"), "{text}");
}

/// Many writes, then many reads, each batch sent before any reply is
/// awaited, from several threads at once; one request longer than the
/// server's largest payload is split.
#[test]
fn pipelined_batches_round_trip_from_many_threads() {
    let Some(server) = NbdServer::nbdkit("nbd pipelined", &["memory", "size=256M"]) else {
        return;
    };
    let f = Arc::new(open(&server, DEFAULT_RECONNECT_TIMEOUT));
    round_trip_from_threads(&f, 4, 100);
    let max = f.nbd().unwrap().max_request_bytes() as usize;
    let big = pattern(99, max + 3 * UNIT);
    f.write_at(128 << 20, &big).unwrap();
    let mut back = AlignedBuf::new(big.len(), 1);
    f.read_at(128 << 20, &mut back).unwrap();
    assert!(back[..] == big[..]);
}

/// The request lines (not the "...Write id=N return=0" replies) of an
/// nbdkit log naming `what`, e.g. " Write ".
fn log_lines(path: &PathBuf, what: &str) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_string)
        .collect()
}

/// Writes go out with FUA where the server offers it, and are followed by
/// a flush where it does not; the server's own log shows which.
#[test]
fn writes_are_durable_by_fua_or_a_covering_flush() {
    let with_fua = log_path("fua");
    let without = log_path("nofua");
    let log_arg = |p: &PathBuf| format!("logfile={}", p.display());
    let (a, b) = (log_arg(&with_fua), log_arg(&without));
    let Some(fua) = NbdServer::nbdkit("nbd fua", &["--filter=log", "memory", "size=16M", &a])
    else {
        return;
    };
    let Some(nofua) = NbdServer::nbdkit(
        "nbd flush",
        &["--filter=log", "--filter=fua", "memory", "size=16M", &b],
    ) else {
        return;
    };
    for (server, log, expect_fua) in [(&fua, &with_fua, true), (&nofua, &without, false)] {
        let f = open(server, DEFAULT_RECONNECT_TIMEOUT);
        assert_eq!(f.nbd().unwrap().export().can_fua(), expect_fua);
        let bufs: Vec<AlignedBuf> = (0..4).map(|i| pattern(i, UNIT)).collect();
        let mut ops: Vec<BlockOp> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| BlockOp::Write {
                offset: (i * UNIT) as u64,
                buf: b,
            })
            .collect();
        for r in f.submit(&mut ops) {
            r.unwrap();
        }
        f.flush().unwrap();
        drop(f);
        let writes = log_lines(log, " Write ");
        assert_eq!(writes.len(), 4, "{writes:?}");
        let flushes = log_lines(log, " Flush ");
        if expect_fua {
            assert!(writes.iter().all(|l| l.contains("fua=1")), "{writes:?}");
            // Only the explicit flush() call.
            assert_eq!(flushes.len(), 1, "{flushes:?}");
        } else {
            assert!(writes.iter().all(|l| l.contains("fua=0")), "{writes:?}");
            // The batch's covering flush, then the explicit one.
            assert_eq!(flushes.len(), 2, "{flushes:?}");
        }
        let _ = std::fs::remove_file(log);
    }
}

#[test]
fn discard_zeroes_and_trim_is_sent() {
    let log = log_path("trim");
    let log_arg = format!("logfile={}", log.display());
    let Some(server) = NbdServer::nbdkit(
        "nbd trim",
        &["--filter=log", "memory", "size=16M", &log_arg],
    ) else {
        return;
    };
    let f = open(&server, DEFAULT_RECONNECT_TIMEOUT);
    f.write_at(0, &pattern(5, 4 * UNIT)).unwrap();
    f.discard(UNIT as u64, UNIT as u64).unwrap();
    let mut back = AlignedBuf::new(4 * UNIT, 1);
    f.read_at(0, &mut back).unwrap();
    assert!(back[UNIT..2 * UNIT].iter().all(|&b| b == 0));
    assert!(back[..UNIT] == pattern(5, 4 * UNIT)[..UNIT]);
    f.trim(2 * UNIT as u64, UNIT as u64).unwrap();
    drop(f);
    assert_eq!(log_lines(&log, " Zero ").len(), 1);
    assert_eq!(log_lines(&log, " Trim ").len(), 1);
    let _ = std::fs::remove_file(&log);
}

/// A server that keeps its data (nbdkit's file plugin) killed and started
/// again: what was written before is read back, and requests issued while
/// it was down wait and then complete.
#[test]
fn a_restarted_server_is_reconnected_and_waiting_requests_complete() {
    let file = test_dir().join(format!(".nbd-restart-{}", std::process::id()));
    std::fs::write(&file, vec![0u8; 16 << 20]).unwrap();
    let path = file.to_str().unwrap().to_string();
    let Some(mut server) = NbdServer::nbdkit("nbd reconnect", &["file", &path]) else {
        let _ = std::fs::remove_file(&file);
        return;
    };
    let f = Arc::new(open(&server, Duration::from_secs(60)));
    let before = pattern(1, 4 * UNIT);
    f.write_at(0, &before).unwrap();
    server.kill();
    // Issued while nothing listens: they must wait, not fail or read zeros.
    let reader = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            let mut back = AlignedBuf::new(4 * UNIT, 1);
            f.read_at(0, &mut back).map(|()| back)
        })
    };
    let writer = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || f.write_at(8 * UNIT as u64, &pattern(2, UNIT)))
    };
    server.restart();
    let back = reader
        .join()
        .unwrap()
        .expect("the read waits for the server");
    assert!(back[..] == before[..]);
    writer
        .join()
        .unwrap()
        .expect("the write waits for the server");
    assert!(f.nbd().unwrap().reconnects() >= 1);
    let mut back = AlignedBuf::new(UNIT, 1);
    f.read_at(8 * UNIT as u64, &mut back).unwrap();
    assert!(back[..] == pattern(2, UNIT)[..]);
    drop(f);
    let _ = std::fs::remove_file(&file);
}

/// Killed for good: after the bound, requests fail with a message naming
/// the server, and later ones fail at once.
#[test]
fn a_server_gone_for_good_fails_requests_naming_it() {
    let Some(mut server) = NbdServer::nbdkit("nbd dead server", &["memory", "size=8M"]) else {
        return;
    };
    let f = open(&server, Duration::from_millis(500));
    server.kill();
    let mut buf = AlignedBuf::new(UNIT, 1);
    let err = f.read_at(0, &mut buf).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(server.uri()), "{text}");
    assert!(text.contains("unreachable"), "{text}");
    assert!(
        matches!(&err, BlockIoError::Io { source, .. } if source.kind() == io::ErrorKind::NotConnected),
        "{err:?}"
    );
    let err = f.write_at(0, &buf).unwrap_err();
    assert!(err.to_string().contains("unreachable"), "{err}");
    assert!(f.flush().unwrap_err().to_string().contains("unreachable"));
}

/// The error filter's EIO on reads and on writes reaches the caller as
/// EIO; the read's buffer is not claimed to hold data.
#[test]
fn server_errors_are_surfaced() {
    for (kind, filter_args) in [
        ("read", ["error-pread-rate=100%", "error-pwrite-rate=0%"]),
        ("write", ["error-pread-rate=0%", "error-pwrite-rate=100%"]),
    ] {
        let Some(server) = NbdServer::nbdkit(
            "nbd error filter",
            &[
                "--filter=error",
                "memory",
                "size=8M",
                "error=EIO",
                filter_args[0],
                filter_args[1],
            ],
        ) else {
            return;
        };
        let f = open(&server, DEFAULT_RECONNECT_TIMEOUT);
        let data = pattern(3, UNIT);
        let mut buf = AlignedBuf::new(UNIT, 1);
        let result = if kind == "read" {
            f.read_at(0, &mut buf)
        } else {
            f.write_at(0, &data)
        };
        let err = result.expect_err(kind);
        assert!(
            matches!(&err, BlockIoError::Io { source, .. } if source.raw_os_error() == Some(libc::EIO)),
            "{kind}: {err:?}"
        );
    }
}

/// Waits (generously) until `ready` holds; a state that never comes fails
/// the test naming `what`.
fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// nbdkit stopped the normal way (SIGTERM) while requests are in flight:
/// its delay filter's sleeps end early on a shutdown, so the writes and the
/// read it holds are answered `NBD_ESHUTDOWN` before it closes. Started
/// again, it gets them all again: the read returns the file's data, and
/// the writes, which never reached the file, are in it.
#[test]
fn a_server_stopped_with_sigterm_gets_its_unanswered_requests_again() {
    let file = test_dir().join(format!(".nbd-sigterm-{}", std::process::id()));
    let before = pattern(21, 4 * UNIT);
    let mut image = vec![0u8; 16 << 20];
    image[..4 * UNIT].copy_from_slice(&before);
    std::fs::write(&file, &image).unwrap();
    let log = log_path("sigterm");
    let _ = std::fs::remove_file(&log);
    let args = [
        "--filter=log".to_string(),
        "--filter=delay".to_string(),
        "file".to_string(),
        file.to_str().unwrap().to_string(),
        format!("logfile={}", log.display()),
        "delay-read=2".to_string(),
        "delay-write=2".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let Some(mut server) = NbdServer::nbdkit("nbd sigterm", &args) else {
        let _ = std::fs::remove_file(&file);
        return;
    };
    let f = Arc::new(open(&server, Duration::from_secs(60)));
    let written = || (0..4).map(|i| pattern(30 + i, UNIT)).collect::<Vec<_>>();
    let writer = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            let written = written();
            let mut ops: Vec<BlockOp> = written
                .iter()
                .enumerate()
                .map(|(i, b)| BlockOp::Write {
                    offset: ((8 + i) * UNIT) as u64,
                    buf: b,
                })
                .collect();
            f.submit(&mut ops)
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .map(|_| ())
        })
    };
    let reader = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            let mut back = AlignedBuf::new(4 * UNIT, 1);
            f.read_at(0, &mut back).map(|()| back)
        })
    };
    // The log filter sits outside the delay: a request is logged as soon
    // as the server has it, then sleeps.
    wait_for("the requests to reach the server", || {
        log_lines(&log, " Write ").len() == 4 && log_lines(&log, " Read ").len() == 1
    });
    server.terminate();
    let answered = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        answered.contains("ESHUTDOWN"),
        "nbdkit answers what it held with ESHUTDOWN: {answered}"
    );
    server.restart();
    writer
        .join()
        .unwrap()
        .expect("the writes are sent again, not failed");
    let back = reader
        .join()
        .unwrap()
        .expect("the read is sent again, not failed");
    assert!(back[..] == before[..], "the read returns the file's data");
    assert!(f.nbd().unwrap().reconnects() >= 1);
    drop(f);
    drop(server);
    let image = std::fs::read(&file).unwrap();
    for (i, w) in written().iter().enumerate() {
        assert!(
            image[(8 + i) * UNIT..(9 + i) * UNIT] == w[..],
            "write {i} is in the file"
        );
    }
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&log);
}

/// Writes 64 units in one pipelined batch and reads them back in another,
/// through `server`; every byte must come back, whatever the server did to
/// its connections meanwhile.
fn round_trip_through(server: &FakeNbdServer) -> BlockFile {
    let uri: NbdUri = server.uri().parse().expect("the fake server's URI parses");
    let f = BlockFile::open_nbd(
        &uri,
        &NbdOptions {
            reconnect_timeout: Duration::from_secs(60),
            read_only: false,
        },
    )
    .expect("open the fake server");
    let count = 64;
    let bufs: Vec<AlignedBuf> = (0..count).map(|i| pattern(40 + i as u64, UNIT)).collect();
    let mut ops: Vec<BlockOp> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| BlockOp::Write {
            offset: (i * UNIT) as u64,
            buf: b,
        })
        .collect();
    for r in f.submit(&mut ops) {
        r.expect("every write completes");
    }
    let mut back: Vec<AlignedBuf> = (0..count)
        .map(|_| {
            let mut b = AlignedBuf::new(UNIT, 1);
            // Not zeros: a read claimed done with part of its data
            // missing would show.
            b.fill(0xa5);
            b
        })
        .collect();
    let mut ops: Vec<BlockOp> = back
        .iter_mut()
        .enumerate()
        .map(|(i, b)| BlockOp::Read {
            offset: (i * UNIT) as u64,
            buf: b,
        })
        .collect();
    for r in f.submit(&mut ops) {
        r.expect("every read completes");
    }
    for (i, b) in back.iter().enumerate() {
        assert!(b[..] == bufs[i][..], "unit {i} reads back as written");
        assert!(
            server.contents((i * UNIT) as u64, UNIT) == bufs[i][..],
            "unit {i} is on the server"
        );
    }
    f
}

/// A server that closes each connection right after a reply, with
/// requests sent after it unanswered (a clean EOF between replies): they
/// are sent again on the next connection.
#[test]
fn a_server_closing_after_a_reply_gets_the_rest_again() {
    let server = FakeNbdServer::start(16 << 20, Misbehaviour::CloseAfterReply { every: 5 });
    let f = round_trip_through(&server);
    assert!(server.misbehaved() >= 20, "{}", server.misbehaved());
    assert!(f.nbd().unwrap().reconnects() >= 20);
}

/// A server that closes in the middle of a reply (half a read's data, or
/// half a header): the torn reply is no answer, the request goes out again.
#[test]
fn a_server_closing_mid_reply_gets_the_request_again() {
    let server = FakeNbdServer::start(16 << 20, Misbehaviour::CloseMidReply { every: 5 });
    let f = round_trip_through(&server);
    assert!(server.misbehaved() >= 20, "{}", server.misbehaved());
    assert!(f.nbd().unwrap().reconnects() >= 20);
}

/// A server that answers a request under a cookie the client never sent
/// (its data after it): the client takes that for a broken connection,
/// not for an answer to anything, reconnects and sends again; every word
/// reads back as written.
#[test]
fn a_reply_under_a_wrong_cookie_breaks_the_connection_and_nothing_is_taken_from_it() {
    let server = FakeNbdServer::start(16 << 20, Misbehaviour::WrongCookie { every: 7 });
    let f = round_trip_through(&server);
    assert!(server.misbehaved() >= 10, "{}", server.misbehaved());
    assert!(f.nbd().unwrap().reconnects() >= 10);
}

/// The fake server itself, well-behaved: what the tests above rely on.
#[test]
fn the_fake_server_serves_when_it_behaves() {
    let server = FakeNbdServer::start(16 << 20, Misbehaviour::None);
    let f = round_trip_through(&server);
    assert_eq!(server.misbehaved(), 0);
    assert_eq!(f.nbd().unwrap().reconnects(), 0);
    assert_eq!(server.connections(), 1);
}

/// A server that is there for every connection but serves none (it drops
/// each before answering, or answers everything `NBD_ESHUTDOWN`): the
/// bound runs from the first drop, not from each, so the request fails
/// with the server named instead of waiting forever.
#[test]
fn a_server_that_never_serves_is_given_up_within_the_bound() {
    for misbehaviour in [Misbehaviour::CloseBeforeReply, Misbehaviour::AnswerShutdown] {
        let server = FakeNbdServer::start(16 << 20, misbehaviour);
        let uri: NbdUri = server.uri().parse().unwrap();
        let f = Arc::new(
            BlockFile::open_nbd(
                &uri,
                &NbdOptions {
                    reconnect_timeout: Duration::from_secs(2),
                    read_only: false,
                },
            )
            .expect("open the fake server"),
        );
        let (done, result) = std::sync::mpsc::channel();
        {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(UNIT, 1);
                let _ = done.send(f.read_at(0, &mut buf));
            });
        }
        // Generous: the bound is 2 s; a client that restarts it on every
        // connection never answers at all.
        let err = result
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{misbehaviour:?}: the read is still waiting after 120 s"))
            .expect_err("nothing was served");
        let text = err.to_string();
        assert!(
            matches!(&err, BlockIoError::Io { source, .. } if source.kind() == io::ErrorKind::NotConnected),
            "{misbehaviour:?}: {err:?}"
        );
        assert!(text.contains("unreachable"), "{misbehaviour:?}: {text}");
        assert!(text.contains(server.uri()), "{misbehaviour:?}: {text}");
        assert!(
            server.connections() >= 2,
            "{misbehaviour:?}: it reconnected"
        );
    }
}

/// A handshake that never ends, by endless option replies or by replies
/// trickled a byte at a time (each read soon has its byte, so only a
/// deadline for the whole handshake ends it): the open fails, saying why,
/// instead of waiting forever.
#[test]
fn an_endless_or_trickled_handshake_fails_the_open() {
    for (misbehaviour, expect) in [
        (Misbehaviour::EndlessOptionReplies, "more than 16 replies"),
        (
            Misbehaviour::TrickleOptionReplies,
            "did not finish the handshake within 5.0 s",
        ),
    ] {
        let server = FakeNbdServer::start(16 << 20, misbehaviour);
        let uri: NbdUri = server.uri().parse().unwrap();
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(BlockFile::open_nbd(&uri, &NbdOptions::default()).map(|_| ()));
        });
        let err = result
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("{misbehaviour:?}: the open is still waiting after 120 s"))
            .expect_err("no handshake completed");
        let text = err.to_string();
        assert!(text.contains(expect), "{misbehaviour:?}: {text}");
        assert!(text.contains(server.uri()), "{misbehaviour:?}: {text}");
        assert_eq!(server.misbehaved(), 1, "{misbehaviour:?}");
    }
}

/// A server that takes the requests and falls silent, its connection up
/// (frozen, or its host gone without a reset): after the bound without a
/// reply the request fails naming the server, instead of waiting forever.
#[test]
fn a_frozen_server_is_given_up_within_the_bound() {
    let server = FakeNbdServer::start(16 << 20, Misbehaviour::Freeze);
    let uri: NbdUri = server.uri().parse().unwrap();
    let f = Arc::new(
        BlockFile::open_nbd(
            &uri,
            &NbdOptions {
                reconnect_timeout: Duration::from_secs(2),
                read_only: false,
            },
        )
        .expect("open the fake server"),
    );
    let (done, result) = std::sync::mpsc::channel();
    {
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            let mut buf = AlignedBuf::new(UNIT, 1);
            let _ = done.send(f.read_at(0, &mut buf));
        });
    }
    let err = result
        .recv_timeout(Duration::from_secs(120))
        .expect("the read is still waiting after 120 s")
        .expect_err("nothing was answered");
    let text = err.to_string();
    assert!(
        matches!(&err, BlockIoError::Io { source, .. } if source.kind() == io::ErrorKind::NotConnected),
        "{err:?}"
    );
    assert!(text.contains("no reply for"), "{text}");
    assert!(text.contains("frozen"), "{text}");
    assert!(text.contains(server.uri()), "{text}");
    assert!(server.misbehaved() >= 1);
}

/// Many 2 MiB writes and reads in flight from several threads at once, a
/// request larger than one seal piece, and small ones: what a swap store
/// sends, on one connection (one TLS session, over TLS) shared by the
/// writers and the reader.
pub(super) fn round_trip_from_threads(f: &Arc<BlockFile>, threads: u64, count: usize) {
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let f = Arc::clone(f);
            std::thread::spawn(move || {
                let base = t * (count as u64) * UNIT as u64;
                let bufs: Vec<AlignedBuf> = (0..count)
                    .map(|i| pattern(t * 1000 + i as u64, UNIT))
                    .collect();
                let mut ops: Vec<BlockOp> = bufs
                    .iter()
                    .enumerate()
                    .map(|(i, b)| BlockOp::Write {
                        offset: base + (i * UNIT) as u64,
                        buf: b,
                    })
                    .collect();
                for r in f.submit(&mut ops) {
                    r.expect("write");
                }
                let mut back: Vec<AlignedBuf> =
                    (0..count).map(|_| AlignedBuf::new(UNIT, 1)).collect();
                let mut ops: Vec<BlockOp> = back
                    .iter_mut()
                    .enumerate()
                    .map(|(i, b)| BlockOp::Read {
                        offset: base + (i * UNIT) as u64,
                        buf: b,
                    })
                    .collect();
                for r in f.submit(&mut ops) {
                    r.expect("read");
                }
                for (i, b) in back.iter().enumerate() {
                    assert!(b[..] == bufs[i][..], "thread {t} request {i}");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let small = pattern(77, 4096);
    f.write_at(4096, &small).unwrap();
    let mut back = AlignedBuf::new(4096, 1);
    f.read_at(4096, &mut back).unwrap();
    assert!(back[..] == small[..]);
}

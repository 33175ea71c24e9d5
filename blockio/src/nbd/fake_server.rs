//! A small NBD server for tests, in memory on a Unix socket, that goes
//! away in the ways no real server can be made to on cue: it closes a
//! connection right after a reply, or in the middle of one. It speaks just
//! enough of the protocol for this client: the fixed-newstyle handshake
//! with `NBD_OPT_GO` (and `NBD_OPT_ABORT`), then simple replies to read,
//! write, flush, trim, write zeroes and disconnect, one request at a time
//! per connection. What it stores survives its connections, as a server
//! that stays up does.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::handshake::{
    TFLAG_HAS_FLAGS, TFLAG_SEND_FLUSH, TFLAG_SEND_FUA, TFLAG_SEND_TRIM, TFLAG_SEND_WRITE_ZEROES,
};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;

/// How the server goes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Serves correctly.
    None,
    /// Closes each connection right after its `every`-th reply, with the
    /// requests sent after it unanswered.
    CloseAfterReply {
        /// Replies per connection.
        every: u64,
    },
    /// Sends each connection's `every`-th reply only in part (a read's
    /// header and half its data, or half the header of any other reply)
    /// and closes. The request itself was carried out.
    CloseMidReply {
        /// Replies per connection, the torn one included.
        every: u64,
    },
    /// Answers each connection's `every`-th request under a cookie it
    /// never sent (the data carried out, the connection left open): a
    /// server that mixes up its replies. The client must take no such
    /// reply for any of its requests.
    WrongCookie {
        /// Replies per connection, the wrong one included.
        every: u64,
    },
    /// Takes each connection through the handshake, reads the first
    /// request and closes without carrying it out: a server that is back
    /// to the network but never serves.
    CloseBeforeReply,
    /// Answers every request `NBD_ESHUTDOWN` (and closes when the client
    /// disconnects): a server forever shutting down.
    AnswerShutdown,
    /// Completes the handshake, then reads requests and never answers,
    /// the connection kept open: a frozen server, or a host gone without
    /// a reset.
    Freeze,
    /// Answers `NBD_OPT_GO` with information replies that never end.
    EndlessOptionReplies,
    /// Answers `NBD_OPT_GO` with information replies that never end, one
    /// byte every 100 ms: each read has its byte long before any
    /// per-read timeout.
    TrickleOptionReplies,
}

/// A running fake server; stops when dropped.
pub struct FakeNbdServer {
    dir: PathBuf,
    uri: String,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    data: Mutex<Vec<u8>>,
    misbehaviour: Misbehaviour,
    stop: AtomicBool,
    connections: AtomicU64,
    misbehaved: AtomicU64,
    /// The open connections' sockets by number, to end them when the
    /// server stops.
    open: Mutex<HashMap<u64, UnixStream>>,
}

impl FakeNbdServer {
    /// Serves an export of `size_bytes` (zeros at first) on a fresh Unix
    /// socket, going away as `misbehaviour` says.
    pub fn start(size_bytes: u64, misbehaviour: Misbehaviour) -> FakeNbdServer {
        use std::sync::atomic::AtomicUsize;
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        // Under the system temp dir: a socket path must be short.
        let dir = std::env::temp_dir().join(format!(
            "hugevmm-fake-nbd-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the fake server's socket");
        let socket = dir.join("sock");
        let listener = UnixListener::bind(&socket).expect("bind the fake server's socket");
        let shared = Arc::new(Shared {
            // Zeroed pages the kernel maps on first touch: only what is
            // written costs memory.
            data: Mutex::new(vec![
                0;
                usize::try_from(size_bytes).expect("export fits memory")
            ]),
            misbehaviour,
            stop: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            misbehaved: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        });
        let for_acceptor = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("fake-nbd".into())
            .spawn(move || accept_loop(&for_acceptor, &listener))
            .expect("start the fake server's thread");
        FakeNbdServer {
            uri: format!("nbd+unix:///?socket={}", socket.display()),
            dir,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The URI to connect to.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Connections closed on purpose so far (after or in a reply).
    pub fn misbehaved(&self) -> u64 {
        self.shared.misbehaved.load(Ordering::Relaxed)
    }

    /// A copy of `len_bytes` of the export at `offset`, as the server holds it.
    pub fn contents(&self, offset: u64, len_bytes: usize) -> Vec<u8> {
        let data = lock(&self.shared.data);
        let start = offset as usize;
        data[start..start + len_bytes].to_vec()
    }
}

impl Drop for FakeNbdServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the acceptor, which then sees the stop flag.
        let _ = UnixStream::connect(self.dir.join("sock"));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for (_, s) in lock(&self.shared.open).drain() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &UnixListener) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let Ok(copy) = stream.try_clone() else {
            continue;
        };
        let id = shared.connections.fetch_add(1, Ordering::Relaxed);
        lock(&shared.open).insert(id, copy);
        let shared = Arc::clone(shared);
        // Ends with its connection; an error there is the client's
        // business (it reconnects), not the test's.
        std::thread::spawn(move || {
            let _ = serve(&shared, stream);
            // Closed for good: the copy kept for the server's stop must
            // neither hold it open nor pile up descriptors.
            if let Some(copy) = lock(&shared.open).remove(&id) {
                let _ = copy.shutdown(std::net::Shutdown::Both);
            }
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read_u16(s: &mut impl Read) -> io::Result<u16> {
    let mut b = [0; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(s: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn option_reply(s: &mut UnixStream, option: u32, reply: u32, data: &[u8]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(20 + data.len());
    msg.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    msg.extend_from_slice(&option.to_be_bytes());
    msg.extend_from_slice(&reply.to_be_bytes());
    msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
    msg.extend_from_slice(data);
    s.write_all(&msg)
}

/// The handshake; true when it reached transmission.
fn handshake(shared: &Shared, s: &mut UnixStream) -> io::Result<bool> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBDMAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    // Fixed newstyle, no zeroes.
    greeting.extend_from_slice(&3u16.to_be_bytes());
    s.write_all(&greeting)?;
    let _client_flags = read_u32(s)?;
    loop {
        if read_u64(s)? != IHAVEOPT {
            return Ok(false);
        }
        let option = read_u32(s)?;
        let len = read_u32(s)?;
        let mut data = vec![0; len as usize];
        s.read_exact(&mut data)?;
        match option {
            OPT_GO
                if matches!(
                    shared.misbehaviour,
                    Misbehaviour::EndlessOptionReplies | Misbehaviour::TrickleOptionReplies
                ) =>
            {
                shared.misbehaved.fetch_add(1, Ordering::Relaxed);
                // NBD_INFO_DESCRIPTION, over and over, until the client
                // hangs up (the write fails).
                let mut reply = Vec::new();
                reply.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
                reply.extend_from_slice(&OPT_GO.to_be_bytes());
                reply.extend_from_slice(&REP_INFO.to_be_bytes());
                reply.extend_from_slice(&6u32.to_be_bytes());
                reply.extend_from_slice(&2u16.to_be_bytes());
                reply.extend_from_slice(b"fake");
                loop {
                    if shared.misbehaviour == Misbehaviour::EndlessOptionReplies {
                        s.write_all(&reply)?;
                        continue;
                    }
                    for byte in &reply {
                        s.write_all(std::slice::from_ref(byte))?;
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                }
            }
            OPT_GO => {
                let size = lock(&shared.data).len() as u64;
                let flags = TFLAG_HAS_FLAGS
                    | TFLAG_SEND_FLUSH
                    | TFLAG_SEND_FUA
                    | TFLAG_SEND_TRIM
                    | TFLAG_SEND_WRITE_ZEROES;
                let mut export = Vec::with_capacity(12);
                export.extend_from_slice(&0u16.to_be_bytes());
                export.extend_from_slice(&size.to_be_bytes());
                export.extend_from_slice(&flags.to_be_bytes());
                option_reply(s, OPT_GO, REP_INFO, &export)?;
                option_reply(s, OPT_GO, REP_ACK, &[])?;
                return Ok(true);
            }
            OPT_ABORT => {
                option_reply(s, OPT_ABORT, REP_ACK, &[])?;
                return Ok(false);
            }
            other => option_reply(s, other, REP_ERR_UNSUP, &[])?,
        }
    }
}

/// One connection: the handshake, then requests until the client leaves
/// or the misbehaviour ends it.
fn serve(shared: &Shared, mut s: UnixStream) -> io::Result<()> {
    if !handshake(shared, &mut s)? {
        return Ok(());
    }
    let mut replies = 0u64;
    loop {
        if read_u32(&mut s)? != REQUEST_MAGIC {
            return Ok(());
        }
        let _flags = read_u16(&mut s)?;
        let command = read_u16(&mut s)?;
        let cookie = read_u64(&mut s)?;
        let offset = read_u64(&mut s)?;
        let len = read_u32(&mut s)? as usize;
        let mut payload = Vec::new();
        if command == CMD_WRITE {
            payload = vec![0; len];
            s.read_exact(&mut payload)?;
        }
        if command == CMD_DISC {
            return Ok(());
        }
        match shared.misbehaviour {
            Misbehaviour::Freeze => {
                if replies == 0 {
                    shared.misbehaved.fetch_add(1, Ordering::Relaxed);
                    // Counts the connection once; nothing is ever answered.
                    replies = 1;
                }
                continue;
            }
            Misbehaviour::CloseBeforeReply => {
                shared.misbehaved.fetch_add(1, Ordering::Relaxed);
                let _ = s.shutdown(std::net::Shutdown::Both);
                return Ok(());
            }
            Misbehaviour::AnswerShutdown => {
                shared.misbehaved.fetch_add(1, Ordering::Relaxed);
                let mut reply = Vec::with_capacity(16);
                reply.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
                reply.extend_from_slice(&(libc::ESHUTDOWN as u32).to_be_bytes());
                reply.extend_from_slice(&cookie.to_be_bytes());
                s.write_all(&reply)?;
                continue;
            }
            _ => {}
        }
        let mut data = lock(&shared.data);
        let start = offset as usize;
        let in_bounds = start.checked_add(len).is_some_and(|end| end <= data.len());
        let mut errno = 0u32;
        let mut read_data = Vec::new();
        if !in_bounds && command != CMD_FLUSH {
            errno = libc::EINVAL as u32;
        } else {
            match command {
                CMD_READ => read_data = data[start..start + len].to_vec(),
                CMD_WRITE => data[start..start + len].copy_from_slice(&payload),
                CMD_TRIM | CMD_WRITE_ZEROES => data[start..start + len].fill(0),
                CMD_FLUSH => {}
                _ => errno = libc::EINVAL as u32,
            }
        }
        drop(data);
        replies += 1;
        let cookie = match shared.misbehaviour {
            Misbehaviour::WrongCookie { every } if replies % every == 0 => {
                shared.misbehaved.fetch_add(1, Ordering::Relaxed);
                // High bits the client's counter never reaches.
                cookie ^ 0x5a5a_0000_0000_0000
            }
            _ => cookie,
        };
        let mut reply = Vec::with_capacity(16 + read_data.len());
        reply.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        reply.extend_from_slice(&errno.to_be_bytes());
        reply.extend_from_slice(&cookie.to_be_bytes());
        if errno == 0 {
            reply.extend_from_slice(&read_data);
        }
        let (cut, close) = match shared.misbehaviour {
            Misbehaviour::CloseAfterReply { every } if replies % every == 0 => (reply.len(), true),
            Misbehaviour::CloseMidReply { every } if replies % every == 0 => {
                // Into a read's data where there is some, else the header.
                let cut = if reply.len() > 16 {
                    16 + (reply.len() - 16) / 2
                } else {
                    8
                };
                (cut, true)
            }
            _ => (reply.len(), false),
        };
        s.write_all(&reply[..cut])?;
        if close {
            shared.misbehaved.fetch_add(1, Ordering::Relaxed);
            let _ = s.shutdown(std::net::Shutdown::Both);
            return Ok(());
        }
    }
}

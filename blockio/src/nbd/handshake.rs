//! Connecting and the fixed-newstyle handshake (NBD protocol,
//! `doc/proto.md` of the NBD project): the server's greeting, our flags,
//! then `NBD_OPT_GO` for the export asking for `NBD_INFO_EXPORT` (size and
//! transmission flags) and `NBD_INFO_BLOCK_SIZE` (the block size
//! constraints). Old-style servers and servers that only know
//! `NBD_OPT_EXPORT_NAME` are refused with a message: every maintained
//! server (nbdkit, qemu-nbd, nbd-server >= 3.10) does `NBD_OPT_GO`, and
//! only it reports block sizes and lets an unknown export be an error we
//! can print instead of a closed connection.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::tls::TlsSetup;
use super::uri::{NbdAddress, NbdUri};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

const OPT_ABORT: u32 = 2;
const OPT_STARTTLS: u32 = 5;
const OPT_GO: u32 = 7;

const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_FLAG_ERROR: u32 = 1 << 31;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flag: the flags field is valid.
pub(crate) const TFLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only.
pub(crate) const TFLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is supported.
pub(crate) const TFLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is supported.
pub(crate) const TFLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: `NBD_CMD_TRIM` is supported.
pub(crate) const TFLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` is supported.
pub(crate) const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;

/// How long one connection attempt may take in all (TCP connect, then
/// the whole handshake): a server that accepts but never answers, or
/// trickles its answers, must not hold a reconnect past its bound.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The most replies to `NBD_OPT_GO` taken before its acknowledgement: we
/// ask for two kinds of information, a server may add its name and
/// description; one that keeps sending is not negotiating.
const MAX_OPTION_REPLIES: usize = 16;

/// What the server said about the export in its `NBD_OPT_GO` replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export's size in bytes.
    pub size_bytes: u64,
    /// The transmission flags (`NBD_FLAG_*`).
    pub flags: u16,
    /// Minimum block size: offsets and lengths must be multiples of it.
    pub min_block_bytes: u32,
    /// Preferred block size.
    pub preferred_block_bytes: u32,
    /// Largest payload of one request.
    pub max_block_bytes: u32,
}

impl ExportInfo {
    /// Whether the export refuses writes.
    pub fn read_only(&self) -> bool {
        self.flags & TFLAG_READ_ONLY != 0
    }
    /// Whether the server takes `NBD_CMD_FLUSH`.
    pub fn can_flush(&self) -> bool {
        self.flags & TFLAG_SEND_FLUSH != 0
    }
    /// Whether the server takes writes with `NBD_CMD_FLAG_FUA`.
    pub fn can_fua(&self) -> bool {
        self.flags & TFLAG_SEND_FUA != 0
    }
    /// Whether the server takes `NBD_CMD_TRIM`.
    pub fn can_trim(&self) -> bool {
        self.flags & TFLAG_SEND_TRIM != 0
    }
    /// Whether the server takes `NBD_CMD_WRITE_ZEROES`.
    pub fn can_write_zeroes(&self) -> bool {
        self.flags & TFLAG_SEND_WRITE_ZEROES != 0
    }
}

/// A connected socket of either family.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TLS over one of the two ([`super::tls`]).
    Tls(super::tls::TlsStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()?),
        })
    }

    /// Ends the connection both ways, which wakes a thread blocked reading it.
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tls(s) => {
                s.raw().shutdown();
                Ok(())
            }
        };
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tls(s) => s.raw().set_read_timeout(timeout),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How many unanswered keepalive probes drop a connection.
const KEEPALIVE_PROBES: u32 = 4;

/// Makes the kernel drop the TCP connection `s` once its peer has not
/// answered for about `after` (`,timeout=`), so that no thread waits on a
/// dead server host forever:
///
/// - `TCP_USER_TIMEOUT`: data sent and not acknowledged for `after` ends
///   the connection with ETIMEDOUT. Without it a writer whose send buffer
///   filled before the host died waits in `send` for the kernel's
///   retransmission limit, about 15 minutes; the reader's own silence
///   check cannot reach a thread blocked there.
/// - keepalive: an idle connection (every request acknowledged, replies
///   awaited) is probed every fifth of `after`; [`KEEPALIVE_PROBES`]
///   unanswered probes end it, so a host that died after acknowledging
///   the requests is noticed in about `after` too.
///
/// The reader then reconnects or fails the requests, naming the server,
/// as for any dropped connection.
pub(crate) fn bound_dead_peer(s: &TcpStream, after: Duration) -> Result<(), AttemptError> {
    let probe_every = (after / (KEEPALIVE_PROBES + 1)).max(Duration::from_secs(1));
    let socket = socket2::SockRef::from(s);
    socket
        .set_tcp_user_timeout(Some(after.max(Duration::from_millis(1))))
        .map_err(|e| AttemptError::io("setsockopt(TCP_USER_TIMEOUT)", e))?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(probe_every)
        .with_interval(probe_every)
        .with_retries(KEEPALIVE_PROBES);
    socket
        .set_tcp_keepalive(&keepalive)
        .map_err(|e| AttemptError::io("setsockopt(SO_KEEPALIVE, TCP_KEEP*)", e))
}

/// Why a connection attempt failed: the text for messages, and whether
/// trying again can help (a refused connection can, an unknown export
/// cannot).
#[derive(Debug)]
pub(crate) struct AttemptError {
    pub(crate) message: String,
    pub(crate) retryable: bool,
}

impl AttemptError {
    pub(crate) fn io(what: &str, e: io::Error) -> Self {
        AttemptError {
            message: format!("{what}: {e}"),
            retryable: true,
        }
    }
    pub(crate) fn protocol(message: String) -> Self {
        AttemptError {
            message,
            retryable: false,
        }
    }
}

/// Connects to the server of `uri` (at `tcp_addrs`, resolved at open) and
/// negotiates its export, within [`ATTEMPT_TIMEOUT`]. A TCP connection
/// whose peer stops answering is dropped by the kernel after
/// `dead_peer_after` ([`bound_dead_peer`]).
pub(crate) fn connect(
    uri: &NbdUri,
    tcp_addrs: &[SocketAddr],
    tls: Option<&TlsSetup>,
    dead_peer_after: Duration,
) -> Result<(Stream, ExportInfo), AttemptError> {
    connect_by(
        uri,
        tcp_addrs,
        tls,
        Instant::now() + ATTEMPT_TIMEOUT,
        dead_peer_after,
    )
}

/// [`connect`], given up at `deadline` (or [`ATTEMPT_TIMEOUT`] from now,
/// if sooner) whatever step it is at.
pub(crate) fn connect_by(
    uri: &NbdUri,
    tcp_addrs: &[SocketAddr],
    tls: Option<&TlsSetup>,
    deadline: Instant,
    dead_peer_after: Duration,
) -> Result<(Stream, ExportInfo), AttemptError> {
    let started = Instant::now();
    let deadline = deadline.min(started + ATTEMPT_TIMEOUT);
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut stream = match &uri.address {
        NbdAddress::Unix { socket } => {
            Stream::Unix(UnixStream::connect(socket).map_err(|e| AttemptError::io("connect", e))?)
        }
        NbdAddress::Tcp { .. } => {
            let mut last = io::Error::new(io::ErrorKind::NotFound, "the host name has no address");
            let mut found = None;
            for addr in tcp_addrs {
                match TcpStream::connect_timeout(addr, left()) {
                    Ok(s) => {
                        found = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let s = found.ok_or_else(|| AttemptError::io("connect", last))?;
            // Request headers are small and each is followed by its reply
            // wait: Nagle's algorithm would hold them back.
            s.set_nodelay(true)
                .map_err(|e| AttemptError::io("setsockopt(TCP_NODELAY)", e))?;
            bound_dead_peer(&s, dead_peer_after)?;
            Stream::Tcp(s)
        }
    };
    greet(&mut Timed {
        stream: &mut stream,
        deadline,
        started,
    })?;
    if let Some(tls) = tls {
        start_tls(&mut Timed {
            stream: &mut stream,
            deadline,
            started,
        })?;
        stream = tls.start(stream, deadline)?;
    }
    let info = go(
        &mut Timed {
            stream: &mut stream,
            deadline,
            started,
        },
        &uri.export,
    )?;
    // Transmission replies may take as long as the server's storage does.
    stream
        .set_read_timeout(None)
        .map_err(|e| AttemptError::io("setsockopt(SO_RCVTIMEO)", e))?;
    Ok((stream, info))
}

/// The socket during the handshake: each read waits only for what is left
/// of the attempt's time, so that no sequence of slow answers outlasts it.
pub(crate) struct Timed<'a> {
    pub(crate) stream: &'a mut Stream,
    pub(crate) deadline: Instant,
    pub(crate) started: Instant,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let late = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the server did not finish the handshake within {:.1} s",
                    (self.deadline - self.started).as_secs_f64()
                ),
            )
        };
        if left.is_zero() {
            return Err(late());
        }
        self.stream.set_read_timeout(Some(left))?;
        match self.stream.read(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(late())
            }
            other => other,
        }
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
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

/// The client's side of the handshake against `server_bytes`, all that a
/// server sends, with everything the client sends discarded: the entry of
/// the `nbd_handshake` fuzz target (fuzz/src/nbd_handshake.rs), which
/// plays a hostile or broken server. The error is the message a user
/// would see.
#[doc(hidden)]
pub fn negotiate_replayed(server_bytes: &[u8], export: &str) -> Result<ExportInfo, String> {
    negotiate(
        &mut Replayed {
            from_server: server_bytes,
        },
        export,
    )
    .map_err(|e| e.message)
}

/// The same for an `nbds` client up to the TLS handshake: the greeting,
/// then the reply to `NBD_OPT_STARTTLS` (the TLS that follows is
/// rustls's, fuzzed by its own project).
#[doc(hidden)]
pub fn start_tls_replayed(server_bytes: &[u8]) -> Result<(), String> {
    let mut s = Replayed {
        from_server: server_bytes,
    };
    greet(&mut s)
        .and_then(|()| start_tls(&mut s))
        .map_err(|e| e.message)
}

/// A server's bytes played back, the client's discarded.
struct Replayed<'a> {
    from_server: &'a [u8],
}

impl Read for Replayed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.from_server.read(buf)
    }
}

impl Write for Replayed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The fixed-newstyle negotiation up to transmission, without TLS.
fn negotiate(s: &mut (impl Read + Write), export: &str) -> Result<ExportInfo, AttemptError> {
    greet(s)?;
    go(s, export)
}

/// The server's greeting and the client's flags.
fn greet(s: &mut (impl Read + Write)) -> Result<(), AttemptError> {
    let io = |what: &'static str| move |e: io::Error| AttemptError::io(what, e);
    let magic = read_u64(s).map_err(io("reading the server's greeting"))?;
    if magic != NBDMAGIC {
        return Err(AttemptError::protocol(format!(
            "not an NBD server (greeting {magic:#x}, expected NBDMAGIC)"
        )));
    }
    let style = read_u64(s).map_err(io("reading the server's greeting"))?;
    if style == OLDSTYLE_MAGIC {
        return Err(AttemptError::protocol(
            "the server speaks the old-style handshake only; run it in newstyle mode (nbdkit and qemu-nbd do by default)".into(),
        ));
    }
    if style != IHAVEOPT {
        return Err(AttemptError::protocol(format!(
            "unknown handshake magic {style:#x}"
        )));
    }
    let server_flags = read_u16(s).map_err(io("reading the server's flags"))?;
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(AttemptError::protocol(
            "the server does not do the fixed-newstyle handshake".into(),
        ));
    }
    let mut client_flags = CLIENT_FLAG_FIXED_NEWSTYLE;
    if server_flags & FLAG_NO_ZEROES != 0 {
        client_flags |= CLIENT_FLAG_NO_ZEROES;
    }
    s.write_all(&client_flags.to_be_bytes())
        .map_err(io("sending the client flags"))
}

/// `NBD_OPT_STARTTLS`: the server must acknowledge it, and the TLS
/// handshake follows at once; a server that will not is refused rather
/// than used in the clear.
fn start_tls(s: &mut (impl Read + Write)) -> Result<(), AttemptError> {
    let io = |what: &'static str| move |e: io::Error| AttemptError::io(what, e);
    send_option(s, OPT_STARTTLS, &[]).map_err(io("sending NBD_OPT_STARTTLS"))?;
    let (reply, payload) = read_option_reply(s, OPT_STARTTLS, "NBD_OPT_STARTTLS")?;
    match reply {
        REP_ACK if payload.is_empty() => Ok(()),
        r if r & REP_FLAG_ERROR != 0 => {
            let text = String::from_utf8_lossy(&payload);
            let _ = send_option(s, OPT_ABORT, &[]);
            Err(AttemptError::protocol(format!(
                "the server does not offer TLS (NBD_OPT_STARTTLS refused with error {}{}{text}); start it with TLS (nbdkit --tls=require --tls-certificates=DIR, qemu-nbd --tls-creds) or use nbd:// in the clear",
                r & !REP_FLAG_ERROR,
                if text.is_empty() { "" } else { ": " },
            )))
        }
        r => Err(AttemptError::protocol(format!(
            "unexpected reply type {r} to NBD_OPT_STARTTLS"
        ))),
    }
}

/// `NBD_OPT_GO` for `export`, up to transmission.
fn go(s: &mut (impl Read + Write), export: &str) -> Result<ExportInfo, AttemptError> {
    let io = |what: &'static str| move |e: io::Error| AttemptError::io(what, e);
    // NBD_OPT_GO: name length, name, the info requests.
    let name = export.as_bytes();
    let mut data = Vec::with_capacity(8 + name.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name);
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &data).map_err(io("sending NBD_OPT_GO"))?;

    let mut size_flags = None;
    let mut block = None;
    let mut replies = 0;
    loop {
        replies += 1;
        if replies > MAX_OPTION_REPLIES {
            return Err(AttemptError::protocol(format!(
                "the server sent more than {MAX_OPTION_REPLIES} replies to NBD_OPT_GO without acknowledging it"
            )));
        }
        let (reply, payload) = read_option_reply(s, OPT_GO, "NBD_OPT_GO")?;
        match reply {
            REP_ACK => break,
            REP_INFO if payload.len() >= 2 => {
                let kind = u16::from_be_bytes([payload[0], payload[1]]);
                match kind {
                    INFO_EXPORT if payload.len() >= 12 => {
                        let size = u64::from_be_bytes(payload[2..10].try_into().expect("8 bytes"));
                        let flags = u16::from_be_bytes([payload[10], payload[11]]);
                        size_flags = Some((size, flags));
                    }
                    INFO_BLOCK_SIZE if payload.len() >= 14 => {
                        let word = |i: usize| {
                            u32::from_be_bytes(payload[i..i + 4].try_into().expect("4 bytes"))
                        };
                        block = Some((word(2), word(6), word(10)));
                    }
                    // Other information (name, description) is not needed.
                    _ => {}
                }
            }
            REP_INFO => {}
            r if r & REP_FLAG_ERROR != 0 => {
                let text = String::from_utf8_lossy(&payload).into_owned();
                let _ = send_option(s, OPT_ABORT, &[]);
                // A server shutting down (a restart under way) may take
                // the next connection; any other refusal stays.
                let mut error = AttemptError::protocol(option_error(r, export, &text));
                error.retryable = r == REP_FLAG_ERROR | 7;
                return Err(error);
            }
            r => {
                return Err(AttemptError::protocol(format!(
                    "unexpected reply type {r} to NBD_OPT_GO"
                )))
            }
        }
    }
    let (size_bytes, flags) = size_flags.ok_or_else(|| {
        AttemptError::protocol("the server acknowledged NBD_OPT_GO without NBD_INFO_EXPORT".into())
    })?;
    if flags & TFLAG_HAS_FLAGS == 0 {
        return Err(AttemptError::protocol(
            "the server's transmission flags lack NBD_FLAG_HAS_FLAGS".into(),
        ));
    }
    // Without NBD_INFO_BLOCK_SIZE the protocol's defaults apply: any
    // alignment, payloads up to 32 MiB.
    let (min, preferred, max) = block.unwrap_or((1, 4096, 32 << 20));
    if min == 0 || !min.is_power_of_two() || max < min {
        return Err(AttemptError::protocol(format!(
            "the server reports impossible block sizes (minimum {min}, maximum {max})"
        )));
    }
    Ok(ExportInfo {
        size_bytes,
        flags,
        min_block_bytes: min,
        preferred_block_bytes: preferred.max(min),
        max_block_bytes: max,
    })
}

/// One reply to `option` (named `name` in messages): its type and its
/// payload, at most 1 MiB. A reply to another option is refused.
fn read_option_reply(
    s: &mut impl Read,
    option: u32,
    name: &str,
) -> Result<(u32, Vec<u8>), AttemptError> {
    let io = |e: io::Error| AttemptError::io(&format!("reading the {name} reply"), e);
    let magic = read_u64(s).map_err(io)?;
    if magic != OPT_REPLY_MAGIC {
        return Err(AttemptError::protocol(format!(
            "bad option reply magic {magic:#x}"
        )));
    }
    let replied_to = read_u32(s).map_err(io)?;
    let reply = read_u32(s).map_err(io)?;
    let len = read_u32(s).map_err(io)?;
    if len > 1 << 20 {
        return Err(AttemptError::protocol(format!(
            "option reply of {len} bytes is implausibly long"
        )));
    }
    let mut payload = vec![0; len as usize];
    s.read_exact(&mut payload).map_err(io)?;
    if replied_to != option {
        return Err(AttemptError::protocol(format!(
            "reply to option {replied_to} while waiting for {name}"
        )));
    }
    Ok((reply, payload))
}

fn send_option(s: &mut impl Write, option: u32, data: &[u8]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(16 + data.len());
    msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
    msg.extend_from_slice(&option.to_be_bytes());
    msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
    msg.extend_from_slice(data);
    s.write_all(&msg)
}

/// The message for an `NBD_REP_ERR_*` reply to `NBD_OPT_GO`.
fn option_error(reply: u32, export: &str, text: &str) -> String {
    let what = match reply & !REP_FLAG_ERROR {
        1 => "the server does not support NBD_OPT_GO (it is too old: use nbdkit, qemu-nbd or nbd-server >= 3.10)".to_string(),
        2 => "the server's policy refuses the export".to_string(),
        3 => "the server calls the request invalid".to_string(),
        5 => "the server requires TLS: connect with nbds:// (tls-certificates=DIR naming its CA)".to_string(),
        6 => format!("the server has no export named {export:?}; check the EXPORT part of the URI (nbdkit serves any name, qemu-nbd the one given with -x, default empty)"),
        7 => "the server is shutting down".to_string(),
        8 => "the server requires block size negotiation".to_string(),
        n => format!("the server refused the export (error {n})"),
    };
    if text.is_empty() {
        what
    } else {
        format!("{what}: {text}")
    }
}

//! The API's listeners: the Unix socket of `hugevmm run --api-socket
//! PATH` (every route) and the TCP socket of `--metrics-addr` (`GET
//! /metrics` only), both speaking HTTP/1.1 (`http.rs` frames, `api.rs`
//! routes).
//!
//! Why not an HTTP server crate: the limits below are the point of this
//! file, and the crates that serve Unix sockets without an async runtime
//! do not give them. tiny_http (0.12, the one suggested) hands each
//! connection to a pool that grows a thread per connection without bound
//! and sets no read timeout on Unix sockets, so silent clients pile up
//! threads for ever; it answers a malformed request line with an empty
//! 400 (no reason), and cannot be woken out of its client threads when
//! the VM ends. hyper needs tokio, a second runtime in a VMM of plain
//! threads. So the connections are ours, and the parsing is `httparse`
//! (hyper's own request parser, no I/O, no unsafe in our use).
//!
//! The socket is bound before the VM is built, so that a path in use fails
//! the run before anything is allocated, and served once the vCPUs start;
//! a client that connects in between waits in the listen backlog.
//!
//! One accepting thread per listener hands each connection to a thread of
//! its own, so that a client that is slow, silent or stuck in a long
//! request (`pageout`) never delays another, nor the VM (no lock of the
//! vCPUs is held while a client is read from or written to). The limits
//! keep any one client, or many, from holding the VMM:
//! - at most [`MAX_CLIENTS`] connections per listener are served at once;
//!   one more gets a 503 and is closed;
//! - a client has [`IDLE_TIMEOUT`] from connecting, or from its last
//!   response, to send a complete request (timed over the whole request,
//!   so that trickling a byte at a time does not extend it), or it gets a
//!   408 and is dropped;
//! - a response must be taken within [`WRITE_TIMEOUT`], or the client is
//!   dropped;
//! - request heads and bodies are bounded (`http.rs`); past a bound the
//!   client gets a 431 or 413 and is closed.
//!
//! Every thread sleeps in `poll` on its socket and one stop eventfd, so
//! the VM's end wakes them all at once; a request in progress is finished
//! first. Joining the accepting thread joins the client threads.

use super::api::{self, Service};
use super::context::ControlContext;
use super::http::{self, Parsed, Response};
use crate::ratelimit::GuestLog;
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

/// Most clients served at once per listener. Each holds a thread (and, in
/// a request, a share of the VMM's attention); a few people, scripts and a
/// Prometheus server watching one VM need far fewer.
pub const MAX_CLIENTS: usize = 16;

/// How long a client may take to send a complete request, from connecting
/// or from its last response; past it the client is dropped, so that
/// connections left open by crashed or hostile clients do not use up
/// [`MAX_CLIENTS`]. `hugevmm ctl` and curl send their request at once.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a response may wait for a client that does not read; past it
/// the client is dropped so that its thread does not wait for ever.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// After an error that closes the connection, how long the rest of what
/// the client sends (an oversized body, say) is read and dropped, so that
/// the close does not reset the connection before the client has read the
/// error, and how much of it at most.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;

/// The server's limits; tests shorten them.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_clients: usize,
    idle_timeout: Duration,
    write_timeout: Duration,
}

impl Limits {
    const DEFAULT: Limits = Limits {
        max_clients: MAX_CLIENTS,
        idle_timeout: IDLE_TIMEOUT,
        write_timeout: WRITE_TIMEOUT,
    };
}

/// What a server answers its requests with: the VM's API
/// ([`ControlContext`], through [`api::handle`]), or another process's
/// routes on the same listeners, peer checks and bounds (`hugevmm host`).
pub(crate) trait Routes: Send + Sync + 'static {
    /// The response to `request`, on a listener that serves `service`.
    fn respond(&self, service: Service, request: &http::Request) -> http::Response;
}

impl Routes for ControlContext {
    fn respond(&self, service: Service, request: &http::Request) -> http::Response {
        api::handle(self, service, request)
    }
}

// Client threads share one context: everything in it must be usable from
// several threads at once (see `ControlContext`'s docs for what is
// serialized and why).
const _: () = {
    const fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<ControlContext>();
};

/// The socket's file; removed when dropped if it is still the one this
/// process created (same device and inode), so that a path taken over by
/// someone else is left alone.
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| meta.dev() == self.dev && meta.ino() == self.ino);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Makes room for the socket at `path`: nothing there is fine, a socket
/// nobody listens on (left by a VM that was killed) is removed, anything
/// else is refused.
fn clear_stale(path: &Path) -> Result<()> {
    let shown = path.display();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => bail!("--api-socket {shown}: cannot inspect the path: {e}"),
    };
    if !meta.file_type().is_socket() {
        bail!(
            "--api-socket {shown}: the path exists and is not a socket; give a path that does not exist (it is created, and removed when the VM ends)"
        );
    }
    match UnixStream::connect(path) {
        Ok(_) => bail!(
            "--api-socket {shown}: a running program (another hugevmm?) listens on this socket; give another path or end that VM first"
        ),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => std::fs::remove_file(path)
            .with_context(|| {
                format!("--api-socket {shown}: cannot remove the stale socket left there")
            }),
        Err(e) => bail!(
            "--api-socket {shown}: cannot tell whether the socket there is in use ({e}); remove it or give another path"
        ),
    }
}

/// Most connections waiting to be accepted on the API socket.
const LISTEN_BACKLOG: libc::c_int = 128;

/// Creates a Unix stream socket listening at `path` whose file has mode
/// 0600 (less what the umask takes) from the moment it exists.
///
/// Linux gives the file that `bind` creates the mode of the socket's own
/// inode, less the umask (`unix_bind_bsd`: `SOCK_INODE(sock)->i_mode &
/// ~current_umask()`), and `fchmod` on the unbound socket sets that mode.
/// So the socket is `fchmod`ed to 0600 before it is bound: no moment in
/// which the file has the umask's mode, and no change of the umask, which
/// is the whole process's (other threads create files meanwhile).
fn bind_owner_only(path: &Path) -> io::Result<UnixListener> {
    let address = unix_address(path)?;
    // SAFETY: socket has no memory effects; the descriptor it returns is
    // owned by no one else and is taken over by the OwnedFd just below.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh, open descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fchmod on a descriptor this function owns; no memory effects.
    if unsafe { libc::fchmod(socket.as_raw_fd(), 0o600) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `address` is an initialized sockaddr_un that lives across the
    // call, and its size is passed with it; bind only reads it.
    let bound = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&address as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if bound < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen on a descriptor this function owns; no memory effects.
    if unsafe { libc::listen(socket.as_raw_fd(), LISTEN_BACKLOG) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixListener::from(socket))
}

/// The address of the Unix socket at `path` (NUL-terminated in
/// `sun_path`, which holds 107 bytes of path).
fn unix_address(path: &Path) -> io::Result<libc::sockaddr_un> {
    // SAFETY: sockaddr_un is plain data for which all zeros is valid.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.contains(&0) {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            "the path holds a NUL byte",
        ));
    }
    if bytes.len() >= address.sun_path.len() {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!(
                "the path is {} bytes long and a Unix socket's address holds at most {}; give a shorter path",
                bytes.len(),
                address.sun_path.len() - 1
            ),
        ));
    }
    for (to, &from) in address.sun_path.iter_mut().zip(bytes) {
        *to = from as libc::c_char;
    }
    Ok(address)
}

/// The uid and pid of the process at the other end of `stream`, as they
/// were when it connected (`SO_PEERCRED`).
fn peer_credentials(stream: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes for the whole call, and
    // `len` holds the size of `cred`, which the kernel writes no more than.
    let got = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::other("SO_PEERCRED returned a short answer"));
    }
    Ok(cred)
}

/// This process's effective uid: the API socket's owner.
fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Who may talk to the API socket: whoever connects to it can resize the
/// guest's memory, end the VM or read its statistics. The file's mode
/// (0600) keeps others out where the directory's permissions are what
/// they seem; the peer's uid (`SO_PEERCRED`, checked on every connection)
/// is checked as well, so that a socket reached some other way (a copy
/// of the descriptor, a mode changed later, a namespace) is still the
/// owner's only.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PeerPolicy {
    owner: u32,
    /// Sorted, without repeats: the owner, root and the --api-allow-uid
    /// uids.
    allowed: Vec<u32>,
}

impl PeerPolicy {
    /// This process's uid, root and `extra` (`--api-allow-uid`).
    fn owner_root_and(extra: &[u32]) -> PeerPolicy {
        Self::with_owner(effective_uid(), extra)
    }

    fn with_owner(owner: u32, extra: &[u32]) -> PeerPolicy {
        let mut allowed: Vec<u32> = [owner, 0].iter().chain(extra).copied().collect();
        allowed.sort_unstable();
        allowed.dedup();
        PeerPolicy { owner, allowed }
    }

    fn allows(&self, uid: u32) -> bool {
        self.allowed.binary_search(&uid).is_ok()
    }

    /// The 403's message for a client of `uid`.
    fn refusal(&self, uid: u32) -> String {
        let others: Vec<String> = self
            .allowed
            .iter()
            .filter(|&&u| u != self.owner && u != 0)
            .map(u32::to_string)
            .collect();
        let also = if others.is_empty() {
            String::new()
        } else {
            format!(", uid {} (--api-allow-uid)", others.join(", "))
        };
        let who = if self.owner == 0 {
            "root (the uid that started the VM)".to_string()
        } else {
            format!("the uid that started the VM ({}), root", self.owner)
        };
        format!(
            "this API serves {who}{also} only, and this client runs as uid {uid}: run the client as one of them, or start the VM with --api-allow-uid {uid}"
        )
    }
}

/// A bound API socket, not served yet.
pub struct ControlSocket {
    listener: UnixListener,
    file: SocketFile,
    peers: PeerPolicy,
}

impl ControlSocket {
    /// Creates the socket at `path` (mode 0600 from the start: whoever can
    /// connect can resize the guest's memory), replacing a stale one; it
    /// serves this process's uid, root and `allow_uids`
    /// (`--api-allow-uid`).
    pub fn bind(path: &Path, allow_uids: &[u32]) -> Result<Self> {
        Self::bind_for(path, PeerPolicy::owner_root_and(allow_uids))
    }

    fn bind_for(path: &Path, peers: PeerPolicy) -> Result<Self> {
        clear_stale(path)?;
        let shown = path.display();
        let listener = bind_owner_only(path)
            .with_context(|| format!("cannot create the API socket --api-socket {shown}"))?;
        let meta = std::fs::symlink_metadata(path)
            .with_context(|| format!("--api-socket {shown}: the socket vanished"))?;
        let file = SocketFile {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        };
        // A umask that takes the owner's own bits (0277, say) leaves a
        // socket its owner cannot connect to: those are given back. Only
        // owner bits are ever added.
        if meta.mode() & 0o777 != 0o600 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).with_context(
                || format!("--api-socket {shown}: cannot give the socket mode 0600"),
            )?;
        }
        // poll says when a client waits; the accept must not block if it
        // gave up in between.
        listener
            .set_nonblocking(true)
            .context("cannot make the API socket non-blocking")?;
        Ok(Self {
            listener,
            file,
            peers,
        })
    }

    /// Starts the threads that serve every route with `context`.
    pub fn serve(self, context: Arc<ControlContext>) -> Result<ControlServer> {
        self.serve_with(context, Limits::DEFAULT)
    }

    /// Starts the threads that answer every request with `routes`.
    pub fn serve_routes(self, routes: Arc<dyn Routes>) -> Result<ControlServer> {
        self.serve_with(routes, Limits::DEFAULT)
    }

    fn serve_with(self, context: Arc<dyn Routes>, limits: Limits) -> Result<ControlServer> {
        start(
            self.listener,
            Some(self.file),
            context,
            Service::Api,
            Admission::Uids(self.peers),
            limits,
            "api",
        )
    }
}

/// A bound `--metrics-addr` listener, not served yet.
pub struct MetricsListener {
    listener: TcpListener,
    /// Whether the address is reachable from other hosts (not loopback):
    /// then each peer gets at most [`MAX_CLIENTS_PER_PEER`] slots.
    remote: bool,
}

impl MetricsListener {
    /// Listens on `addr` (bound before the VM is built, so that a port in
    /// use fails the run before anything is allocated).
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr).with_context(|| {
            format!("--metrics-addr {addr}: cannot listen there (in use? give another port, e.g. 127.0.0.1:9800)")
        })?;
        listener
            .set_nonblocking(true)
            .context("cannot make the metrics socket non-blocking")?;
        Ok(Self {
            listener,
            remote: !addr.ip().is_loopback(),
        })
    }

    /// The address bound (the port the kernel chose for port 0).
    #[cfg(test)]
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Starts the threads that serve `GET /metrics` with `context`.
    pub fn serve(self, context: Arc<ControlContext>) -> Result<ControlServer> {
        self.serve_with(context, Limits::DEFAULT)
    }

    fn serve_with(self, context: Arc<dyn Routes>, limits: Limits) -> Result<ControlServer> {
        let admission = if self.remote {
            Admission::PerAddress(Default::default())
        } else {
            Admission::Any
        };
        start(
            self.listener,
            None,
            context,
            Service::MetricsOnly,
            admission,
            limits,
            "metrics",
        )
    }
}

/// Who is at the other end of a new connection.
enum Peer {
    /// A process on this host (the API socket): its uid and pid.
    Local { uid: u32, pid: i32 },
    /// A TCP client (`--metrics-addr`).
    Remote(IpAddr),
}

/// What the listeners and streams of both kinds have in common.
trait Listen: AsRawFd + Send + 'static {
    type Stream: Connection;
    fn accept_one(&self) -> io::Result<(Self::Stream, Peer)>;
}

impl Listen for UnixListener {
    type Stream = UnixStream;
    fn accept_one(&self) -> io::Result<(UnixStream, Peer)> {
        let (stream, _) = self.accept()?;
        let cred = peer_credentials(&stream)?;
        Ok((
            stream,
            Peer::Local {
                uid: cred.uid,
                pid: cred.pid,
            },
        ))
    }
}

impl Listen for TcpListener {
    type Stream = TcpStream;
    fn accept_one(&self) -> io::Result<(TcpStream, Peer)> {
        let (stream, addr) = self.accept()?;
        Ok((stream, Peer::Remote(addr.ip())))
    }
}

/// A client's connection, used through `&self` as `UnixStream` and
/// `TcpStream` allow.
trait Connection: AsRawFd + Send + 'static {
    fn set_nonblocking(&self, on: bool) -> io::Result<()>;
    fn read_some(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn write_some(&self, buf: &[u8]) -> io::Result<usize>;
    fn shutdown_write(&self);
}

macro_rules! connection {
    ($stream:ty) => {
        impl Connection for $stream {
            fn set_nonblocking(&self, on: bool) -> io::Result<()> {
                <$stream>::set_nonblocking(self, on)
            }
            fn read_some(&self, buf: &mut [u8]) -> io::Result<usize> {
                (&*self).read(buf)
            }
            fn write_some(&self, buf: &[u8]) -> io::Result<usize> {
                (&*self).write(buf)
            }
            fn shutdown_write(&self) {
                let _ = self.shutdown(std::net::Shutdown::Write);
            }
        }
    };
}
connection!(UnixStream);
connection!(TcpStream);

/// Most of a remote listener's [`MAX_CLIENTS`] slots one peer may hold at
/// once, so that one host cannot take them all: a Prometheus server needs
/// one.
pub const MAX_CLIENTS_PER_PEER: usize = 4;

/// Where a remote peer's connections are counted: its IPv4 address, or
/// the /64 of its IPv6 address (one host commonly has a whole /64 to pick
/// addresses from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    V4(Ipv4Addr),
    V6Prefix(u64),
}

impl PeerKey {
    fn of(ip: IpAddr) -> PeerKey {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        match ip {
            IpAddr::V4(v4) => PeerKey::V4(v4),
            IpAddr::V6(v6) => PeerKey::V6Prefix((u128::from(v6) >> 64) as u64),
        }
    }
}

/// Connections being served per remote peer.
type PeerCounts = Arc<Mutex<HashMap<PeerKey, usize>>>;

/// Which connections a listener takes, before the count of all clients.
enum Admission {
    /// The API socket: the peers whose uid the policy allows.
    Uids(PeerPolicy),
    /// A remote `--metrics-addr`: at most [`MAX_CLIENTS_PER_PEER`] per
    /// peer.
    PerAddress(PeerCounts),
    /// A loopback `--metrics-addr`: every client is on this host.
    Any,
}

fn start<L: Listen>(
    listener: L,
    file: Option<SocketFile>,
    context: Arc<dyn Routes>,
    service: Service,
    admission: Admission,
    limits: Limits,
    name: &str,
) -> Result<ControlServer> {
    let stop =
        Arc::new(EventFd::new(libc::EFD_NONBLOCK).context("cannot create the API's stop eventfd")?);
    let shared = Arc::new(Shared {
        stop: stop.clone(),
        context,
        service,
        admission,
        refusals: GuestLog::default(),
        limits,
    });
    let client_name = format!("{name}-client");
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // Its client threads inherit the filter and narrow it to theirs.
            crate::seccomp::install_or_exit(seccomp_kinds(shared.service).0);
            accept_loop(&listener, &shared, &client_name)
        })
        .with_context(|| format!("cannot spawn the {name} listener's thread"))?;
    Ok(ControlServer {
        stop,
        thread: Some(thread),
        _file: file,
    })
}

/// The seccomp filters of a listener's thread and of its clients'
/// threads: a metrics client reaches neither the engine nor the disks.
fn seccomp_kinds(service: Service) -> (crate::seccomp::ThreadKind, crate::seccomp::ThreadKind) {
    use crate::seccomp::ThreadKind;
    match service {
        Service::Api => (ThreadKind::Control, ThreadKind::ApiClient),
        Service::MetricsOnly => (ThreadKind::Metrics, ThreadKind::MetricsClient),
    }
}

/// What the accepting thread and every client thread share.
struct Shared {
    stop: Arc<EventFd>,
    context: Arc<dyn Routes>,
    service: Service,
    admission: Admission,
    /// Rate limit of the messages about refused clients: whoever may
    /// connect decides how often.
    refusals: GuestLog,
    limits: Limits,
}

/// The serving threads; they stop (and the socket file is removed) when
/// this is dropped.
pub struct ControlServer {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    _file: Option<SocketFile>,
}

impl ControlServer {
    /// Stops serving and removes the socket file. `wait` joins the threads
    /// (finishing the requests in progress); without it they are left to
    /// end on their own, for when a request might be stuck on guest memory
    /// that will never be served (a failed VM). Threads left so do not keep
    /// the process alive: it ends when `main` returns.
    pub fn shutdown(mut self, wait: bool) {
        self.stop_threads(wait);
    }

    fn stop_threads(&mut self, wait: bool) {
        // Never read, so it stays readable and every later poll sees it.
        if let Err(e) = self.stop.write(1) {
            eprintln!("hugevmm: API: cannot stop its threads: {e}");
            return;
        }
        if let Some(thread) = self.thread.take() {
            if wait {
                // The accepting thread joins the client threads. One that
                // a seccomp filter stopped (a thread that started late
                // may trap after the end began) is parked for good: the
                // wait ends then, and the thread is left to the exit.
                while !thread.is_finished() {
                    if crate::seccomp::trapped_message().is_some() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                let _ = thread.join();
            }
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop_threads(true);
    }
}

enum Wake {
    Ready,
    Stop,
    TimedOut,
}

/// Sleeps until `fd` has one of `events` (or hangs up), `stop` is
/// signalled, or `deadline` (if any) passes.
fn wait_for(
    fd: RawFd,
    events: libc::c_short,
    stop: &EventFd,
    deadline: Option<Instant>,
) -> io::Result<Wake> {
    let mut fds = [
        libc::pollfd {
            fd,
            events,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Wake::TimedOut);
                }
                // Rounded up: poll would otherwise wake just before the
                // deadline and spin on a zero timeout.
                i32::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
            }
        };
        // SAFETY: `fds` is an array of two initialized pollfd that lives
        // across the call, and its length is passed with it; poll only
        // writes the `revents` fields.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents != 0 {
            return Ok(Wake::Stop);
        }
        // POLLHUP and POLLERR count as ready: the read or write reports them.
        if fds[0].revents != 0 {
            return Ok(Wake::Ready);
        }
    }
}

/// A client's slot: decrements the count of clients being served (and
/// its peer's, on a remote listener) when its thread ends (or is never
/// started).
struct Served {
    all: Arc<AtomicUsize>,
    peer: Option<(PeerCounts, PeerKey)>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.all.fetch_sub(1, Ordering::AcqRel);
        if let Some((counts, key)) = &self.peer {
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = counts.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(key);
                }
            }
        }
    }
}

/// Whether the listener takes a connection from `peer`: the peer's slot
/// (counted on a remote listener), or the response that refuses it.
fn admit(shared: &Shared, peer: &Peer) -> Result<Option<(PeerCounts, PeerKey)>, Response> {
    match (&shared.admission, peer) {
        (Admission::Uids(policy), Peer::Local { uid, pid }) => {
            if policy.allows(*uid) {
                return Ok(None);
            }
            if shared.refusals.allow("refused API client") {
                eprintln!(
                    "hugevmm: API: refused a client running as uid {uid} (pid {pid}): not the uid that started the VM, root or one --api-allow-uid names (at most {} such messages at once, then 1 per {} s)",
                    crate::ratelimit::BURST,
                    crate::ratelimit::REFILL.as_secs()
                );
            }
            Err(Response::error(403, policy.refusal(*uid)))
        }
        (Admission::PerAddress(counts), Peer::Remote(ip)) => {
            let key = PeerKey::of(*ip);
            let mut held = counts.lock().unwrap_or_else(|e| e.into_inner());
            let n = held.entry(key).or_insert(0);
            if *n >= MAX_CLIENTS_PER_PEER {
                return Err(Response::error(
                    503,
                    format!("too many connections from {ip} ({MAX_CLIENTS_PER_PEER}, the most one peer may hold of the {} client slots); try again when one has closed", shared.limits.max_clients),
                ));
            }
            *n += 1;
            Ok(Some((counts.clone(), key)))
        }
        (Admission::Any, _) => Ok(None),
        // A listener's peers are all of its own kind.
        (Admission::Uids(_), Peer::Remote(_)) | (Admission::PerAddress(_), Peer::Local { .. }) => {
            Err(Response::error(
                500,
                "a peer of the wrong kind for this listener".to_string(),
            ))
        }
    }
}

fn accept_loop<L: Listen>(listener: &L, shared: &Arc<Shared>, client_name: &str) {
    let served = Arc::new(AtomicUsize::new(0));
    let refusing = Arc::new(AtomicUsize::new(0));
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    loop {
        match wait_for(listener.as_raw_fd(), libc::POLLIN, &shared.stop, None) {
            Ok(Wake::Ready) => {}
            Ok(Wake::Stop) | Ok(Wake::TimedOut) => break,
            Err(e) => {
                eprintln!("hugevmm: API: poll failed, no more requests: {e}");
                break;
            }
        }
        let (stream, peer) = match listener.accept_one() {
            Ok(accepted) => accepted,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                ) =>
            {
                continue
            }
            Err(e) => {
                eprintln!("hugevmm: API: accept failed, no more requests: {e}");
                break;
            }
        };
        // Ended threads have nothing left to join.
        clients.retain(|client| !client.is_finished());
        // Who the peer is first: a refused one learns nothing else, and
        // holds none of the slots of those served.
        let (job, guard) = match admit(shared, &peer) {
            Ok(peer_slot) => {
                let max_clients = shared.limits.max_clients;
                let guard = Served {
                    all: served.clone(),
                    peer: peer_slot,
                };
                if served.fetch_add(1, Ordering::AcqRel) >= max_clients {
                    drop(guard);
                    say_and_close(
                        &stream,
                        &Response::error(
                            503,
                            format!("too many API clients ({max_clients}) are connected; try again when one has disconnected"),
                        ),
                    );
                    continue;
                }
                (Job::Serve, guard)
            }
            Err(refusal) => {
                let guard = Served {
                    all: refusing.clone(),
                    peer: None,
                };
                if refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
                    // Past the few answered at once: closed unanswered.
                    drop(guard);
                    say_and_close(&stream, &refusal);
                    continue;
                }
                (Job::Refuse(refusal), guard)
            }
        };
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(client_name.into())
            .spawn(move || {
                crate::seccomp::install_or_exit(seccomp_kinds(thread_shared.service).1);
                let _guard = guard;
                client_thread(stream, &thread_shared, job);
            });
        match spawned {
            Ok(client) => clients.push(client),
            // The client sees its connection closed without a response.
            Err(e) => eprintln!("hugevmm: API: cannot start a thread for a client: {e}"),
        }
    }
    // Every client thread sees the same stop. Joined here so that when
    // `shutdown(wait=true)` returns no thread holds the context (nor the
    // swap engine in it).
    for client in clients {
        let _ = client.join();
    }
}

/// What a client thread does with its client.
enum Job {
    /// Serves its requests.
    Serve,
    /// Answers this refusal and closes, as after any error: the client
    /// sees the answer (a close at once races a client's check of its
    /// connection: curl then reports that it could not connect).
    Refuse(Response),
}

/// Most refused clients answered at once; more are closed unanswered, so
/// that whoever is refused cannot hold threads.
const MAX_REFUSING: usize = 4;

fn client_thread<S: Connection>(stream: S, shared: &Shared, job: Job) {
    let served = match job {
        Job::Serve => serve_client(&stream, shared),
        Job::Refuse(response) => refuse(&stream, shared, &response),
    };
    match served {
        Ok(ClientEnd::Disconnected | ClientEnd::Stop) => {}
        // A client that goes away or stops reading is its own problem.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::TimedOut
            ) => {}
        Err(e) => eprintln!("hugevmm: API: client dropped: {e}"),
    }
}

/// Answers a refused client and closes: the answer, then what the client
/// still sends is read and dropped for a bounded time ([`linger`]).
fn refuse<S: Connection>(
    stream: &S,
    shared: &Shared,
    response: &Response,
) -> io::Result<ClientEnd> {
    stream.set_nonblocking(true)?;
    if let Some(end) = send(stream, &response.to_bytes(true), shared)? {
        return Ok(end);
    }
    linger(stream, shared);
    Ok(ClientEnd::Disconnected)
}

/// Sends one response to a client about to be closed, without waiting:
/// a client that does not read loses it.
fn say_and_close<S: Connection>(stream: &S, response: &Response) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = stream.write_some(&response.to_bytes(true));
    }
}

enum ClientEnd {
    Disconnected,
    Stop,
}

/// Writes `bytes`; the whole response gets the write timeout. Stops early
/// (the response lost) if the VM ends meanwhile.
fn send<S: Connection>(stream: &S, bytes: &[u8], shared: &Shared) -> io::Result<Option<ClientEnd>> {
    let deadline = Instant::now() + shared.limits.write_timeout;
    let mut rest = bytes;
    while !rest.is_empty() {
        match stream.write_some(rest) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                match wait_for(
                    stream.as_raw_fd(),
                    libc::POLLOUT,
                    &shared.stop,
                    Some(deadline),
                )? {
                    Wake::Ready => {}
                    Wake::Stop => return Ok(Some(ClientEnd::Stop)),
                    Wake::TimedOut => return Err(ErrorKind::TimedOut.into()),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// After a response that ends the connection: says no more, then reads
/// and drops what the client still sends, for a bounded time and amount,
/// so that closing with its bytes unread does not reset the connection
/// before it has read the response.
fn linger<S: Connection>(stream: &S, shared: &Shared) {
    stream.shutdown_write();
    let deadline = Instant::now() + LINGER;
    let mut dropped = 0;
    let mut chunk = [0u8; 4096];
    while dropped < LINGER_BYTES {
        match wait_for(
            stream.as_raw_fd(),
            libc::POLLIN,
            &shared.stop,
            Some(deadline),
        ) {
            Ok(Wake::Ready) => {}
            _ => return,
        }
        match stream.read_some(&mut chunk) {
            Ok(0) => return,
            Ok(n) => dropped += n,
            Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => {}
            Err(_) => return,
        }
    }
}

/// Answers one client's requests until it disconnects, idles past the
/// timeout, asks to close, sends something that is no request, or the VM
/// ends. A request cut short by a disconnect is not run: half of a body
/// is a different value, or none.
fn serve_client<S: Connection>(stream: &S, shared: &Shared) -> io::Result<ClientEnd> {
    // Non-blocking, so that every wait is a poll that also watches `stop`.
    stream.set_nonblocking(true)?;
    let idle_timeout = shared.limits.idle_timeout;
    // The whole request is timed, not each read: a byte every so often
    // must not keep the connection for ever.
    let mut deadline = Instant::now() + idle_timeout;
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        loop {
            match http::parse(&pending) {
                Ok(Parsed::Complete(request, used)) => {
                    pending.drain(..used);
                    let response = shared.context.respond(shared.service, &request);
                    if let Some(end) = send(stream, &response.to_bytes(request.close), shared)? {
                        return Ok(end);
                    }
                    if request.close {
                        linger(stream, shared);
                        return Ok(ClientEnd::Disconnected);
                    }
                    deadline = Instant::now() + idle_timeout;
                }
                Ok(Parsed::Partial) => break,
                Err(e) => {
                    // Nobody knows where the next request would start.
                    let response = Response::error(e.status(), e.to_string());
                    let end = send(stream, &response.to_bytes(true), shared)?;
                    linger(stream, shared);
                    return Ok(end.unwrap_or(ClientEnd::Disconnected));
                }
            }
        }
        match wait_for(
            stream.as_raw_fd(),
            libc::POLLIN,
            &shared.stop,
            Some(deadline),
        )? {
            Wake::Ready => {}
            Wake::Stop => return Ok(ClientEnd::Stop),
            Wake::TimedOut => {
                say_and_close(
                    stream,
                    &Response::error(
                        408,
                        format!(
                            "no complete request within {} s; closing the connection (send the whole request at once, as curl and `hugevmm ctl` do)",
                            idle_timeout.as_secs_f64()
                        ),
                    ),
                );
                return Ok(ClientEnd::Disconnected);
            }
        }
        match stream.read_some(&mut chunk) {
            Ok(0) => return Ok(ClientEnd::Disconnected),
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::context::tests::context;
    use crate::control::http::{MAX_BODY_BYTES, MAX_HEAD_BYTES};
    use serde_json::Value;

    fn temp_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("hugevmm-api-{}-{tag}.sock", std::process::id()))
    }

    /// How long a test client waits for a response or the end of its
    /// connection before the test fails: not a measurement, only a bound
    /// so that a server that blocks fails the test instead of hanging it.
    const GUARD: Duration = Duration::from_secs(60);

    /// Limits that never drop a client for idling during a test.
    const PATIENT: Limits = Limits {
        idle_timeout: Duration::from_secs(3600),
        ..Limits::DEFAULT
    };

    struct Client {
        stream: UnixStream,
        buffered: Vec<u8>,
    }

    impl Client {
        fn connect(path: &Path) -> Self {
            let stream = UnixStream::connect(path).unwrap();
            stream.set_read_timeout(Some(GUARD)).unwrap();
            Self {
                stream,
                buffered: Vec::new(),
            }
        }
        fn send(&mut self, bytes: &[u8]) {
            self.stream.write_all(bytes).unwrap();
        }
        /// The next response: status and JSON body.
        fn response(&mut self) -> (u16, Value) {
            loop {
                let mut headers = [httparse::EMPTY_HEADER; 16];
                let mut parsed = httparse::Response::new(&mut headers);
                if let Ok(httparse::Status::Complete(head)) = parsed.parse(&self.buffered) {
                    let length: usize = parsed
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
                        .unwrap();
                    if self.buffered.len() >= head + length {
                        let status = parsed.code.unwrap();
                        let body: Value =
                            serde_json::from_slice(&self.buffered[head..head + length]).unwrap();
                        self.buffered.drain(..head + length);
                        return (status, body);
                    }
                }
                let mut chunk = [0u8; 4096];
                let n = self.stream.read(&mut chunk).expect("a response");
                assert!(
                    n > 0,
                    "closed before a whole response: {:?}",
                    String::from_utf8_lossy(&self.buffered)
                );
                self.buffered.extend_from_slice(&chunk[..n]);
            }
        }
        fn ask(&mut self, method: &str, path: &str, body: &str) -> (u16, Value) {
            self.send(
                format!(
                    "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
            self.response()
        }
        /// Asserts that the server closed the connection. A server closing
        /// with unread bytes from us makes Linux report a reset rather
        /// than the end: both count.
        fn closed(&mut self) {
            let mut rest = Vec::new();
            match self.stream.read_to_end(&mut rest) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
                Err(e) => panic!("the connection stayed open: {e}"),
            }
        }
    }

    fn serve(tag: &str, limits: Limits) -> (ControlServer, PathBuf) {
        let path = temp_path(tag);
        let _ = std::fs::remove_file(&path);
        let server = ControlSocket::bind(&path, &[])
            .unwrap()
            .serve_with(Arc::new(context(true)), limits)
            .unwrap();
        (server, path)
    }

    #[test]
    fn serves_requests_in_turn_and_survives_garbage() {
        let (server, path) = serve("serve", Limits::DEFAULT);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let mut c = Client::connect(&path);
        assert_eq!(c.ask("GET", "/vm", "").0, 200);
        let (status, r) = c.ask("PUT", "/balloon", r#"{"target_bytes": 4194304}"#);
        assert_eq!((status, r["target_pages"].as_u64()), (200, Some(1024)));
        // Two requests in one write, one split across writes.
        c.send(b"GET /balloon HTTP/1.1\r\n\r\nGET /sta");
        assert_eq!(c.response().1["target_pages"], 1024);
        c.send(b"ts HTTP/1.1\r\n\r\n");
        assert_eq!(c.response().1["balloon"]["target_pages"], 1024);
        // Bad values and unknown routes keep the connection.
        assert_eq!(c.ask("PUT", "/balloon", "{}").0, 400);
        assert_eq!(c.ask("GET", "/nope", "").0, 404);
        assert_eq!(c.ask("POST", "/vm", "").0, 405);
        assert_eq!(c.ask("GET", "/vm", "").0, 200);
        // A malformed request gets a 400 with a reason and the close.
        c.send(b"stats\n\r\n\r\n");
        let (status, r) = c.response();
        assert_eq!(status, 400, "{r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("malformed"),
            "{r}"
        );
        c.closed();

        // An oversized body: 413 before any of it is read.
        let mut c = Client::connect(&path);
        c.send(
            format!(
                "PUT /balloon HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
                MAX_BODY_BYTES + 1
            )
            .as_bytes(),
        );
        c.send(&vec![b' '; 4096]);
        assert_eq!(c.response().0, 413);
        c.closed();
        // A runaway head: 431.
        let mut c = Client::connect(&path);
        c.send(format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD_BYTES)).as_bytes());
        assert_eq!(c.response().0, 431);
        c.closed();

        // A client that dies mid-request changes nothing.
        let mut c = Client::connect(&path);
        c.send(b"PUT /balloon HTTP/1.1\r\nContent-Length: 30\r\n\r\n{\"target_bytes\": 8");
        drop(c);
        // One that never reads its responses does not stop the next one.
        let mut c = Client::connect(&path);
        c.send(b"GET /stats HTTP/1.1\r\n\r\nGET /stats HTTP/1.1\r\n\r\n");
        c.stream.shutdown(std::net::Shutdown::Both).unwrap();
        drop(c);
        let mut c = Client::connect(&path);
        assert_eq!(c.ask("GET", "/balloon", "").1["target_pages"], 1024);
        // Connection: close is honoured.
        c.send(b"GET /vm HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert_eq!(c.response().0, 200);
        c.closed();

        // The VM's end wakes the thread while this client stays connected.
        let mut c = Client::connect(&path);
        assert_eq!(c.ask("GET", "/vm", "").0, 200);
        server.shutdown(true);
        assert!(!path.exists(), "the socket file is removed");
        c.closed();
    }

    #[test]
    fn an_idle_client_does_not_block_another() {
        let (server, path) = serve("idle", PATIENT);
        let mut idle = Client::connect(&path);
        assert_eq!(idle.ask("GET", "/vm", "").0, 200);
        let _silent = Client::connect(&path);
        let mut partial = Client::connect(&path);
        partial.send(b"GET /ballo");
        let mut other = Client::connect(&path);
        assert_eq!(
            other
                .ask("PUT", "/balloon", r#"{"target_bytes": 4194304}"#)
                .0,
            200
        );
        assert_eq!(idle.ask("GET", "/balloon", "").1["target_pages"], 1024);
        partial.send(b"on HTTP/1.1\r\n\r\n");
        assert_eq!(partial.response().1["target_pages"], 1024);
        server.shutdown(true);
    }

    #[test]
    fn silent_and_trickling_clients_are_dropped() {
        let limits = Limits {
            idle_timeout: Duration::from_millis(300),
            ..Limits::DEFAULT
        };
        let (server, path) = serve("trickle", limits);
        let mut silent = Client::connect(&path);
        let (status, r) = silent.response();
        assert_eq!(status, 408, "{r}");
        assert!(r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no complete request"));
        silent.closed();

        let mut trickling = Client::connect(&path);
        assert_eq!(trickling.ask("GET", "/vm", "").0, 200);
        let mut writer = trickling.stream.try_clone().unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trickle_done = done.clone();
        let trickler = std::thread::spawn(move || {
            while !trickle_done.load(Ordering::Relaxed) && writer.write_all(b"G").is_ok() {
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let (status, _) = trickling.response();
        done.store(true, Ordering::Relaxed);
        // Either the head grew past its bound first or the time ran out.
        assert!(matches!(status, 408 | 431 | 400), "{status}");
        trickling.closed();
        trickler.join().unwrap();

        let mut prompt = Client::connect(&path);
        assert_eq!(prompt.ask("GET", "/vm", "").0, 200);
        server.shutdown(true);
    }

    #[test]
    fn past_max_clients_one_more_gets_a_503() {
        let (server, path) = serve("max", PATIENT);
        let mut clients: Vec<Client> = (0..MAX_CLIENTS)
            .map(|_| {
                let mut c = Client::connect(&path);
                assert_eq!(c.ask("GET", "/vm", "").0, 200);
                c
            })
            .collect();
        let mut extra = Client::connect(&path);
        let (status, r) = extra.response();
        assert_eq!(status, 503, "{r}");
        assert!(r["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("too many API clients ({MAX_CLIENTS})")));
        extra.closed();
        for c in &mut clients {
            assert_eq!(c.ask("GET", "/balloon", "").0, 200);
        }
        // Once one leaves, a new client is served again (its thread ends
        // a moment after the disconnect: retry, counting tries, not time).
        drop(clients.pop());
        let mut tries = 0;
        loop {
            let mut c = Client::connect(&path);
            // While the slot is still taken the server answers 503 and
            // closes at once, possibly before this write (EPIPE): a try.
            if c.stream.write_all(b"GET /vm HTTP/1.1\r\n\r\n").is_ok() && c.response().0 == 200 {
                break;
            }
            tries += 1;
            assert!(tries < 10_000, "the freed slot is never reused");
            std::thread::sleep(Duration::from_millis(1));
        }
        server.shutdown(true);
    }

    #[test]
    fn stop_ends_every_client() {
        let (server, path) = serve("stop", PATIENT);
        let mut idle = Client::connect(&path);
        assert_eq!(idle.ask("GET", "/vm", "").0, 200);
        let mut partial = Client::connect(&path);
        partial.send(b"GET /st");
        // Never reads: its thread ends up waiting to write a response.
        let mut flooding = Client::connect(&path);
        flooding.send(&b"GET /stats HTTP/1.1\r\n\r\n".repeat(4000));
        let (joined_tx, joined) = std::sync::mpsc::channel();
        let stopper = std::thread::spawn(move || {
            server.shutdown(true);
            joined_tx.send(()).unwrap();
        });
        joined
            .recv_timeout(GUARD)
            .expect("shutdown(wait=true) returns while clients are connected");
        stopper.join().unwrap();
        assert!(!path.exists());
        idle.closed();
        partial.closed();
        flooding.closed();
    }

    #[test]
    fn the_metrics_listener_serves_metrics_only() {
        let listener = MetricsListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = listener.serve(Arc::new(context(true))).unwrap();
        let get = |request: &str| {
            let mut stream = TcpStream::connect(addr).unwrap();
            stream.set_read_timeout(Some(GUARD)).unwrap();
            stream.write_all(request.as_bytes()).unwrap();
            let mut text = String::new();
            let _ = stream.read_to_string(&mut text);
            text
        };
        let metrics = get("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.contains("hugevmm_vcpus 2"), "{metrics}");
        for request in [
            "GET /vm HTTP/1.1\r\nConnection: close\r\n\r\n",
            "PUT /actions HTTP/1.1\r\nConnection: close\r\nContent-Length: 17\r\n\r\n{\"action\":\"quit\"}",
        ] {
            let reply = get(request);
            assert!(reply.starts_with("HTTP/1.1 404 Not Found\r\n"), "{reply}");
        }
        server.shutdown(true);
    }

    #[test]
    fn stale_sockets_are_replaced_live_ones_refused() {
        let path = temp_path("stale");
        let _ = std::fs::remove_file(&path);
        // Stale: bound, then the listener dropped (the file stays).
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let socket = ControlSocket::bind(&path, &[]).unwrap();
        // Live: the socket just bound listens.
        let err = ControlSocket::bind(&path, &[]).err().unwrap().to_string();
        assert!(err.contains("listens on this socket"), "{err}");
        drop(socket);
        assert!(!path.exists(), "an unserved socket is removed too");
        // Not a socket: refused, and left alone.
        std::fs::write(&path, "data").unwrap();
        let err = ControlSocket::bind(&path, &[]).err().unwrap().to_string();
        assert!(err.contains("is not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        std::fs::remove_file(&path).unwrap();
    }

    /// Sets the process's umask for the life of the guard. The umask is
    /// process-wide: the tests that change it take this lock so that they
    /// do not see each other's.
    struct Umask {
        old: libc::mode_t,
        _lock: std::sync::MutexGuard<'static, ()>,
    }

    impl Umask {
        fn set(mask: libc::mode_t) -> Umask {
            static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: umask only swaps the process's mask.
            let old = unsafe { libc::umask(mask) };
            Umask { old, _lock: lock }
        }
    }

    impl Drop for Umask {
        fn drop(&mut self) {
            // SAFETY: as in `set`.
            unsafe { libc::umask(self.old) };
        }
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn the_socket_file_is_owner_only_from_the_moment_it_is_bound() {
        // Whatever the umask lets through, the file is 0600 as bind makes
        // it: no moment in which others may connect.
        let path = temp_path("mode");
        let _ = std::fs::remove_file(&path);
        let listener = {
            let _umask = Umask::set(0);
            bind_owner_only(&path).unwrap()
        };
        assert_eq!(mode_of(&path), 0o600, "right after bind");
        drop(listener);
        std::fs::remove_file(&path).unwrap();
        // A umask that takes the owner's bits too: the owner still gets
        // them (it could not connect otherwise), nobody else does.
        let socket = {
            let _umask = Umask::set(0o277);
            ControlSocket::bind(&path, &[]).unwrap()
        };
        assert_eq!(mode_of(&path), 0o600);
        drop(socket);
        assert!(!path.exists());
    }

    #[test]
    fn a_client_of_another_uid_gets_a_403_and_allowed_ones_are_served() {
        // This process's uid is not in the list (the test runs as someone,
        // maybe root, who is neither 12345 nor 12346): refused.
        let me = effective_uid();
        assert!(me != 12345 && me != 12346);
        let path = temp_path("peer");
        let _ = std::fs::remove_file(&path);
        let policy = PeerPolicy {
            owner: 12345,
            allowed: vec![12345, 12346],
        };
        let server = ControlSocket::bind_for(&path, policy)
            .unwrap()
            .serve_with(Arc::new(context(true)), PATIENT)
            .unwrap();
        for _ in 0..3 {
            let mut c = Client::connect(&path);
            let (status, r) = c.ask("GET", "/vm", "");
            assert_eq!(status, 403, "{r}");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("runs as uid {me}"))
                    && message.contains(&format!("--api-allow-uid {me}"))
                    && message.contains("(12345)")
                    && message.contains("uid 12346 (--api-allow-uid)"),
                "{message}"
            );
            c.closed();
        }
        server.shutdown(true);
        // The owner and root always, and the uids given.
        let policy = PeerPolicy::with_owner(1000, &[2000, 1000]);
        assert_eq!(policy.allowed, [0, 1000, 2000]);
        assert!(policy.allows(0) && policy.allows(1000) && policy.allows(2000));
        assert!(!policy.allows(3000));
        // The real policy: this process is its owner and is served.
        let (server, path) = serve("peer-owner", PATIENT);
        let mut c = Client::connect(&path);
        assert_eq!(c.ask("GET", "/vm", "").0, 200);
        server.shutdown(true);
    }

    #[test]
    fn a_remote_metrics_listener_gives_one_peer_at_most_its_share() {
        // A client that asks once and stays connected; the status line's
        // start, or the error of a connection closed under it.
        let ask = |addr: SocketAddr| {
            let mut stream = TcpStream::connect(addr).unwrap();
            stream.set_read_timeout(Some(GUARD)).unwrap();
            let mut head = [0u8; 12];
            let got = stream
                .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
                .and_then(|_| stream.read_exact(&mut head))
                .map(|_| head.to_vec());
            (stream, got)
        };
        // Not loopback (all addresses): every client here comes from
        // 127.0.0.1, one peer.
        let listener = MetricsListener::bind("0.0.0.0:0".parse().unwrap()).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = listener
            .serve_with(Arc::new(context(true)), PATIENT)
            .unwrap();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut held: Vec<TcpStream> = (0..MAX_CLIENTS_PER_PEER)
            .map(|_| {
                let (stream, head) = ask(addr);
                assert_eq!(head.unwrap(), b"HTTP/1.1 200");
                stream
            })
            .collect();
        let mut extra = TcpStream::connect(addr).unwrap();
        extra.set_read_timeout(Some(GUARD)).unwrap();
        let mut text = String::new();
        let _ = extra.read_to_string(&mut text);
        assert!(text.starts_with("HTTP/1.1 503"), "{text}");
        assert!(
            text.contains(&format!(
                "too many connections from 127.0.0.1 ({MAX_CLIENTS_PER_PEER}"
            )),
            "{text}"
        );
        // One leaves: its share comes back (its thread ends a moment after
        // the close: retry, counting tries, not time).
        drop(held.pop());
        let mut tries = 0;
        loop {
            let (stream, head) = ask(addr);
            if head.is_ok_and(|h| h == b"HTTP/1.1 200") {
                held.push(stream);
                break;
            }
            tries += 1;
            assert!(tries < 10_000, "the peer's freed slot is never reused");
            std::thread::sleep(Duration::from_millis(1));
        }
        server.shutdown(true);

        // Loopback: all clients are on this host; only the total counts.
        let listener = MetricsListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = listener
            .serve_with(Arc::new(context(true)), PATIENT)
            .unwrap();
        let held: Vec<TcpStream> = (0..MAX_CLIENTS_PER_PEER + 2)
            .map(|_| {
                let (stream, head) = ask(addr);
                assert_eq!(head.unwrap(), b"HTTP/1.1 200");
                stream
            })
            .collect();
        drop(held);
        server.shutdown(true);
    }

    #[test]
    fn peers_are_counted_by_ipv4_address_or_ipv6_64() {
        let key = |s: &str| PeerKey::of(s.parse().unwrap());
        assert_eq!(key("192.0.2.1"), key("::ffff:192.0.2.1"));
        assert_ne!(key("192.0.2.1"), key("192.0.2.2"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }

    #[test]
    fn a_path_taken_over_is_left_alone() {
        let path = temp_path("takeover");
        let _ = std::fs::remove_file(&path);
        let socket = ControlSocket::bind(&path, &[]).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "someone else's").unwrap();
        drop(socket);
        assert!(path.exists());
        std::fs::remove_file(&path).unwrap();
    }
}

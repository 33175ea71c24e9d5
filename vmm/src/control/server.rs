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
use anyhow::{bail, Context, Result};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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

/// A bound API socket, not served yet.
pub struct ControlSocket {
    listener: UnixListener,
    file: SocketFile,
}

impl ControlSocket {
    /// Creates the socket at `path` (mode 0600: whoever can connect can
    /// resize the guest's memory), replacing a stale one.
    pub fn bind(path: &Path) -> Result<Self> {
        clear_stale(path)?;
        let shown = path.display();
        let listener = UnixListener::bind(path)
            .with_context(|| format!("cannot create the API socket --api-socket {shown}"))?;
        let meta = std::fs::symlink_metadata(path)
            .with_context(|| format!("--api-socket {shown}: the socket vanished"))?;
        let file = SocketFile {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).with_context(
            || format!("--api-socket {shown}: cannot restrict the socket to its owner"),
        )?;
        // poll says when a client waits; the accept must not block if it
        // gave up in between.
        listener
            .set_nonblocking(true)
            .context("cannot make the API socket non-blocking")?;
        Ok(Self { listener, file })
    }

    /// Starts the threads that serve every route with `context`.
    pub fn serve(self, context: Arc<ControlContext>) -> Result<ControlServer> {
        self.serve_with(context, Limits::DEFAULT)
    }

    fn serve_with(self, context: Arc<ControlContext>, limits: Limits) -> Result<ControlServer> {
        start(
            self.listener,
            Some(self.file),
            context,
            Service::Api,
            limits,
            "api",
        )
    }
}

/// A bound `--metrics-addr` listener, not served yet.
pub struct MetricsListener {
    listener: TcpListener,
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
        Ok(Self { listener })
    }

    /// The address bound (the port the kernel chose for port 0).
    #[cfg(test)]
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Starts the threads that serve `GET /metrics` with `context`.
    pub fn serve(self, context: Arc<ControlContext>) -> Result<ControlServer> {
        start(
            self.listener,
            None,
            context,
            Service::MetricsOnly,
            Limits::DEFAULT,
            "metrics",
        )
    }
}

/// What the listeners and streams of both kinds have in common.
trait Listen: AsRawFd + Send + 'static {
    type Stream: Connection;
    fn accept_one(&self) -> io::Result<Self::Stream>;
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
    ($listener:ty, $stream:ty) => {
        impl Listen for $listener {
            type Stream = $stream;
            fn accept_one(&self) -> io::Result<$stream> {
                self.accept().map(|(stream, _)| stream)
            }
        }
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
connection!(UnixListener, UnixStream);
connection!(TcpListener, TcpStream);

fn start<L: Listen>(
    listener: L,
    file: Option<SocketFile>,
    context: Arc<ControlContext>,
    service: Service,
    limits: Limits,
    name: &str,
) -> Result<ControlServer> {
    let stop =
        Arc::new(EventFd::new(libc::EFD_NONBLOCK).context("cannot create the API's stop eventfd")?);
    let shared = Arc::new(Shared {
        stop: stop.clone(),
        context,
        service,
        limits,
    });
    let client_name = format!("{name}-client");
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // Its client threads inherit the filter.
            crate::seccomp::install_or_exit(crate::seccomp::ThreadKind::Control);
            accept_loop(&listener, &shared, &client_name)
        })
        .with_context(|| format!("cannot spawn the {name} listener's thread"))?;
    Ok(ControlServer {
        stop,
        thread: Some(thread),
        _file: file,
    })
}

/// What the accepting thread and every client thread share.
struct Shared {
    stop: Arc<EventFd>,
    context: Arc<ControlContext>,
    service: Service,
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
                // The accepting thread joins the client threads.
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

/// Decrements the count of clients being served when a client thread ends
/// (or is never started).
struct Served(Arc<AtomicUsize>);

impl Drop for Served {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop<L: Listen>(listener: &L, shared: &Arc<Shared>, client_name: &str) {
    let served = Arc::new(AtomicUsize::new(0));
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
        let stream = match listener.accept_one() {
            Ok(stream) => stream,
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
        let max_clients = shared.limits.max_clients;
        if served.load(Ordering::Acquire) >= max_clients {
            say_and_close(
                &stream,
                &Response::error(
                    503,
                    format!("too many API clients ({max_clients}) are connected; try again when one has disconnected"),
                ),
            );
            continue;
        }
        served.fetch_add(1, Ordering::AcqRel);
        let guard = Served(served.clone());
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(client_name.into())
            .spawn(move || {
                let _guard = guard;
                client_thread(stream, &thread_shared);
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

fn client_thread<S: Connection>(stream: S, shared: &Shared) {
    match serve_client(&stream, shared) {
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
                    let response = api::handle(&shared.context, shared.service, &request);
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
        let server = ControlSocket::bind(&path)
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
        let socket = ControlSocket::bind(&path).unwrap();
        // Live: the socket just bound listens.
        let err = ControlSocket::bind(&path).err().unwrap().to_string();
        assert!(err.contains("listens on this socket"), "{err}");
        drop(socket);
        assert!(!path.exists(), "an unserved socket is removed too");
        // Not a socket: refused, and left alone.
        std::fs::write(&path, "data").unwrap();
        let err = ControlSocket::bind(&path).err().unwrap().to_string();
        assert!(err.contains("is not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_path_taken_over_is_left_alone() {
        let path = temp_path("takeover");
        let _ = std::fs::remove_file(&path);
        let socket = ControlSocket::bind(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "someone else's").unwrap();
        drop(socket);
        assert!(path.exists());
        std::fs::remove_file(&path).unwrap();
    }
}

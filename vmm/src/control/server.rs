//! The control socket (`hugevmm run --api-socket PATH`): a Unix stream
//! socket, one JSON reply line per command line.
//!
//! The socket is bound before the VM is built, so that a path in use fails
//! the run before anything is allocated, and served once the vCPUs start;
//! a client that connects in between waits in the listen backlog.
//!
//! One `control` thread accepts connections and hands each to a thread of
//! its own (`control-client`), so that a client that is slow, silent or
//! stuck in a long command (`pageout`) never delays another. The limits
//! keep any one client, or many, from holding the VMM:
//! - at most [`MAX_CLIENTS`] connections are served at once; one more gets
//!   a single error line and is closed;
//! - a client has [`IDLE_TIMEOUT`] from connecting, or from its last reply,
//!   to send a complete line (timed over the whole line, so that trickling
//!   a byte at a time does not extend it), or it gets an error line and is
//!   dropped;
//! - a reply must be taken within [`WRITE_TIMEOUT`], or the client is
//!   dropped.
//!
//! Every thread sleeps in `poll` on its socket and one stop eventfd, so
//! the VM's end wakes them all at once; a command in progress is finished
//! first. Joining the `control` thread joins the client threads.

use super::command::MAX_LINE_BYTES;
use super::context::{error_reply, ControlContext};
use anyhow::{bail, Context, Result};
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

/// Most clients served at once. Each holds a thread (and, in a command, a
/// share of the VMM's attention); a few people or scripts watching one VM
/// need far fewer.
pub const MAX_CLIENTS: usize = 16;

/// How long a client may take to send a complete command line, from
/// connecting or from its last reply; past it the client is dropped, so
/// that connections left open by crashed or hostile clients do not use up
/// [`MAX_CLIENTS`]. `hugevmm ctl` sends its line at once.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a reply may wait for a client that does not read; past it
/// the client is dropped so that its thread does not wait for ever.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A bound control socket, not served yet.
pub struct ControlSocket {
    listener: UnixListener,
    file: SocketFile,
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

impl ControlSocket {
    /// Creates the socket at `path` (mode 0600: whoever can connect can
    /// resize the guest's memory), replacing a stale one.
    pub fn bind(path: &Path) -> Result<Self> {
        clear_stale(path)?;
        let shown = path.display();
        let listener = UnixListener::bind(path)
            .with_context(|| format!("cannot create the control socket --api-socket {shown}"))?;
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
            .context("cannot make the control socket non-blocking")?;
        Ok(Self { listener, file })
    }

    /// Starts the threads that serve the socket with `context`.
    pub fn serve(self, context: ControlContext) -> Result<ControlServer> {
        self.serve_with(context, Limits::DEFAULT)
    }

    fn serve_with(self, context: ControlContext, limits: Limits) -> Result<ControlServer> {
        let stop = Arc::new(
            EventFd::new(libc::EFD_NONBLOCK)
                .context("cannot create the control socket's eventfd")?,
        );
        let listener = self.listener;
        let shared = Arc::new(Shared {
            stop: stop.clone(),
            context,
            limits,
        });
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(&listener, &shared))
            .context("cannot spawn the control socket thread")?;
        Ok(ControlServer {
            stop,
            thread: Some(thread),
            _file: self.file,
        })
    }
}

/// What the accepting thread and every client thread share.
struct Shared {
    stop: Arc<EventFd>,
    context: ControlContext,
    limits: Limits,
}

/// The serving threads; they stop (and the socket file is removed) when
/// this is dropped.
pub struct ControlServer {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    _file: SocketFile,
}

impl ControlServer {
    /// Stops serving and removes the socket file. `wait` joins the threads
    /// (finishing the commands in progress); without it they are left to
    /// end on their own, for when a command might be stuck on guest memory
    /// that will never be served (a failed VM). Threads left so do not keep
    /// the process alive: it ends when `main` returns.
    pub fn shutdown(mut self, wait: bool) {
        self.stop_threads(wait);
    }

    fn stop_threads(&mut self, wait: bool) {
        // Never read, so it stays readable and every later poll sees it.
        if let Err(e) = self.stop.write(1) {
            eprintln!("hugevmm: control socket: cannot stop its threads: {e}");
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

fn accept_loop(listener: &UnixListener, shared: &Arc<Shared>) {
    let served = Arc::new(AtomicUsize::new(0));
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    loop {
        match wait_for(listener.as_raw_fd(), libc::POLLIN, &shared.stop, None) {
            Ok(Wake::Ready) => {}
            Ok(Wake::Stop) | Ok(Wake::TimedOut) => break,
            Err(e) => {
                eprintln!("hugevmm: control socket: poll failed, no more commands: {e}");
                break;
            }
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                ) =>
            {
                continue
            }
            Err(e) => {
                eprintln!("hugevmm: control socket: accept failed, no more commands: {e}");
                break;
            }
        };
        // Ended threads have nothing left to join.
        clients.retain(|client| !client.is_finished());
        let max_clients = shared.limits.max_clients;
        if served.load(Ordering::Acquire) >= max_clients {
            say_and_close(
                &stream,
                &format!(
                    "too many control clients ({max_clients}) are connected; try again when one has disconnected"
                ),
            );
            continue;
        }
        served.fetch_add(1, Ordering::AcqRel);
        let guard = Served(served.clone());
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("control-client".into())
            .spawn(move || {
                let _guard = guard;
                client_thread(stream, &thread_shared);
            });
        match spawned {
            Ok(client) => clients.push(client),
            // The client sees its connection closed without a reply.
            Err(e) => eprintln!("hugevmm: control socket: cannot start a thread for a client: {e}"),
        }
    }
    // Every client thread sees the same stop. Joined here so that when
    // `shutdown(wait=true)` returns no thread holds the context (nor the
    // swap engine in it).
    for client in clients {
        let _ = client.join();
    }
}

fn client_thread(stream: UnixStream, shared: &Shared) {
    match serve_client(&stream, shared) {
        Ok(ClientEnd::Disconnected | ClientEnd::Stop) => {}
        // A client that goes away or stops reading is its own problem.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::TimedOut
            ) => {}
        Err(e) => eprintln!("hugevmm: control socket: client dropped: {e}"),
    }
}

/// Sends one error line to a client about to be closed, without waiting:
/// a client that does not read loses it.
fn say_and_close(stream: &UnixStream, message: &str) {
    let mut line = error_reply(message).to_string();
    line.push('\n');
    if stream.set_nonblocking(true).is_ok() {
        let _ = (&*stream).write(line.as_bytes());
    }
}

enum ClientEnd {
    Disconnected,
    Stop,
}

/// Writes one reply line; the whole line gets `timeout`. Stops early (the
/// reply lost) if the VM ends meanwhile.
fn send(
    stream: &UnixStream,
    reply: &serde_json::Value,
    shared: &Shared,
) -> io::Result<Option<ClientEnd>> {
    let mut line = reply.to_string();
    line.push('\n');
    let deadline = Instant::now() + shared.limits.write_timeout;
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        match (&*stream).write(rest) {
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

/// Answers one client's lines until it disconnects, idles past the
/// timeout or the VM ends. A last line without its newline is not run:
/// the client may have died mid-command, and half of `balloon 64M` is a
/// different target.
fn serve_client(stream: &UnixStream, shared: &Shared) -> io::Result<ClientEnd> {
    // Non-blocking, so that every wait is a poll that also watches `stop`.
    stream.set_nonblocking(true)?;
    let idle_timeout = shared.limits.idle_timeout;
    // The whole line is timed, not each read: a byte every so often must
    // not keep the connection for ever.
    let mut line_deadline = Instant::now() + idle_timeout;
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let reply = shared.context.respond(&pending[..end]);
            pending.drain(..=end);
            if let Some(end) = send(stream, &reply, shared)? {
                return Ok(end);
            }
            line_deadline = Instant::now() + idle_timeout;
        }
        if pending.len() > MAX_LINE_BYTES {
            // Nothing sensible follows a runaway line; say why and hang up.
            let reply = error_reply(format!(
                "command line longer than {MAX_LINE_BYTES} bytes; closing the connection"
            ));
            return Ok(send(stream, &reply, shared)?.unwrap_or(ClientEnd::Disconnected));
        }
        match wait_for(
            stream.as_raw_fd(),
            libc::POLLIN,
            &shared.stop,
            Some(line_deadline),
        )? {
            Wake::Ready => {}
            Wake::Stop => return Ok(ClientEnd::Stop),
            Wake::TimedOut => {
                say_and_close(
                    stream,
                    &format!(
                        "no complete command line within {} s; closing the connection (send one line per command, ended by a newline)",
                        idle_timeout.as_secs_f64()
                    ),
                );
                return Ok(ClientEnd::Disconnected);
            }
        }
        match (&*stream).read(&mut chunk) {
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
    use std::io::{BufRead, BufReader};

    fn temp_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("hugevmm-ctl-{}-{tag}.sock", std::process::id()))
    }

    /// How long a test client waits for a reply or the end of its
    /// connection before the test fails: not a measurement, only a bound
    /// so that a server that blocks fails the test instead of hanging it.
    const GUARD: Duration = Duration::from_secs(60);

    /// Limits that never drop a client for idling during a test.
    const PATIENT: Limits = Limits {
        idle_timeout: Duration::from_secs(3600),
        ..Limits::DEFAULT
    };

    struct Client {
        reader: BufReader<UnixStream>,
        writer: UnixStream,
    }

    impl Client {
        fn connect(path: &Path) -> Self {
            let writer = UnixStream::connect(path).unwrap();
            writer.set_read_timeout(Some(GUARD)).unwrap();
            Self {
                reader: BufReader::new(writer.try_clone().unwrap()),
                writer,
            }
        }
        fn send(&mut self, bytes: &[u8]) {
            self.writer.write_all(bytes).unwrap();
        }
        fn reply(&mut self) -> serde_json::Value {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            assert!(line.ends_with('\n'), "{line:?}");
            serde_json::from_str(&line).unwrap()
        }
        fn ask(&mut self, line: &str) -> serde_json::Value {
            self.send(format!("{line}\n").as_bytes());
            self.reply()
        }
        /// Asserts that the server closed the connection, returning what
        /// came before the end. A server closing with unread bytes from us
        /// makes Linux report a reset rather than the end: both count.
        fn closed(&mut self) -> Vec<u8> {
            let mut rest = Vec::new();
            match self.reader.read_to_end(&mut rest) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
                Err(e) => panic!("the connection stayed open: {e}"),
            }
            rest
        }
    }

    fn serve(tag: &str, limits: Limits) -> (ControlServer, PathBuf) {
        let path = temp_path(tag);
        let _ = std::fs::remove_file(&path);
        let server = ControlSocket::bind(&path)
            .unwrap()
            .serve_with(context(true), limits)
            .unwrap();
        (server, path)
    }

    #[test]
    fn serves_clients_in_turn_and_survives_garbage() {
        let path = temp_path("serve");
        let _ = std::fs::remove_file(&path);
        let server = ControlSocket::bind(&path)
            .unwrap()
            .serve(context(true))
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let mut c = Client::connect(&path);
        assert_eq!(c.ask("help")["ok"], true);
        assert_eq!(c.ask("balloon 4M")["target_pages"], 1024);
        // Two commands in one write, split across writes, with CRLF.
        c.send(b"balloon-stats\r\nsta");
        assert_eq!(c.reply()["target_pages"], 1024);
        c.send(b"ts\n");
        assert_eq!(c.reply()["balloon"]["target_pages"], 1024);
        // Garbage gets error replies and the connection stays usable.
        for garbage in [&b"\xff\xfe\x00\x01"[..], b"", b"balloon", b"balloon -5"] {
            c.send(garbage);
            c.send(b"\n");
            let r = c.reply();
            assert_eq!(r["ok"], false, "{garbage:?}: {r}");
            assert!(r["error"].is_string());
        }
        // A runaway line is refused and the connection closed.
        c.send(&vec![b'x'; MAX_LINE_BYTES + 10]);
        let r = c.reply();
        assert_eq!(r["ok"], false);
        assert!(c.closed().is_empty());

        // A client that dies mid-line changes nothing.
        let mut c = Client::connect(&path);
        c.send(b"balloon 6");
        drop(c);
        // One that never reads its replies does not stop the next one.
        let mut c = Client::connect(&path);
        c.send(b"stats\nstats\n");
        c.writer.shutdown(std::net::Shutdown::Both).unwrap();
        drop(c);
        let mut c = Client::connect(&path);
        assert_eq!(c.ask("balloon-stats")["target_pages"], 1024);

        // The VM's end wakes the thread while this client stays connected.
        server.shutdown(true);
        assert!(!path.exists(), "the socket file is removed");
        assert!(c.closed().is_empty());
    }

    #[test]
    fn an_idle_client_does_not_block_another() {
        let (server, path) = serve("idle", PATIENT);
        // Served (it has had a reply), then silent.
        let mut idle = Client::connect(&path);
        assert_eq!(idle.ask("help")["ok"], true);
        // Silent from the start, and one stopped mid-line.
        let _silent = Client::connect(&path);
        let mut partial = Client::connect(&path);
        partial.send(b"balloon-st");
        let mut other = Client::connect(&path);
        assert_eq!(other.ask("balloon 4M")["target_pages"], 1024);
        // Each of them is still served, and sees the other's change.
        assert_eq!(idle.ask("balloon-stats")["target_pages"], 1024);
        partial.send(b"ats\n");
        assert_eq!(partial.reply()["target_pages"], 1024);
        server.shutdown(true);
    }

    /// The reply a client gets when it is dropped for sending no line.
    fn assert_idle_error(r: &serde_json::Value) {
        assert_eq!(r["ok"], false, "{r}");
        assert!(
            r["error"]
                .as_str()
                .unwrap()
                .contains("no complete command line"),
            "{r}"
        );
    }

    #[test]
    fn silent_and_trickling_clients_are_dropped() {
        let limits = Limits {
            idle_timeout: Duration::from_millis(300),
            ..Limits::DEFAULT
        };
        let (server, path) = serve("trickle", limits);
        let mut silent = Client::connect(&path);
        let r = silent.reply();
        assert_idle_error(&r);
        assert!(silent.closed().is_empty());

        // One byte at a time, each well within the timeout, never a whole
        // line: the line's time runs from the last reply, not each byte.
        let mut trickling = Client::connect(&path);
        assert_eq!(trickling.ask("help")["ok"], true);
        let mut writer = trickling.writer.try_clone().unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trickle_done = done.clone();
        let trickler = std::thread::spawn(move || {
            while !trickle_done.load(Ordering::Relaxed) && writer.write_all(b"s").is_ok() {
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let r = trickling.reply();
        done.store(true, Ordering::Relaxed);
        assert_idle_error(&r);
        assert!(trickling.closed().is_empty());
        trickler.join().unwrap();

        // A client that sends its line gets its reply.
        let mut prompt = Client::connect(&path);
        assert_eq!(prompt.ask("help")["ok"], true);
        server.shutdown(true);
    }

    #[test]
    fn past_max_clients_one_more_gets_an_error_line() {
        let (server, path) = serve("max", PATIENT);
        // Each has had a reply, so each has its thread.
        let mut clients: Vec<Client> = (0..MAX_CLIENTS)
            .map(|_| {
                let mut c = Client::connect(&path);
                assert_eq!(c.ask("help")["ok"], true);
                c
            })
            .collect();
        let mut extra = Client::connect(&path);
        let r = extra.reply();
        assert_eq!(r["ok"], false, "{r}");
        let error = r["error"].as_str().unwrap();
        assert!(
            error.contains(&format!("too many control clients ({MAX_CLIENTS})")),
            "{r}"
        );
        assert!(extra.closed().is_empty());
        // The others are still served.
        for c in &mut clients {
            assert_eq!(c.ask("balloon-stats")["ok"], true);
        }
        // Once one leaves, a new client is served again (its thread ends
        // a moment after the disconnect: retry, counting tries, not time).
        drop(clients.pop());
        let mut tries = 0;
        loop {
            let mut c = Client::connect(&path);
            c.send(b"help\n");
            if c.reply()["ok"] == true {
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
        assert_eq!(idle.ask("help")["ok"], true);
        let mut partial = Client::connect(&path);
        partial.send(b"sta");
        // Never reads: its thread ends up waiting to write a reply.
        let mut flooding = Client::connect(&path);
        flooding.send(&b"help\n".repeat(4000));
        let mut served = Client::connect(&path);
        assert_eq!(served.ask("help")["ok"], true);

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
        // Every client thread has ended, and so its connection.
        assert!(idle.closed().is_empty());
        assert!(partial.closed().is_empty());
        assert!(served.closed().is_empty());
        flooding.closed();
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

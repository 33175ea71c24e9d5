//! The control socket (`hugevmm run --api-socket PATH`): a Unix stream
//! socket served by one thread, one client at a time, one JSON reply line
//! per command line.
//!
//! The socket is bound before the VM is built, so that a path in use fails
//! the run before anything is allocated, and served once the vCPUs start;
//! a client that connects in between waits in the listen backlog. The
//! thread sleeps in `poll` on the socket and a stop eventfd, so the VM's end
//! wakes it at once even while a client stays connected.

use super::command::MAX_LINE_BYTES;
use super::context::{error_reply, ControlContext};
use anyhow::{bail, Context, Result};
use std::io::{self, ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use vmm_sys_util::eventfd::EventFd;

/// How long a reply may wait for a client that does not read; past it
/// the client is dropped so that it cannot stall the next one.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Starts the thread that serves the socket with `context`.
    pub fn serve(self, context: ControlContext) -> Result<ControlServer> {
        let stop = Arc::new(
            EventFd::new(libc::EFD_NONBLOCK)
                .context("cannot create the control socket's eventfd")?,
        );
        let listener = self.listener;
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(&listener, &thread_stop, &context))
            .context("cannot spawn the control socket thread")?;
        Ok(ControlServer {
            stop,
            thread: Some(thread),
            _file: self.file,
        })
    }
}

/// The serving thread; stops (and removes the socket file) when dropped.
pub struct ControlServer {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    _file: SocketFile,
}

impl ControlServer {
    /// Stops serving and removes the socket file. `wait` joins the thread
    /// (finishing a command in progress); without it the thread is left to
    /// end on its own, for when a command might be stuck on guest memory
    /// that will never be served (a failed VM).
    pub fn shutdown(mut self, wait: bool) {
        self.stop_thread(wait);
    }

    fn stop_thread(&mut self, wait: bool) {
        // Never read, so it stays readable and every later poll sees it.
        if let Err(e) = self.stop.write(1) {
            eprintln!("hugevmm: control socket: cannot stop its thread: {e}");
            return;
        }
        if let Some(thread) = self.thread.take() {
            if wait {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop_thread(true);
    }
}

enum Wake {
    Readable,
    Stop,
}

/// Sleeps until `fd` is readable (or hung up) or `stop` is signalled.
fn wait_readable(fd: RawFd, stop: &EventFd) -> io::Result<Wake> {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is an array of two initialized pollfd that lives
        // across the call, and its length is passed with it; poll only
        // writes the `revents` fields.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
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
        // POLLHUP and POLLERR count as readable: the read reports them.
        if fds[0].revents != 0 {
            return Ok(Wake::Readable);
        }
    }
}

fn accept_loop(listener: &UnixListener, stop: &EventFd, context: &ControlContext) {
    loop {
        match wait_readable(listener.as_raw_fd(), stop) {
            Ok(Wake::Stop) => return,
            Ok(Wake::Readable) => {}
            Err(e) => {
                eprintln!("hugevmm: control socket: poll failed, no more commands: {e}");
                return;
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
                return;
            }
        };
        match serve_client(stream, stop, context) {
            Ok(ClientEnd::Disconnected) => {}
            Ok(ClientEnd::Stop) => return,
            // A client that goes away or stops reading is its own problem.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::BrokenPipe
                        | ErrorKind::ConnectionReset
                        | ErrorKind::WouldBlock
                        | ErrorKind::TimedOut
                ) => {}
            Err(e) => eprintln!("hugevmm: control socket: client dropped: {e}"),
        }
    }
}

enum ClientEnd {
    Disconnected,
    Stop,
}

fn send(mut stream: &UnixStream, reply: &serde_json::Value) -> io::Result<()> {
    let mut line = reply.to_string();
    line.push('\n');
    stream.write_all(line.as_bytes())
}

/// Answers one client's lines until it disconnects. A last line without
/// its newline is not run: the client may have died mid-command, and half
/// of `balloon 64M` is a different target.
fn serve_client(
    mut stream: UnixStream,
    stop: &EventFd,
    context: &ControlContext,
) -> io::Result<ClientEnd> {
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let reply = context.respond(&pending[..end]);
            pending.drain(..=end);
            send(&stream, &reply)?;
        }
        if pending.len() > MAX_LINE_BYTES {
            // Nothing sensible follows a runaway line; say why and hang up.
            let reply = error_reply(format!(
                "command line longer than {MAX_LINE_BYTES} bytes; closing the connection"
            ));
            send(&stream, &reply)?;
            return Ok(ClientEnd::Disconnected);
        }
        match wait_readable(stream.as_raw_fd(), stop)? {
            Wake::Stop => return Ok(ClientEnd::Stop),
            Wake::Readable => {}
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(ClientEnd::Disconnected),
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
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

    struct Client {
        reader: BufReader<UnixStream>,
        writer: UnixStream,
    }

    impl Client {
        fn connect(path: &Path) -> Self {
            let writer = UnixStream::connect(path).unwrap();
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
        let mut rest = String::new();
        assert_eq!(c.reader.read_to_string(&mut rest).unwrap_or(0), 0);

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
        let mut rest = String::new();
        assert_eq!(c.reader.read_to_string(&mut rest).unwrap_or(0), 0);
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

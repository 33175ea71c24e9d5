//! Test helpers shared with the crates that build on this one (enable the
//! `test-support` feature in their dev-dependencies): a directory that takes
//! `O_DIRECT` files, throwaway mounts of other filesystem types, NBD servers
//! (nbdkit, qemu-nbd, and a fake one that goes away on cue).

use std::path::{Path, PathBuf};

use crate::{BlockFile, BlockOptions};

pub use crate::nbd::fake_server::{FakeNbdServer, Misbehaviour};

/// A directory whose filesystem takes O_DIRECT files.
pub fn test_dir() -> PathBuf {
    let dir = std::env::temp_dir();
    // Tests need O_DIRECT; /tmp may be tmpfs on other machines.
    if BlockFile::temporary_in(&dir, &BlockOptions::default()).is_ok() {
        dir
    } else {
        PathBuf::from("/var/tmp")
    }
}

/// Runs `f` on a fresh ramfs directory (ramfs refuses O_DIRECT), mounted
/// in a private mount namespace of a new thread so that nothing outside
/// the test sees it. None where mounting is not allowed.
pub fn with_ramfs<R: Send>(f: impl FnOnce(&Path) -> R + Send) -> Option<R> {
    with_mount(c"ramfs", None, f)
}

/// [`with_ramfs`] for any filesystem type with mount data, e.g. a
/// `size=16m` tmpfs to fill up. None where mounting is not allowed.
pub fn with_mount<R: Send>(
    fstype: &std::ffi::CStr,
    data: Option<&std::ffi::CStr>,
    f: impl FnOnce(&Path) -> R + Send,
) -> Option<R> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: unshare affects only this thread's mount namespace.
                if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                    return None;
                }
                // SAFETY: a mount syscall with NUL-terminated strings; it
                // makes this namespace's mounts private so that none of
                // ours propagates to the host.
                let private = unsafe {
                    libc::mount(
                        c"none".as_ptr(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    )
                } == 0;
                if !private {
                    return None;
                }
                let dir = test_dir().join(format!(
                    ".blockio-{}-{}-{:?}",
                    fstype.to_string_lossy(),
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&dir).ok()?;
                let cdir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
                // SAFETY: as above.
                let mounted = unsafe {
                    libc::mount(
                        c"none".as_ptr(),
                        cdir.as_ptr(),
                        fstype.as_ptr(),
                        0,
                        data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
                    )
                } == 0;
                let result = mounted.then(|| f(&dir));
                if mounted {
                    // SAFETY: unmounting what this thread mounted.
                    unsafe { libc::umount2(cdir.as_ptr(), libc::MNT_DETACH) };
                }
                let _ = std::fs::remove_dir(&dir);
                result
            })
            .join()
            .expect("ramfs test thread")
    })
}

/// A throwaway X.509 authority, a server certificate it signed for
/// `localhost` and `127.0.0.1`, and a client certificate, written in one
/// directory as nbdkit, qemu-nbd and this client look for them:
/// `ca-cert.pem`, `server-cert.pem`, `server-key.pem`, `client-cert.pem`,
/// `client-key.pem`. The same directory serves the server
/// (`--tls-certificates=DIR`, `tls-creds-x509,dir=DIR`) and the client
/// (`tls-certificates=DIR`: the authority, and the client's own
/// certificate for servers that ask, as qemu-nbd does by default).
#[derive(Debug)]
pub struct TlsCertificates {
    /// The directory.
    pub dir: PathBuf,
}

impl TlsCertificates {
    /// A new authority and server certificate in a fresh directory.
    pub fn new() -> TlsCertificates {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let dir = NbdServer::fresh_dir();
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name
            .push(DnType::CommonName, "hugevmm test authority");
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");
        let mut server =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("server parameters");
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let server_key = KeyPair::generate().expect("a server key");
        let server_cert = server
            .signed_by(&server_key, &ca_cert, &ca_key)
            .expect("the server certificate");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("client parameters");
        client
            .distinguished_name
            .push(DnType::CommonName, "hugevmm test client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let client_key = KeyPair::generate().expect("a client key");
        let client_cert = client
            .signed_by(&client_key, &ca_cert, &ca_key)
            .expect("the client certificate");
        let write = |name: &str, text: String| {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            std::io::Write::write_all(&mut f, text.as_bytes()).expect("certificate written");
        };
        write("ca-cert.pem", ca_cert.pem());
        write("server-cert.pem", server_cert.pem());
        write("server-key.pem", server_key.serialize_pem());
        write("client-cert.pem", client_cert.pem());
        write("client-key.pem", client_key.serialize_pem());
        TlsCertificates { dir }
    }
}

impl Drop for TlsCertificates {
    /// Removes the directory: the keys are throwaway, and a test binary
    /// run often would otherwise leave one folder per test in `$TMPDIR`.
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Default for TlsCertificates {
    fn default() -> Self {
        Self::new()
    }
}

/// A storage server a test started on a Unix socket of its own, killed
/// when dropped: an NBD server (nbdkit or qemu-nbd) or a vhost-user-blk
/// backend (qemu-storage-daemon, [`StorageServer::qemu_storage_daemon`]). Tests use Unix sockets so that parallel
/// tests never compete for TCP ports; [`NbdServer::nbdkit_tcp`] is for the
/// one that checks TCP.
#[derive(Debug)]
pub struct StorageServer {
    child: Option<std::process::Child>,
    /// A vhost-user-blk backend rather than an NBD server.
    vhost_user: bool,
    program: &'static str,
    args: Vec<String>,
    socket: PathBuf,
    uri: String,
    dir: PathBuf,
}

/// The name most tests know the servers by.
pub type NbdServer = StorageServer;

impl StorageServer {
    /// Whether nbdkit is installed; reports the skip of `test` when not.
    fn have_nbdkit(test: &str) -> bool {
        let here = test_resources::have_program("nbdkit");
        if !here {
            test_resources::skip(
                test,
                test_resources::Resource::Nbdkit,
                "nbdkit is not installed (Debian: apt-get install nbdkit)",
            );
        }
        here
    }

    /// `nbdkit ARGS...` (filters, plugin, its parameters) serving on a
    /// fresh Unix socket; `None` (after a visible skip of `test`) when
    /// nbdkit is not installed.
    pub fn nbdkit(test: &str, args: &[&str]) -> Option<NbdServer> {
        Self::nbdkit_with(test, args, false, None)
    }

    /// `nbdkit -i 127.0.0.1 -p PORT ARGS...` on a free TCP port of the
    /// loopback interface; `None` as for [`Self::nbdkit`].
    pub fn nbdkit_tcp(test: &str, args: &[&str]) -> Option<NbdServer> {
        Self::nbdkit_with(test, args, true, None)
    }

    /// `nbdkit --tls=require --tls-certificates=DIR ARGS...` on a fresh
    /// Unix socket, with its `nbds+unix://` URI (the client checks the
    /// certificate against `localhost`); `None` as for [`Self::nbdkit`].
    pub fn nbdkit_tls(test: &str, certs: &TlsCertificates, args: &[&str]) -> Option<NbdServer> {
        Self::nbdkit_with(test, args, false, Some(certs))
    }

    /// [`Self::nbdkit_tls`] on a free TCP port of the loopback interface
    /// (`nbds://127.0.0.1:PORT/`: the certificate is checked against the
    /// address).
    pub fn nbdkit_tls_tcp(test: &str, certs: &TlsCertificates, args: &[&str]) -> Option<NbdServer> {
        Self::nbdkit_with(test, args, true, Some(certs))
    }

    fn nbdkit_with(
        test: &str,
        args: &[&str],
        tcp: bool,
        tls: Option<&TlsCertificates>,
    ) -> Option<NbdServer> {
        if !Self::have_nbdkit(test) {
            return None;
        }
        let dir = Self::fresh_dir();
        let mut all: Vec<String> = vec!["--foreground".into(), "--exit-with-parent".into()];
        let s = if tls.is_some() { "s" } else { "" };
        let (socket, mut uri) = if tcp {
            // A port the kernel just handed out and we released: another
            // test taking it in between is possible but unlikely, and
            // would show as nbdkit failing to bind, not as a wrong result.
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free loopback port")
                .port();
            all.extend([
                "-i".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
            ]);
            (PathBuf::new(), format!("nbd{s}://127.0.0.1:{port}/"))
        } else {
            let socket = dir.join("sock");
            all.extend(["-U".into(), socket.to_str().expect("UTF-8 temp dir").into()]);
            let uri = format!("nbd{s}+unix:///?socket={}", socket.display());
            (socket, uri)
        };
        if let Some(certs) = tls {
            all.extend([
                "--tls=require".into(),
                format!("--tls-certificates={}", certs.dir.display()),
            ]);
            uri.push(if tcp { '?' } else { '&' });
            uri.push_str(&format!("tls-certificates={}", certs.dir.display()));
            if !tcp {
                uri.push_str("&tls-hostname=localhost");
            }
        }
        all.extend(args.iter().map(|s| s.to_string()));
        Some(Self::start("nbdkit", all, socket, dir, &uri))
    }

    /// `qemu-nbd` as [`Self::qemu_nbd`], with TLS required
    /// (`--object tls-creds-x509,...,endpoint=server --tls-creds`).
    pub fn qemu_nbd_tls(test: &str, certs: &TlsCertificates, file: &Path) -> Option<NbdServer> {
        Self::qemu_nbd_with(
            test,
            file,
            &[
                "--object".to_string(),
                format!(
                    "tls-creds-x509,id=tls0,dir={},endpoint=server",
                    certs.dir.display()
                ),
                "--tls-creds".to_string(),
                "tls0".to_string(),
            ],
            Some(certs),
        )
    }

    /// `qemu-nbd --persistent -f raw FILE` (export name empty) on a fresh
    /// Unix socket; `None` (after a visible skip) without qemu-nbd.
    pub fn qemu_nbd(test: &str, file: &Path) -> Option<NbdServer> {
        Self::qemu_nbd_with(test, file, &[], None)
    }

    fn qemu_nbd_with(
        test: &str,
        file: &Path,
        extra: &[String],
        tls: Option<&TlsCertificates>,
    ) -> Option<NbdServer> {
        if !test_resources::have_program("qemu-nbd") {
            test_resources::skip(
                test,
                test_resources::Resource::QemuNbd,
                "qemu-nbd is not installed (Debian: apt-get install qemu-utils)",
            );
            return None;
        }
        let dir = Self::fresh_dir();
        let socket = dir.join("sock");
        let mut all = extra.to_vec();
        all.extend([
            "--persistent".to_string(),
            "--shared=8".to_string(),
            "-f".to_string(),
            "raw".to_string(),
            "--cache=none".to_string(),
            "--aio=threads".to_string(),
            "-k".to_string(),
            socket.to_str().expect("UTF-8 temp dir").to_string(),
            file.to_str().expect("UTF-8 path").to_string(),
        ]);
        let uri = match tls {
            None => String::new(),
            Some(certs) => format!(
                "nbds+unix:///?socket={}&tls-certificates={}&tls-hostname=localhost",
                socket.display(),
                certs.dir.display()
            ),
        };
        Some(Self::start("qemu-nbd", all, socket, dir, &uri))
    }

    /// `qemu-storage-daemon` exporting `file` (raw) as a writable
    /// vhost-user-blk device on a fresh Unix socket, `export_options`
    /// appended to its `--export` (e.g. `num-queues=2`); `None` (after a
    /// visible skip of `test`) when it is not installed. Discards punch
    /// holes (`discard=unmap`). [`Self::uri`] is the socket's path.
    pub fn qemu_storage_daemon(
        test: &str,
        file: &Path,
        export_options: &[&str],
    ) -> Option<StorageServer> {
        let blockdev = format!(
            "driver=file,node-name=file0,filename={},discard=unmap",
            file.display()
        );
        Self::qemu_storage_daemon_on(test, blockdev, export_options)
    }

    /// [`Self::qemu_storage_daemon`] on a device whose every request of
    /// `event` (`read_aio`, `write_aio`) fails with `EIO` (QEMU's blkdebug
    /// driver under the raw format, whose requests raise those events, over
    /// `file`): the backend then answers `VIRTIO_BLK_S_IOERR`.
    ///
    /// A blkdebug rule stays active once its event fired and fails every
    /// later request its `iotype` matches, every type by default: so a
    /// read (a prefetch's) followed by an eviction's write failed the
    /// write under `read_aio` (CI, 2026-12-07:
    /// `an_io_error_status_is_fatal_never_zeros`, about 1 run in 7). The
    /// rule's `iotype` is the event's own.
    pub fn qemu_storage_daemon_failing(
        test: &str,
        file: &Path,
        event: &str,
    ) -> Option<StorageServer> {
        let iotype = match event {
            "read_aio" => "read",
            "write_aio" => "write",
            other => panic!("no blkdebug request type for the event {other}"),
        };
        let blockdev = format!(
            "driver=raw,node-name=file0,file.driver=blkdebug,file.inject-error.0.event={event},file.inject-error.0.iotype={iotype},file.inject-error.0.errno=5,file.image.driver=file,file.image.filename={}",
            file.display()
        );
        Self::qemu_storage_daemon_on(test, blockdev, &[])
    }

    /// qemu-storage-daemon with `--blockdev BLOCKDEV` (node `file0`)
    /// exported as above.
    fn qemu_storage_daemon_on(
        test: &str,
        blockdev: String,
        export_options: &[&str],
    ) -> Option<StorageServer> {
        if !test_resources::have_program("qemu-storage-daemon") {
            test_resources::skip(
                test,
                test_resources::Resource::QemuStorageDaemon,
                "qemu-storage-daemon is not installed (Debian: apt-get install qemu-system-common)",
            );
            return None;
        }
        let dir = Self::fresh_dir();
        let socket = dir.join("sock");
        let mut export = format!(
            "type=vhost-user-blk,id=export0,node-name=file0,addr.type=unix,addr.path={},writable=on",
            socket.display()
        );
        for option in export_options {
            export.push(',');
            export.push_str(option);
        }
        let args = vec![
            "--blockdev".to_string(),
            blockdev,
            "--export".to_string(),
            export,
        ];
        let uri = socket.to_str().expect("UTF-8 temp dir").to_string();
        let mut server = StorageServer {
            child: None,
            vhost_user: true,
            program: "qemu-storage-daemon",
            args,
            socket,
            uri,
            dir,
        };
        server.restart();
        Some(server)
    }

    /// A whole handshake, not just a connect: a server that accepts
    /// before it can serve (qemu-nbd resets such early connections) is not
    /// ready yet.
    fn nbd_handshake_works(&self) -> bool {
        let uri: crate::nbd::NbdUri = self.uri.parse().expect("our own URI parses");
        let tls = crate::nbd::tls::TlsSetup::load(&uri)
            .unwrap_or_else(|e| panic!("the test's TLS settings: {e}"));
        uri.resolve().ok().is_some_and(|addrs| {
            crate::nbd::handshake::connect(
                &uri,
                &addrs,
                tls.as_ref(),
                crate::nbd::DEFAULT_RECONNECT_TIMEOUT,
            )
            .is_ok()
        })
    }

    fn fresh_dir() -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        // Under the system temp dir, not test_dir(): a socket path must be
        // short (108 bytes) and need not take O_DIRECT.
        let dir = std::env::temp_dir().join(format!(
            "hugevmm-nbd-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the NBD socket");
        dir
    }

    fn start(
        program: &'static str,
        args: Vec<String>,
        socket: PathBuf,
        dir: PathBuf,
        uri: &str,
    ) -> StorageServer {
        let uri = if uri.is_empty() {
            format!("nbd+unix:///?socket={}", socket.display())
        } else {
            uri.to_string()
        };
        let mut server = StorageServer {
            child: None,
            vhost_user: false,
            program,
            args,
            socket,
            uri,
            dir,
        };
        server.restart();
        server
    }

    /// The URI to connect to (export name empty); a vhost-user-blk
    /// backend's socket path.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Ends the server at once (SIGKILL: a crash, nothing flushed on the
    /// way out) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server the normal way (SIGTERM: what `systemctl stop` or
    /// a Ctrl-C sends; nbdkit answers requests in flight with
    /// `NBD_ESHUTDOWN`, then waits for its clients to disconnect) and
    /// waits for it to be gone. A server still there after a generous
    /// minute fails the test: its clients did not let go.
    pub fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) on our own child, which has not been reaped (we
        // hold its Child), so the pid names no other process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = std::time::Instant::now();
        while child.try_wait().ok().flatten().is_none() {
            if started.elapsed() > std::time::Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not exit within 60 s of SIGTERM: a client kept its connection after NBD_ESHUTDOWN",
                    self.program
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Freezes the server (SIGSTOP): its socket and connections stay up,
    /// and nothing is read or answered any more, as on a host that hung.
    /// Dropping the server still ends it.
    pub fn freeze(&self) {
        if let Some(child) = &self.child {
            let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
            // SAFETY: kill(2) on our own child, not reaped (we hold its
            // Child), so the pid names no other process.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
    }

    /// Starts the server again with the same arguments (after [`Self::kill`],
    /// or killing it first) and waits until it accepts connections.
    pub fn restart(&mut self) {
        self.kill();
        if !self.socket.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.socket);
        }
        let stderr = std::fs::File::create(self.dir.join("stderr")).expect("server log file");
        let child = std::process::Command::new(self.program)
            .args(&self.args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program));
        self.child = Some(child);
        // Readiness, not a timed assertion: a server that never listens
        // fails the test with its own messages after a generous wait.
        let started = std::time::Instant::now();
        loop {
            // qemu-storage-daemon binds and listens as it sets its export
            // up; a connection before it serves waits in the backlog. A
            // probe connection is not made: it serves one at a time.
            let ready = if self.vhost_user {
                self.socket.exists()
            } else {
                self.nbd_handshake_works()
            };
            if ready {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "{} {:?} exited ({status}) before listening: {}",
                    self.program,
                    self.args,
                    std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
                );
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                panic!(
                    "{} {:?} did not listen within 30 s",
                    self.program, self.args
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for StorageServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

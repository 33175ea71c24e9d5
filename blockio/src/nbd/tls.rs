//! NBD over TLS: the client's TLS settings loaded once at open, the
//! `NBD_OPT_STARTTLS` upgrade's TLS handshake, and [`TlsStream`], the
//! socket the rest of the client reads and writes through.
//!
//! rustls does the TLS. Its connection object is one state for both
//! directions, while this client reads replies on one thread and writes
//! requests on others, each blocking on the socket. So the state sits
//! under a mutex that no thread holds while it waits on the socket:
//!
//! - a reader takes raw bytes from the socket without the lock, then under
//!   it hands them to rustls and takes out what is decrypted;
//! - a writer encrypts under the lock into a buffer of its own, then sends
//!   that buffer without it. Writers are already one at a time (the
//!   client's send lock), so records leave in the order they were sealed.
//!
//! Holding the lock across a blocking send would let a writer stalled on a
//! full socket keep the reader from taking replies, and a server blocked on
//! sending those replies stops reading requests: both sides would wait for
//! ever. What rustls has to send on its own (a key update's answer, an
//! alert) waits in its buffer for the next request, which carries it out
//! first.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use super::handshake::{AttemptError, Stream};
use super::uri::{NbdAddress, NbdTls, NbdUri, SYSTEM_CA_FILE};

/// The most bytes one write seals before sending them: bounds the copy a
/// 2 MiB write makes, while keeping records full.
const SEAL_PIECE_BYTES: usize = 256 << 10;

/// What every connection of one client shares: the configuration (with the
/// certificates read at open, since no thread may open files once the VM
/// runs under seccomp) and the name the server's certificate must carry.
#[derive(Clone)]
pub(crate) struct TlsSetup {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSetup")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsSetup {
    /// Reads the certificates `uri`'s TLS settings name; `None` for a URI
    /// without TLS. The error says which file and what to do.
    pub(crate) fn load(uri: &NbdUri) -> Result<Option<Self>, String> {
        let Some(tls) = &uri.tls else {
            return Ok(None);
        };
        let name = match (&tls.hostname, &uri.address) {
            (Some(name), _) => name.clone(),
            (None, NbdAddress::Tcp { host, .. }) => host.clone(),
            // Only reachable without verification (the URI parser asks for
            // tls-hostname= otherwise); rustls still wants some name.
            (None, NbdAddress::Unix { .. }) => "localhost".to_string(),
        };
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| format!("tls-hostname {name:?} is not a host name or address: {e}"))?;
        // ring rather than aws-lc-rs (rustls's default, which deprecates
        // ring's provider for lacking post-quantum key exchange): ring is
        // already built here for sealing, aws-lc-rs is a C and assembly
        // build of its own. Classical ECDHE protects this link as it does
        // nbdkit's and qemu-nbd's GnuTLS sessions.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?;
        let builder = if tls.verify_peer {
            builder.with_root_certificates(trusted_authorities(tls)?)
        } else {
            log::warn!(
                "{uri}: tls-verify-peer=false: the server's certificate is not checked, so anyone on the path can pose as the server and read or change every page; for tests only"
            );
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate { provider }))
        };
        let config = match client_identity(tls)? {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate and key do not go together: {e}"))?,
            None => builder.with_no_client_auth(),
        };
        Ok(Some(TlsSetup {
            config: Arc::new(config),
            server_name,
        }))
    }

    /// The TLS handshake on `raw`, right after the server acknowledged
    /// `NBD_OPT_STARTTLS`, given up at `deadline`. A certificate the
    /// server cannot prove is not retried: waiting will not fix it.
    pub(crate) fn start(&self, mut raw: Stream, deadline: Instant) -> Result<Stream, AttemptError> {
        let mut conn = ClientConnection::new(Arc::clone(&self.config), self.server_name.clone())
            .map_err(|e| AttemptError::protocol(format!("TLS setup: {e}")))?;
        let started = Instant::now();
        while conn.is_handshaking() {
            let mut timed = super::handshake::Timed {
                stream: &mut raw,
                deadline,
                started,
            };
            if let Err(e) = conn.complete_io(&mut timed) {
                let rejected = e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>());
                return Err(if rejected {
                    AttemptError::protocol(format!(
                        "TLS handshake refused: {e}; check that tls-certificates= names the CA that signed the server's certificate and that the certificate is issued to {:?} (tls-hostname=)",
                        self.server_name.to_str()
                    ))
                } else {
                    AttemptError::io("TLS handshake", e)
                });
            }
        }
        Ok(Stream::Tls(TlsStream {
            raw: Box::new(raw),
            session: Arc::new(Mutex::new(Session {
                conn,
                incoming: Vec::new(),
            })),
            scratch: vec![0; RECORD_BYTES],
        }))
    }
}

/// The authorities trusted to sign the server's certificate.
fn trusted_authorities(tls: &NbdTls) -> Result<RootCertStore, String> {
    let file = match &tls.certificates_dir {
        Some(dir) => dir.join("ca-cert.pem"),
        None => PathBuf::from(SYSTEM_CA_FILE),
    };
    let mut roots = RootCertStore::empty();
    for cert in certificates(&file)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: a CA certificate is unusable: {e}", file.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "{}: no certificate in it; put the CA that signed the server's certificate there (PEM)",
            file.display()
        ));
    }
    Ok(roots)
}

/// This client's certificate and key, where the directory has both.
#[allow(clippy::type_complexity)]
fn client_identity(
    tls: &NbdTls,
) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>, String> {
    let Some(dir) = &tls.certificates_dir else {
        return Ok(None);
    };
    let (cert_file, key_file) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    match (cert_file.exists(), key_file.exists()) {
        (false, false) => Ok(None),
        (true, true) => {
            let chain = certificates(&cert_file)?;
            if chain.is_empty() {
                return Err(format!("{}: no certificate in it", cert_file.display()));
            }
            let key = PrivateKeyDer::from_pem_file(&key_file)
                .map_err(|e| format!("{}: no usable private key: {e}", key_file.display()))?;
            Ok(Some((chain, key)))
        }
        (true, false) => Err(format!(
            "{} is there but {} is not: a client certificate needs its key",
            cert_file.display(),
            key_file.display()
        )),
        (false, true) => Err(format!(
            "{} is there but {} is not: a client key needs its certificate",
            key_file.display(),
            cert_file.display()
        )),
    }
}

fn certificates(file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let unreadable = |e: &dyn std::fmt::Display| {
        format!(
            "cannot read the certificates in {}: {e}; name a directory holding ca-cert.pem with tls-certificates=DIR",
            file.display()
        )
    };
    CertificateDer::pem_file_iter(file)
        .map_err(|e| unreadable(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unreadable(&e))
}

/// `tls-verify-peer=false`: every certificate is taken, but the handshake's
/// signatures are still checked against it, so the session is at least
/// with whoever holds that certificate's key.
#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The rustls state of one connection and the raw bytes read from the
/// socket that rustls has not taken yet.
struct Session {
    conn: ClientConnection,
    incoming: Vec<u8>,
}

impl Session {
    /// Hands rustls the bytes read so far, until it has plaintext to give
    /// or wants more. A record that fails to authenticate is an
    /// `InvalidData` error, which the client treats as a broken
    /// connection: it reconnects and sends again, and the data is never
    /// taken.
    fn take_incoming(&mut self) -> io::Result<()> {
        while !self.incoming.is_empty() {
            let mut unread = &self.incoming[..];
            let taken = self.conn.read_tls(&mut unread)?;
            self.incoming.drain(..taken);
            let state = self
                .conn
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
            if taken == 0 || state.plaintext_bytes_to_read() > 0 {
                break;
            }
        }
        Ok(())
    }
}

/// A socket with TLS over it, shared by the client's reader and its
/// writers (see the module docs for who holds the lock when).
pub(crate) struct TlsStream {
    raw: Box<Stream>,
    session: Arc<Mutex<Session>>,
    /// Where raw bytes land before they go to rustls: one whole record
    /// and its header fit. Each clone has its own (one thread uses each).
    scratch: Vec<u8>,
}

/// One TLS record's largest ciphertext with its header.
const RECORD_BYTES: usize = 16 * 1024 + 2048 + 5;

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream").field("raw", &self.raw).finish()
    }
}

fn lock(session: &Mutex<Session>) -> MutexGuard<'_, Session> {
    // A panic under the lock leaves rustls in a state no one can trust;
    // the next record then fails to authenticate and the client
    // reconnects, so going on with the poisoned value is safe.
    session.lock().unwrap_or_else(|p| p.into_inner())
}

impl TlsStream {
    pub(crate) fn raw(&self) -> &Stream {
        &self.raw
    }

    pub(crate) fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            raw: Box::new(self.raw.try_clone()?),
            session: Arc::clone(&self.session),
            scratch: vec![0; RECORD_BYTES],
        })
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut session = lock(&self.session);
                loop {
                    match session.conn.reader().read(buf) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        // Data, a clean close_notify (0), or an end without.
                        done => return done,
                    }
                    let queued = session.incoming.len();
                    if queued == 0 {
                        break;
                    }
                    session.take_incoming()?;
                    if session.incoming.len() == queued {
                        break;
                    }
                }
            }
            // Without the lock: writers go on while this waits (the read
            // timeouts set on the socket apply here).
            let n = self.raw.read(&mut self.scratch)?;
            let mut session = lock(&self.session);
            if n == 0 {
                // The peer closed: rustls learns of the end, and its
                // reader says whether it was a clean close_notify.
                session.conn.read_tls(&mut &[][..])?;
                session
                    .conn
                    .process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
                return match session.conn.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    done => done,
                };
            }
            let Session { incoming, .. } = &mut *session;
            incoming.extend_from_slice(&self.scratch[..n]);
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let piece = &buf[..buf.len().min(SEAL_PIECE_BYTES)];
        let (taken, sealed) = {
            let mut session = lock(&self.session);
            let taken = session.conn.writer().write(piece)?;
            let mut sealed = Vec::with_capacity(taken + 1024);
            while session.conn.wants_write() {
                session.conn.write_tls(&mut sealed)?;
            }
            (taken, sealed)
        };
        self.raw.write_all(&sealed)?;
        Ok(taken)
    }

    /// A request's header and payload sealed together: the header alone
    /// would be a record of its own, 22 bytes of overhead on 28.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut joined =
            Vec::with_capacity(SEAL_PIECE_BYTES.min(bufs.iter().map(|b| b.len()).sum()));
        for buf in bufs {
            let room = SEAL_PIECE_BYTES - joined.len();
            joined.extend_from_slice(&buf[..buf.len().min(room)]);
            if joined.len() == SEAL_PIECE_BYTES {
                break;
            }
        }
        self.write(&joined)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

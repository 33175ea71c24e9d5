//! NBD over TLS against real servers started by each test (nbdkit with
//! `--tls=require`, qemu-nbd with `--tls-creds`), with certificates made
//! for the test ([`TlsCertificates`]).

use std::sync::Arc;
use std::time::Duration;

use super::tests::round_trip_from_threads;
use super::*;
use crate::test_support::{test_dir, NbdServer, TlsCertificates};
use crate::tests::{pattern, UNIT};
use crate::AlignedBuf;

fn open_uri(uri: &str, reconnect_timeout: Duration) -> Result<BlockFile, BlockIoError> {
    let uri: NbdUri = uri.parse().expect("the server's URI parses");
    BlockFile::open_nbd(
        &uri,
        &NbdOptions {
            reconnect_timeout,
            read_only: false,
        },
    )
}

fn open(server: &NbdServer) -> BlockFile {
    open_uri(server.uri(), DEFAULT_RECONNECT_TIMEOUT)
        .unwrap_or_else(|e| panic!("open {}: {e}", server.uri()))
}

#[test]
fn nbdkit_with_tls_required_serves_pipelined_batches() {
    let certs = TlsCertificates::new();
    let Some(server) = NbdServer::nbdkit_tls("nbd tls nbdkit", &certs, &["memory", "size=256M"])
    else {
        return;
    };
    assert!(server.uri().starts_with("nbds+unix://"), "{}", server.uri());
    let f = Arc::new(open(&server));
    assert_eq!(f.len_bytes().unwrap(), 256 << 20);
    round_trip_from_threads(&f, 4, 24);
}

#[test]
fn nbdkit_over_tcp_is_checked_against_the_address() {
    let certs = TlsCertificates::new();
    let Some(server) = NbdServer::nbdkit_tls_tcp("nbd tls tcp", &certs, &["memory", "size=64M"])
    else {
        return;
    };
    assert!(
        server.uri().starts_with("nbds://127.0.0.1:"),
        "{}",
        server.uri()
    );
    let f = Arc::new(open(&server));
    round_trip_from_threads(&f, 2, 8);
}

/// qemu-nbd checks the client's certificate too (its `verify-peer`
/// default), so this also shows the client presenting `client-cert.pem`.
#[test]
fn qemu_nbd_with_tls_creds_serves_too() {
    let certs = TlsCertificates::new();
    let file = test_dir().join(format!(".nbd-tls-qemu-{}", std::process::id()));
    std::fs::write(&file, vec![0u8; 64 << 20]).unwrap();
    let server = NbdServer::qemu_nbd_tls("nbd tls qemu-nbd", &certs, &file);
    let _ = std::fs::remove_file(&file);
    let Some(server) = server else { return };
    let f = Arc::new(open(&server));
    round_trip_from_threads(&f, 2, 8);
}

#[test]
fn a_restarted_tls_server_is_reconnected_with_a_new_session() {
    let certs = TlsCertificates::new();
    let file = test_dir().join(format!(".nbd-tls-restart-{}", std::process::id()));
    std::fs::write(&file, vec![0u8; 16 << 20]).unwrap();
    let path = file.to_str().unwrap().to_string();
    let Some(mut server) = NbdServer::nbdkit_tls("nbd tls reconnect", &certs, &["file", &path])
    else {
        let _ = std::fs::remove_file(&file);
        return;
    };
    let f = Arc::new(open_uri(server.uri(), Duration::from_secs(60)).expect("open the TLS export"));
    let before = pattern(1, 4 * UNIT);
    f.write_at(0, &before).unwrap();
    server.kill();
    // Issued while nothing listens: they wait for the next session.
    let reader = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            let mut back = AlignedBuf::new(4 * UNIT, 1);
            f.read_at(0, &mut back).map(|()| back)
        })
    };
    server.restart();
    let back = reader
        .join()
        .unwrap()
        .expect("the read waits for the server");
    assert!(back[..] == before[..]);
    assert!(f.nbd().unwrap().reconnects() >= 1);
    drop(f);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_certificate_from_another_authority_is_refused_with_what_to_check() {
    let certs = TlsCertificates::new();
    let Some(server) = NbdServer::nbdkit_tls("nbd tls wrong CA", &certs, &["memory", "size=8M"])
    else {
        return;
    };
    let stranger = TlsCertificates::new();
    let uri = server.uri().replace(
        &certs.dir.display().to_string(),
        &stranger.dir.display().to_string(),
    );
    let err = open_uri(&uri, DEFAULT_RECONNECT_TIMEOUT)
        .unwrap_err()
        .to_string();
    assert!(err.contains("TLS handshake refused"), "{err}");
    assert!(err.contains("tls-certificates="), "{err}");
    // Nor does a right authority vouch for a name the certificate lacks.
    let uri = server
        .uri()
        .replace("tls-hostname=localhost", "tls-hostname=store.example");
    let err = open_uri(&uri, DEFAULT_RECONNECT_TIMEOUT)
        .unwrap_err()
        .to_string();
    assert!(err.contains("TLS handshake refused"), "{err}");
    assert!(err.contains("store.example"), "{err}");
    // Without checking, the same server is reached (still encrypted).
    let uri = format!(
        "{}&tls-verify-peer=false",
        uri.replace(
            &certs.dir.display().to_string(),
            &stranger.dir.display().to_string()
        )
    );
    let f = open_uri(&uri, DEFAULT_RECONNECT_TIMEOUT).expect("tls-verify-peer=false connects");
    assert_eq!(f.len_bytes().unwrap(), 8 << 20);
}

#[test]
fn plain_and_tls_clients_are_told_which_scheme_the_server_wants() {
    let certs = TlsCertificates::new();
    let Some(tls_server) =
        NbdServer::nbdkit_tls("nbd tls required", &certs, &["memory", "size=8M"])
    else {
        return;
    };
    let plain_uri = format!(
        "nbd+unix:///?socket={}",
        tls_server
            .uri()
            .split("socket=")
            .nth(1)
            .and_then(|rest| rest.split('&').next())
            .expect("a socket in the URI")
    );
    let err = open_uri(&plain_uri, DEFAULT_RECONNECT_TIMEOUT)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("requires TLS") && err.contains("nbds://"),
        "{err}"
    );

    let Some(plain_server) = NbdServer::nbdkit("nbd tls not offered", &["memory", "size=8M"])
    else {
        return;
    };
    let uri = format!(
        "{}&tls-certificates={}&tls-hostname=localhost",
        plain_server.uri().replacen("nbd+unix", "nbds+unix", 1),
        certs.dir.display()
    );
    let err = open_uri(&uri, DEFAULT_RECONNECT_TIMEOUT)
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not offer TLS"), "{err}");
}

#[test]
fn missing_or_unreadable_certificates_are_named_at_open() {
    let dir = std::env::temp_dir().join(format!("hugevmm-no-certs-{}", std::process::id()));
    let uri: NbdUri = format!("nbds://127.0.0.1:1/x?tls-certificates={}", dir.display())
        .parse()
        .unwrap();
    let err = BlockFile::open_nbd(&uri, &NbdOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("ca-cert.pem"), "{err}");
    assert!(err.contains("tls-certificates=DIR"), "{err}");
}

//! The API socket under a real VM: clients that connect and say nothing,
//! or trickle a byte at a time, block neither other clients nor the VM,
//! and are dropped with a 408; requests from several clients run at once.

use integration_tests::*;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

/// How long a raw client waits for the server's line before the test
/// fails: a bound against hanging, not a measurement (the server's idle
/// timeout is 10 s).
const GUARD: Duration = Duration::from_secs(120);

/// The response the server sends before closing a connection (empty if
/// it closed without one).
fn last_words(stream: &UnixStream) -> String {
    stream.set_read_timeout(Some(GUARD)).unwrap();
    let mut text = Vec::new();
    match (&*stream).read_to_end(&mut text) {
        Ok(_) => {}
        // Closed with our bytes unread: Linux reports a reset.
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the server never dropped the client: {e}"),
    }
    String::from_utf8_lossy(&text).into_owned()
}

fn assert_dropped_for_idling(stream: &UnixStream, who: &str) {
    let reply = last_words(stream);
    assert!(reply.starts_with("HTTP/1.1 408 "), "{who}: {reply}");
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no complete request"),
        "{who}: {body}"
    );
}

#[test]
fn silent_and_trickling_clients_block_nobody() {
    if skip_without_kvm("silent_and_trickling_clients_block_nobody") {
        return;
    }
    let (vm, socket) = start_with_api_socket(&[
        "run",
        "--payload",
        "verify",
        "--vcpus",
        "2",
        "--mem",
        "256M",
        "--mem-limit",
        "64M",
        // Far more passes than the test waits for: `quit` ends it.
        "--payload-args",
        "passes=100000",
    ]);
    // Connected first and silent: a server of one client at a time would
    // serve only it, and `ctl` would time out.
    let silent = UnixStream::connect(&socket).unwrap();
    let stats = ctl(&socket, &["stats"]);
    assert_eq!(stats["vcpus"], 2, "{stats}");

    // Two pageouts at once from two clients: both answer (one after the
    // other inside the VMM), while a third client reads stats.
    let pageouts: Vec<_> = (0..2)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || ctl(&socket, &["pageout"]))
        })
        .collect();
    assert!(ctl(&socket, &["stats"])["elapsed_s"].is_f64());
    for pageout in pageouts {
        let reply = pageout.join().unwrap();
        assert!(reply["written_bytes"].as_u64().is_some(), "{reply}");
    }

    // A byte every half second, never a whole request.
    let trickling = UnixStream::connect(&socket).unwrap();
    let mut writer = trickling.try_clone().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let trickle_done = done.clone();
    let trickler = std::thread::spawn(move || {
        let mut bytes = b"GET /stats HTTP/1.1\r\n".iter().cycle();
        while !trickle_done.load(Ordering::Relaxed)
            && writer.write_all(&[*bytes.next().unwrap()]).is_ok()
        {
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    assert!(ctl(&socket, &["stats"])["elapsed_s"].is_f64());
    assert_dropped_for_idling(&trickling, "trickling client");
    done.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
    assert_dropped_for_idling(&silent, "silent client");

    assert_eq!(ctl(&socket, &["quit"])["quitting"], true);
    let run = vm.finish(LIMIT);
    run.expect_status(0);
    assert!(!run.stdout.contains("MISMATCH"), "{}", run.stdout);
    assert!(!socket.exists(), "the socket is removed");
}

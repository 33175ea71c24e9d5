//! The API's HTTP request framing (`vmm::control::http`,
//! `vmm/src/control/http.rs`) fed as a client's bytes arrive: in pieces
//! of the sizes the input chooses, cut into requests the way the control
//! server's connection loop cuts them.
//!
//! Checks what the server relies on:
//! - the connection buffer stays bounded: while a request is partial the
//!   server never holds more than the largest head plus the largest body;
//! - a complete request takes at least one byte and no more than was
//!   received, its path is origin-form, its body is within the cap and is
//!   exactly the bytes after its head;
//! - a request does not depend on the bytes after it, and every strict
//!   prefix of one is partial (a slow client never gets an error that a
//!   fast one would not);
//! - an error maps to one of the statuses the API answers framing errors
//!   with, and its message (sent to the client) is bounded.

use crate::input::Input;
use vmm::control::http::{self, Parsed, MAX_BODY_BYTES, MAX_HEAD_BYTES};

/// Longest error message the framing code may send back: its fixed text
/// plus an echo that [`http::shorten`] cuts to 60 characters.
const MAX_ERROR_MESSAGE_CHARS: usize = 400;

/// Runs one input: a byte giving the arrival piece size, then the bytes
/// the client sends.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    // 0 sends everything at once; otherwise pieces of 1..=255 bytes.
    let piece_bytes = usize::from(input.u8());
    let wire = input.rest();
    let pieces: Vec<&[u8]> = if piece_bytes == 0 {
        vec![wire]
    } else {
        wire.chunks(piece_bytes).collect()
    };
    let mut pending: Vec<u8> = Vec::new();
    for piece in pieces {
        pending.extend_from_slice(piece);
        loop {
            match http::parse(&pending) {
                Ok(Parsed::Complete(request, used)) => {
                    check_complete(&pending, &request, used);
                    pending.drain(..used);
                    if request.close {
                        // The server answers and closes: the rest is unread.
                        return;
                    }
                }
                Ok(Parsed::Partial) => {
                    assert!(
                        pending.len() <= MAX_HEAD_BYTES + MAX_BODY_BYTES,
                        "a partial request holds {} bytes",
                        pending.len()
                    );
                    break;
                }
                Err(err) => {
                    assert!(
                        [400, 411, 413, 431, 505].contains(&err.status()),
                        "{err:?} answered with {}",
                        err.status()
                    );
                    let message = err.to_string();
                    assert!(
                        message.chars().count() <= MAX_ERROR_MESSAGE_CHARS,
                        "an error message of {} characters: {message}",
                        message.chars().count()
                    );
                    // The server answers and closes the connection.
                    return;
                }
            }
        }
    }
}

fn check_complete(pending: &[u8], request: &http::Request, used: usize) {
    assert!(
        used > 0 && used <= pending.len(),
        "took {used} of {}",
        pending.len()
    );
    assert!(request.path.starts_with('/'), "path {:?}", request.path);
    assert!(
        !request.path.contains(['?', '#']),
        "path {:?}",
        request.path
    );
    assert!(request.body.len() <= MAX_BODY_BYTES);
    assert_eq!(
        &pending[used - request.body.len()..used],
        &request.body[..],
        "the body is not the bytes ending the request"
    );
    // The same request from exactly its own bytes.
    match http::parse(&pending[..used]) {
        Ok(Parsed::Complete(again, again_used)) => {
            assert_eq!(again_used, used);
            assert_eq!(&again, request, "the request depends on the bytes after it");
        }
        other => panic!("a request alone parses as {other:?}"),
    }
    // Every strict prefix is partial. Checking all of them is quadratic;
    // a sample of cuts (each end, and evenly between) finds the same bugs.
    let cuts = [
        0,
        1,
        used / 4,
        used / 2,
        used - used / 4,
        used.saturating_sub(2),
        used - 1,
    ];
    for cut in cuts.into_iter().filter(|&c| c < used) {
        assert_eq!(
            http::parse(&pending[..cut]),
            Ok(Parsed::Partial),
            "the first {cut} of {used} bytes of a request"
        );
    }
}

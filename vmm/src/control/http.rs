//! HTTP/1.1 framing for the API: requests cut out of a connection's bytes
//! (parsed by `httparse`), responses written out.
//!
//! Only what the API needs: bodies framed by `Content-Length` (the bodies
//! are a few dozen bytes of JSON, so chunked uploads buy nothing and are
//! refused with a reason), persistent connections unless the client says
//! `Connection: close` or speaks HTTP/1.0. Everything a client controls is
//! bounded before it is buffered: the head by [`MAX_HEAD_BYTES`] and
//! [`MAX_HEADERS`], the body by [`MAX_BODY_BYTES`], judged from the
//! declared length before any of it is read.

use serde_json::{json, Value};

/// Longest request head (request line and headers). curl's heads are a
/// few hundred bytes; the cap bounds what a confused client can make the
/// VMM buffer.
pub const MAX_HEAD_BYTES: usize = 8192;

/// Most header fields in a request.
pub const MAX_HEADERS: usize = 32;

/// Largest request body. The API's bodies are one small JSON object.
pub const MAX_BODY_BYTES: usize = 16384;

/// A request, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method as sent (methods are case-sensitive).
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The `Accept` header, if any.
    pub accept: Option<String>,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body (empty without one).
    pub body: Vec<u8>,
    /// The client wants the connection closed after the response.
    pub close: bool,
}

/// Why the bytes received are no request. Each is answered with
/// [`HttpError::status`] and the connection closed: after a framing error
/// nobody knows where the next request would start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The request line or a header does not parse.
    #[error("malformed HTTP request ({0}): send an HTTP/1.1 request such as `GET /vm HTTP/1.1` with a Host header, e.g. with curl --unix-socket PATH http://localhost/vm")]
    Malformed(String),
    /// The head is longer than [`MAX_HEAD_BYTES`] or has too many fields.
    #[error("request head larger than {MAX_HEAD_BYTES} bytes or with more than {MAX_HEADERS} header fields: send a shorter request")]
    HeadTooLarge,
    /// The declared body is longer than [`MAX_BODY_BYTES`].
    #[error("request body of {0} bytes is larger than the {MAX_BODY_BYTES} bytes accepted: the API's bodies are one small JSON object")]
    BodyTooLarge(u64),
    /// A body without a usable `Content-Length`.
    #[error("{0}: give the body's length in Content-Length (curl -d does)")]
    Length(&'static str),
    /// HTTP/2 and later are not spoken.
    #[error("HTTP version not supported: use HTTP/1.1")]
    Version,
}

impl HttpError {
    /// The status code it is answered with.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::Malformed(_) => 400,
            HttpError::HeadTooLarge => 431,
            HttpError::BodyTooLarge(_) => 413,
            HttpError::Length(_) => 411,
            HttpError::Version => 505,
        }
    }
}

/// What [`parse`] made of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole request, and how many bytes of the buffer it took.
    Complete(Request, usize),
    /// Not a whole request yet: read more.
    Partial,
}

fn header_text(value: &[u8]) -> Result<String, HttpError> {
    std::str::from_utf8(value)
        .map(|v| v.trim().to_string())
        .map_err(|_| HttpError::Malformed("a header value is not text".into()))
}

/// Cuts the first request out of `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let head_len = match request.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n > MAX_HEAD_BYTES => {
            return Err(HttpError::HeadTooLarge)
        }
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
            return Err(HttpError::HeadTooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeadTooLarge),
        Err(httparse::Error::Version) => return Err(HttpError::Version),
        Err(e) => return Err(HttpError::Malformed(e.to_string())),
    };
    let method = request.method.unwrap_or_default().to_string();
    let target = request.path.unwrap_or_default();
    // Origin-form only: the API has no proxy to be the target of.
    if !target.starts_with('/') {
        return Err(HttpError::Malformed(format!(
            "the request target must be a path starting with /, not {:?}",
            shorten(target)
        )));
    }
    let path = target
        .split(['?', '#'])
        .next()
        .unwrap_or(target)
        .to_string();
    let http_10 = request.version == Some(0);
    let mut accept = None;
    let mut content_type = None;
    let mut content_length: Option<u64> = None;
    let mut close = http_10;
    for header in request.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        match name.as_str() {
            "accept" => accept = Some(header_text(header.value)?),
            "content-type" => content_type = Some(header_text(header.value)?),
            "content-length" => {
                let text = header_text(header.value)?;
                let length = text
                    .parse::<u64>()
                    .map_err(|_| HttpError::Length("Content-Length is not a number"))?;
                if content_length.is_some_and(|l| l != length) {
                    return Err(HttpError::Length("two different Content-Length headers"));
                }
                content_length = Some(length);
            }
            "transfer-encoding" => {
                return Err(HttpError::Length("chunked bodies are not accepted"));
            }
            "connection" => {
                let text = header_text(header.value)?.to_ascii_lowercase();
                if text.split(',').any(|t| t.trim() == "close") {
                    close = true;
                } else if text.split(',').any(|t| t.trim() == "keep-alive") {
                    close = false;
                }
            }
            _ => {}
        }
    }
    let body_len = content_length.unwrap_or(0);
    if body_len > MAX_BODY_BYTES as u64 {
        return Err(HttpError::BodyTooLarge(body_len));
    }
    let total = head_len + body_len as usize;
    if buf.len() < total {
        return Ok(Parsed::Partial);
    }
    Ok(Parsed::Complete(
        Request {
            method,
            path,
            accept,
            content_type,
            body: buf[head_len..total].to_vec(),
            close,
        },
        total,
    ))
}

/// Longest piece of a request echoed in an error message.
const MAX_ECHO_CHARS: usize = 60;

/// Echoed text is cut so that error messages stay short.
pub fn shorten(text: &str) -> String {
    if text.chars().count() <= MAX_ECHO_CHARS {
        return text.to_string();
    }
    let mut short: String = text.chars().take(MAX_ECHO_CHARS).collect();
    short.push_str("...");
    short
}

/// The JSON media type of the API's bodies.
pub const JSON: &str = "application/json";

/// A response to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Content-Type` of the body.
    pub content_type: String,
    /// The body.
    pub body: Vec<u8>,
    /// `Allow` (for 405s).
    pub allow: Option<String>,
}

impl Response {
    /// A JSON body.
    pub fn json(status: u16, value: &Value) -> Self {
        let mut body = value.to_string().into_bytes();
        body.push(b'\n');
        Self {
            status,
            content_type: JSON.into(),
            body,
            allow: None,
        }
    }

    /// The API's error object: `{"error": {"status": N, "message": "..."}}`,
    /// the message saying what to do instead.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Self::json(
            status,
            &json!({ "error": { "status": status, "message": message.into() } }),
        )
    }

    /// The bytes on the wire; `close` adds `Connection: close`.
    pub fn to_bytes(&self, close: bool) -> Vec<u8> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nServer: hugevmm\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        if let Some(allow) = &self.allow {
            head.push_str(&format!("Allow: {allow}\r\n"));
        }
        if close {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// The reason phrase of the status codes the API uses.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(bytes: &[u8]) -> (Request, usize) {
        match parse(bytes) {
            Ok(Parsed::Complete(r, n)) => (r, n),
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
        }
    }

    #[test]
    fn requests_parse_and_split() {
        let two = b"GET /vm?x=1 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\nPUT /balloon HTTP/1.1\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}";
        let (first, n) = complete(two);
        assert_eq!(first.method, "GET");
        assert_eq!(first.path, "/vm");
        assert_eq!(first.accept.as_deref(), Some("*/*"));
        assert!(first.body.is_empty() && !first.close);
        let (second, m) = complete(&two[n..]);
        assert_eq!(n + m, two.len());
        assert_eq!(second.method, "PUT");
        assert_eq!(second.body, b"{}");
        assert_eq!(second.content_type.as_deref(), Some("application/json"));
        // Every prefix is partial, never an error.
        for cut in 0..n {
            assert_eq!(parse(&two[..cut]), Ok(Parsed::Partial), "{cut}");
        }
        let (r, _) = complete(b"GET / HTTP/1.0\r\n\r\n");
        assert!(r.close, "HTTP/1.0 closes");
        let (r, _) = complete(b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n");
        assert!(r.close);
    }

    #[test]
    fn bad_requests_say_why() {
        for garbage in [
            &b"stats\r\n\r\n"[..],
            b"GET\r\n\r\n",
            b"GET /vm HTTP/1.1\r\nno colon\r\n\r\n",
            b"\xff\xfe\r\n\r\n",
            b"GET http://x/vm HTTP/1.1\r\n\r\n",
        ] {
            let err = parse(garbage).unwrap_err();
            assert_eq!(err.status(), 400, "{garbage:?}: {err}");
            assert!(err.to_string().contains("GET /vm HTTP/1.1"), "{err}");
        }
        assert_eq!(
            parse(b"GET / HTTP/2.0\r\n\r\n").unwrap_err(),
            HttpError::Version
        );
        let big = format!(
            "PUT /balloon HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        assert_eq!(parse(big.as_bytes()).unwrap_err().status(), 413);
        let chunked = b"PUT /balloon HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(parse(chunked).unwrap_err().status(), 411);
        let two = b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(parse(two).unwrap_err().status(), 411);
        let long_head = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(parse(long_head.as_bytes()).unwrap_err().status(), 431);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: y\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parse(many.as_bytes()).unwrap_err().status(), 431);
        // Every byte value alone, and a mix, gives some result.
        for b in 0..=255u8 {
            let _ = parse(&[b]);
            let _ = parse(&[b'G', b, b' ', b'/', b, b'\r', b'\n', b'\r', b'\n']);
        }
    }

    #[test]
    fn responses_are_framed() {
        let r = Response::error(404, "no such path");
        let text = String::from_utf8(r.to_bytes(true)).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 404 Not Found\r\n"), "{head}");
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert!(head.contains("Connection: close"));
        let value: Value = serde_json::from_str(body).unwrap();
        assert_eq!(value["error"]["status"], 404);
        assert_eq!(value["error"]["message"], "no such path");
    }
}

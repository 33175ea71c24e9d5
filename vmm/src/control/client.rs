//! `hugevmm ctl`: a client of the API. It turns its words (`stats`,
//! `balloon 256M`, ...) into the API request they stand for, sends it over
//! the Unix socket and prints the JSON body; with `--watch`, repeats it
//! until the VM ends (for `stats`, as one line of rates per interval).

use super::command::{help, parse_words, ApiRequest};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Largest response accepted: `GET /stats` is a few KiB.
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// Arguments of `hugevmm ctl`.
#[derive(clap::Args)]
pub struct CtlArgs {
    /// The control socket of a VM started with `hugevmm run --api-socket PATH`.
    #[arg(long, value_name = "PATH")]
    api_socket: PathBuf,
    /// Give up if no reply arrives within this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    timeout: f64,
    /// Repeat the command every SECONDS until the VM ends, connecting
    /// afresh each time (the VMM drops a connection idle for 10 s).
    /// `stats` is then shown as one line of rates per interval; other
    /// commands as their JSON replies.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
    /// The command: `balloon SIZE`, `balloon-stats`, `stats`,
    /// `mem-limit SIZE|none`, `pageout`, `quit` or `help`.
    #[arg(
        value_name = "WORDS",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<String>,
}

/// Sends the command, prints the JSON reply on stdout and returns the exit
/// status: 0 for an `"ok": true` reply, 1 otherwise (with the error on
/// stderr). With `--watch`, see [`watch`].
pub fn run(args: CtlArgs) -> Result<i32> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    let words: Vec<&str> = args.command.iter().map(String::as_str).collect();
    let command = parse_words(&words)?;
    let Some(request) = command.request() else {
        println!("{}", help());
        return Ok(0);
    };
    if let Some(interval) = args.watch {
        if !(interval.is_finite() && interval >= 0.05) {
            bail!("--watch takes an interval of at least 0.05 seconds");
        }
        return watch(&args, &request, Duration::from_secs_f64(interval));
    }
    let reply = exchange(&args, &request)?;
    print_reply(&reply)
}

/// A response: status code and JSON body.
pub(crate) struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body.
    pub body: serde_json::Value,
}

/// Prints a reply's body; the exit status for it (1 unless 2xx, with the
/// API's message on stderr).
fn print_reply(reply: &Reply) -> Result<i32> {
    println!("{}", reply.body);
    if (200..300).contains(&reply.status) {
        return Ok(0);
    }
    let message = reply.body["error"]["message"]
        .as_str()
        .unwrap_or("the API gave no message");
    eprintln!("hugevmm: error: {message} (HTTP {})", reply.status);
    Ok(1)
}

/// Repeats the command until the VM ends: exit 0 then (after at least one
/// reply), 1 on an error reply or if the first connection fails.
fn watch(args: &CtlArgs, request: &ApiRequest, interval: Duration) -> Result<i32> {
    let stats = request.path == "/stats";
    let mut previous: Option<serde_json::Value> = None;
    loop {
        let reply = match exchange(args, request) {
            Ok(reply) => reply,
            // The VM ended (its socket is gone): the watch is over.
            Err(_) if previous.is_some() => {
                eprintln!("hugevmm: the VM has ended (its control socket is gone)");
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        if !(200..300).contains(&reply.status) {
            return print_reply(&reply);
        }
        let value = reply.body;
        if stats {
            if previous.is_none() {
                println!("{}", super::watch::HEADER);
            }
            println!("{}", super::watch::line(previous.as_ref(), &value));
        } else {
            println!("{value}");
        }
        std::io::stdout().flush()?;
        previous = Some(value);
        std::thread::sleep(interval);
    }
}

/// One connection: sends the request, returns the response.
fn exchange(args: &CtlArgs, request: &ApiRequest) -> Result<Reply> {
    call(
        &args.api_socket,
        Duration::from_secs_f64(args.timeout),
        request,
    )
}

/// One request to the API at `socket` (one connection, closed after the
/// response), with `timeout` for each read and write; the response.
pub(crate) fn call(socket: &Path, timeout: Duration, request: &ApiRequest) -> Result<Reply> {
    let shown = socket.display();
    let start_hint = format!("start the VM with `hugevmm run --api-socket {shown} ...`");
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        ErrorKind::NotFound => anyhow!("no API socket at {shown}: {start_hint}"),
        ErrorKind::ConnectionRefused => {
            anyhow!("nothing listens on {shown} (a socket left by a VM that ended?): {start_hint}")
        }
        _ => anyhow!("cannot connect to the API socket {shown}: {e}"),
    })?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let body = request.body.as_deref().unwrap_or_default();
    let mut message = format!(
        "{} {} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\n",
        request.method, request.path
    );
    if request.body.is_some() {
        message.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    message.push_str("\r\n");
    message.push_str(body);
    stream
        .write_all(message.as_bytes())
        .with_context(|| format!("cannot send the request to {shown}"))?;
    // The server closes after the response (Connection: close), so the
    // response is everything up to the end.
    let mut bytes = Vec::new();
    (&stream)
        .take(MAX_RESPONSE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => anyhow!(
                "no response from {shown} within {} s (is the VM stuck, or a long request such as pageout still running?)",
                timeout.as_secs_f64()
            ),
            _ => anyhow!("cannot read the response from {shown}: {e}"),
        })?;
    if bytes.is_empty() {
        bail!("the VM closed {shown} without responding (did it just end?)");
    }
    if bytes.len() > MAX_RESPONSE_BYTES {
        bail!("the response from {shown} is larger than {MAX_RESPONSE_BYTES} bytes");
    }
    parse_response(&bytes).with_context(|| format!("bad response from {shown}"))
}

/// Status and JSON body of a whole response.
fn parse_response(bytes: &[u8]) -> Result<Reply> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(bytes)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => bail!("the response ends inside its head"),
    };
    let status = response.code.unwrap_or_default();
    let length = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        });
    let rest = &bytes[head..];
    let body = match length {
        Some(n) if n <= rest.len() => &rest[..n],
        Some(n) => bail!("the body is {} bytes, Content-Length says {n}", rest.len()),
        None => rest,
    };
    let body = serde_json::from_slice(body).with_context(|| {
        format!(
            "the body (HTTP {status}) is not JSON: {}",
            String::from_utf8_lossy(body).trim_end()
        )
    })?;
    Ok(Reply { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse() {
        let reply =
            parse_response(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 12\r\n\r\n{\"error\":{}}")
                .unwrap();
        assert_eq!(reply.status, 400);
        assert!(reply.body["error"].is_object());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{}").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n\r\nnot json").is_err());
        assert!(parse_response(b"garbage").is_err());
    }
}

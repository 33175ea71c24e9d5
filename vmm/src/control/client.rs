//! `hugevmm ctl`: sends one command to a running VM's control socket and
//! prints the reply.

use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `hugevmm ctl`.
#[derive(clap::Args)]
pub struct CtlArgs {
    /// The control socket of a VM started with `hugevmm run --api-socket PATH`.
    #[arg(long, value_name = "PATH")]
    api_socket: PathBuf,
    /// Give up if no reply arrives within this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    timeout: f64,
    /// The command: `balloon SIZE`, `balloon-stats`, `stats` or `help`.
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
/// stderr).
pub fn run(args: CtlArgs) -> Result<i32> {
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    if args.command.iter().any(|w| w.contains(['\n', '\r'])) {
        bail!("command words must not contain line breaks: the protocol is one command per line");
    }
    let shown = args.api_socket.display();
    let start_hint = format!("start the VM with `hugevmm run --api-socket {shown} ...`");
    let mut stream = UnixStream::connect(&args.api_socket).map_err(|e| match e.kind() {
        ErrorKind::NotFound => anyhow!("no control socket at {shown}: {start_hint}"),
        ErrorKind::ConnectionRefused => {
            anyhow!("nothing listens on {shown} (a socket left by a VM that ended?): {start_hint}")
        }
        _ => anyhow!("cannot connect to the control socket {shown}: {e}"),
    })?;
    let timeout = Duration::from_secs_f64(args.timeout);
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let line = args.command.join(" ") + "\n";
    stream
        .write_all(line.as_bytes())
        .with_context(|| format!("cannot send the command to {shown}"))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => anyhow!(
                "no reply from {shown} within {} s (the VM serves one client at a time: is another one connected?)",
                args.timeout
            ),
            _ => anyhow!("cannot read the reply from {shown}: {e}"),
        })?;
    if !reply.ends_with('\n') {
        bail!("the VM closed {shown} without replying (did it just end?)");
    }
    let value: serde_json::Value = serde_json::from_str(&reply)
        .with_context(|| format!("the reply from {shown} is not JSON: {}", reply.trim_end()))?;
    println!("{}", reply.trim_end());
    if value["ok"] == true {
        return Ok(0);
    }
    let error = value["error"]
        .as_str()
        .unwrap_or("the reply says ok: false");
    eprintln!("hugevmm: error: {error}");
    Ok(1)
}

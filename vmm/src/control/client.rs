//! `hugevmm ctl`: sends one command to a running VM's control socket and
//! prints the reply; with `--watch`, repeats it until the VM ends (for
//! `stats`, as one line of rates per interval).

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
    if args.command.iter().any(|w| w.contains(['\n', '\r'])) {
        bail!("command words must not contain line breaks: the protocol is one command per line");
    }
    if let Some(interval) = args.watch {
        if !(interval.is_finite() && interval >= 0.05) {
            bail!("--watch takes an interval of at least 0.05 seconds");
        }
        return watch(&args, Duration::from_secs_f64(interval));
    }
    let value = exchange(&args)?;
    print_reply(&value)
}

/// Prints a reply; the exit status for it.
fn print_reply(value: &serde_json::Value) -> Result<i32> {
    println!("{value}");
    if value["ok"] == true {
        return Ok(0);
    }
    let error = value["error"]
        .as_str()
        .unwrap_or("the reply says ok: false");
    eprintln!("hugevmm: error: {error}");
    Ok(1)
}

/// Repeats the command until the VM ends: exit 0 then (after at least one
/// reply), 1 on an error reply or if the first connection fails.
fn watch(args: &CtlArgs, interval: Duration) -> Result<i32> {
    let stats = args.command == ["stats"];
    let mut previous: Option<serde_json::Value> = None;
    loop {
        let value = match exchange(args) {
            Ok(value) => value,
            // The VM ended (its socket is gone): the watch is over.
            Err(_) if previous.is_some() => {
                eprintln!("hugevmm: the VM has ended (its control socket is gone)");
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        if value["ok"] != true {
            return print_reply(&value);
        }
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

/// One connection: sends the command, returns the parsed reply.
fn exchange(args: &CtlArgs) -> Result<serde_json::Value> {
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
                "no reply from {shown} within {} s (is the VM stuck, or a long command such as pageout still running?)",
                args.timeout
            ),
            _ => anyhow!("cannot read the reply from {shown}: {e}"),
        })?;
    if !reply.ends_with('\n') {
        bail!("the VM closed {shown} without replying (did it just end?)");
    }
    serde_json::from_str(&reply)
        .with_context(|| format!("the reply from {shown} is not JSON: {}", reply.trim_end()))
}

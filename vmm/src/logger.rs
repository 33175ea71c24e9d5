//! Where the library crates' log records go: stderr, one line each, in
//! the format the VMM's own messages use (`hugevmm: ...`), so that a
//! warning from `devices` or `guestmem` reads like one from `vmm`.
//!
//! Warnings and errors are printed by default; `HUGEVMM_LOG` (`error`,
//! `warn`, `info`, `debug`, `trace` or `off`) changes the level.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;

struct StderrLogger;

static LOGGER: StderrLogger = StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // Records the guest can cause at will are rate limited per kind.
        // virtio-queue logs what it finds wrong in the guest's rings.
        let target = record.target();
        let kind = match target.strip_prefix(GUEST_TARGET) {
            Some(kind) => Some(guest_kind(kind)),
            None if target.starts_with("virtio_queue") => Some("virtio"),
            None => None,
        };
        if let Some(kind) = kind {
            if !crate::ratelimit::global().allow(kind) {
                return;
            }
        }
        // One write per line under stderr's lock, so lines from several
        // threads do not interleave. A failed write has nowhere to go.
        let line = line(record.level(), record.target(), record.args());
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// The log target prefix that marks a guest-triggered record:
/// `log::warn!(target: "guest::virtio", ...)` in the library crates;
/// records of the `virtio_queue` crate count as `virtio` too.
const GUEST_TARGET: &str = "guest::";

/// The rate limiter's kind for a guest target's suffix; the limiter keys
/// by `&'static str`, and the known kinds are few.
fn guest_kind(kind: &str) -> &'static str {
    match kind {
        "virtio" => "virtio",
        "balloon" => "balloon",
        _ => "other",
    }
}

/// The line printed for a record: warnings and errors as the VMM's own
/// messages are (`hugevmm: ...`, which tests and users grep for), the
/// rest with their level and module.
fn line(level: Level, target: &str, args: &std::fmt::Arguments) -> String {
    match level {
        Level::Error | Level::Warn => format!("hugevmm: {args}\n"),
        level => format!(
            "hugevmm: {}: {target}: {args}\n",
            level.as_str().to_lowercase()
        ),
    }
}

/// Installs the logger; called once, first thing in `main`.
pub fn init() {
    let level = std::env::var("HUGEVMM_LOG")
        .ok()
        .and_then(|v| v.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::Warn);
    // Fails only if a logger is already installed, which keeps that one.
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_read_like_the_vmms_own_messages() {
        assert_eq!(
            line(
                Level::Warn,
                "devices::virtio::block",
                &format_args!("virtio-blk x: y")
            ),
            "hugevmm: virtio-blk x: y\n"
        );
        assert_eq!(
            line(
                Level::Error,
                "guestmem::ram",
                &format_args!("cannot delete")
            ),
            "hugevmm: cannot delete\n"
        );
        assert_eq!(
            line(Level::Info, "swap", &format_args!("started")),
            "hugevmm: info: swap: started\n"
        );
    }
}

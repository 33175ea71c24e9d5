//! Where the library crates' log records go: stderr, one line each, in
//! the format the VMM's own messages use (`hugevmm: ...`), so that a
//! warning from `devices` or `guestmem` reads like one from `vmm`.
//!
//! Warnings and errors are printed by default; `HUGEVMM_LOG` (`error`,
//! `warn`, `info`, `debug`, `trace` or `off`) changes the level. `info`
//! adds the events that let a user follow a run (the swap engine's start
//! and its store, memory limit changes, NBD reconnects); `debug` adds the
//! engine's policy decisions (splits and collapses, summarized: see
//! `swap::engine::log_budget`) and store retries. Another value is refused
//! (the command ends with status 1), so that a typo does not silently
//! mean "warnings only".

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

/// The levels `HUGEVMM_LOG` takes, for its error.
const LEVELS: &str = "error, warn (the default), info, debug, trace or off";

/// The level `HUGEVMM_LOG` asks for: unset or empty is the default
/// (warnings and errors); a word that is no level is refused, naming the
/// ones there are.
fn level_from(value: Result<String, std::env::VarError>) -> Result<LevelFilter, String> {
    match value {
        Err(std::env::VarError::NotPresent) => Ok(LevelFilter::Warn),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!(
            "HUGEVMM_LOG={} is not a log level: give {LEVELS}",
            v.to_string_lossy()
        )),
        Ok(v) if v.trim().is_empty() => Ok(LevelFilter::Warn),
        Ok(v) => v
            .trim()
            .parse::<LevelFilter>()
            .map_err(|_| format!("HUGEVMM_LOG={v} is not a log level: give {LEVELS}")),
    }
}

/// Installs the logger; called once, first thing in `main`. A refused
/// `HUGEVMM_LOG` is returned (the logger then prints warnings and errors,
/// as by default) for the command to end with.
pub fn init() -> Result<(), String> {
    let level = level_from(std::env::var("HUGEVMM_LOG"));
    // Fails only if a logger is already installed, which keeps that one.
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(*level.as_ref().unwrap_or(&LevelFilter::Warn));
    }
    level.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_level_is_refused_naming_the_levels() {
        use std::env::VarError;
        let err = level_from(Ok("bogus".into())).unwrap_err();
        assert_eq!(
            err,
            "HUGEVMM_LOG=bogus is not a log level: give error, warn (the default), info, debug, trace or off"
        );
        assert!(level_from(Ok("infoo".into())).is_err());
        assert_eq!(level_from(Err(VarError::NotPresent)), Ok(LevelFilter::Warn));
        assert_eq!(level_from(Ok(String::new())), Ok(LevelFilter::Warn));
        assert_eq!(level_from(Ok("debug".into())), Ok(LevelFilter::Debug));
        assert_eq!(level_from(Ok("INFO".into())), Ok(LevelFilter::Info));
        assert_eq!(level_from(Ok(" off ".into())), Ok(LevelFilter::Off));
    }

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

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
        // One write per line under stderr's lock, so lines from several
        // threads do not interleave. A failed write has nowhere to go.
        let mut err = std::io::stderr().lock();
        let _ = match record.level() {
            Level::Error | Level::Warn => writeln!(err, "hugevmm: {}", record.args()),
            level => writeln!(
                err,
                "hugevmm: {}: {}: {}",
                level.as_str().to_lowercase(),
                record.target(),
                record.args()
            ),
        };
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
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

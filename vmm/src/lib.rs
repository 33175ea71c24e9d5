//! hugevmm: a minimal KVM VMM whose guest RAM lives in 2 MiB mappings.
//!
//! The `hugevmm` binary (`src/main.rs`) installs the logger and runs
//! [`cli::main`]. The library is also what `fuzz` builds its targets on:
//! the kernel image parsers ([`linux`]), the payload ELF check
//! ([`payload::elf`]), image recognition ([`image_kind`]) and the API's
//! HTTP framing ([`control::http`]). Every other module is private to the
//! crate.
#![deny(missing_docs)]

mod auto_limit;
mod balloon_handle;
pub mod cli;
mod console;
pub mod control;
mod cpu;
mod dumpable;
mod event;
mod exit;
mod host;
mod host_check;
mod host_terminal;
pub mod image_kind;
mod input_file;
pub mod linux;
pub mod logger;
mod machine_devices;
mod outcome;
mod outputs;
pub mod payload;
mod progress;
mod ratelimit;
mod run_options;
mod seccomp;
mod signals;
mod stats;
mod swap_setup;
mod vcpu;
mod vcpu_stop;
mod vm;

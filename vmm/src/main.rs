//! `hugevmm`: a minimal KVM VMM whose guest RAM lives in 2 MiB mappings.

mod balloon_handle;
mod cli;
mod console;
mod control;
mod cpu;
mod dumpable;
mod exit;
mod host_check;
mod image_kind;
mod input_file;
mod linux;
mod logger;
mod machine_devices;
mod outputs;
mod payload;
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

fn main() {
    let logging = logger::init();
    std::process::exit(cli::main(logging));
}

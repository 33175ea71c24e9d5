//! Coverage-guided fuzz targets for hugevmm: every parser a guest or a
//! user can reach, the devices as a guest drives them, and the swap engine
//! against a reference model. Each target is a `run(&[u8])` function on
//! the real code; `src/bin/hugevmm-fuzz.rs` hands them to libFuzzer
//! (`tools/fuzz TARGET SECONDS`), and `tests/` replays the committed
//! corpus and every crash found through the same functions in
//! `cargo test`. Tool choice, targets and figures: `docs/FUZZING.md`.
//!
//! The control API's HTTP request framing is the `api_request` target;
//! the routing behind it needs a running VM's context and is covered by
//! vmm's own tests.
#![deny(missing_docs)]

pub mod api_request;
pub mod decompress;
pub mod disk_spec;
pub mod engine;
pub mod input;
pub mod kernel_image;
pub mod mem_store;
pub mod nbd_handshake;
pub mod payload_elf;
pub mod seeds;
pub mod store_spec;
pub mod virtio;
pub mod virtio_balloon;
pub mod virtio_blk;
pub mod virtio_mmio;

/// A fuzz target.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Its name, as `tools/fuzz` takes it.
    pub name: &'static str,
    /// Runs one input; a panic is a crash.
    pub run: fn(&[u8]),
}

/// Every target, in the order CI runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "payload_elf",
        run: payload_elf::run,
    },
    Target {
        name: "kernel_image",
        run: kernel_image::run,
    },
    Target {
        name: "decompress",
        run: decompress::run,
    },
    Target {
        name: "store_spec",
        run: store_spec::run,
    },
    Target {
        name: "disk_spec",
        run: disk_spec::run,
    },
    Target {
        name: "mem_store",
        run: mem_store::run,
    },
    Target {
        name: "virtio_mmio",
        run: virtio_mmio::run,
    },
    Target {
        name: "virtio_blk",
        run: virtio_blk::run,
    },
    Target {
        name: "virtio_balloon",
        run: virtio_balloon::run,
    },
    Target {
        name: "engine",
        run: engine::run,
    },
    Target {
        name: "nbd_handshake",
        run: nbd_handshake::run,
    },
    Target {
        name: "api_request",
        run: api_request::run,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

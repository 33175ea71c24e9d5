//! How a Linux guest learns about a virtio-mmio device without firmware
//! tables: `virtio_mmio.device=<size>@<base>:<irq>` on its command line.

/// The kernel command-line fragment announcing a virtio-mmio device whose
/// registers are at `[base, base + size_bytes)` and whose interrupt is GSI
/// `irq`, e.g. `virtio_mmio.device=4K@0xd0000000:5`.
pub fn kernel_cmdline_fragment(base: u64, size_bytes: u64, irq: u32) -> String {
    // Linux parses the size with memparse, which takes K/M/G suffixes.
    let size = if size_bytes != 0 && size_bytes % (1 << 20) == 0 {
        format!("{}M", size_bytes >> 20)
    } else if size_bytes != 0 && size_bytes % (1 << 10) == 0 {
        format!("{}K", size_bytes >> 10)
    } else {
        size_bytes.to_string()
    };
    format!("virtio_mmio.device={size}@{base:#x}:{irq}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments() {
        assert_eq!(
            kernel_cmdline_fragment(0xd000_0000, 0x1000, 5),
            "virtio_mmio.device=4K@0xd0000000:5"
        );
        assert_eq!(
            kernel_cmdline_fragment(0xd010_0000, 2 << 20, 12),
            "virtio_mmio.device=2M@0xd0100000:12"
        );
        assert_eq!(
            kernel_cmdline_fragment(0x1000, 0x200, 7),
            "virtio_mmio.device=512@0x1000:7"
        );
    }
}

//! Port I/O that reaches the VMM as a #GP instead of an I/O exit.
//!
//! Payload protocol v1 promises port I/O at CPL 3 (RFLAGS.IOPL = 3). Some
//! KVM implementations do not honour IOPL for guest user mode: PVM, the
//! nested KVM of this project's hosts, runs guest CPL 3 code natively as
//! host user code and raises #GP on `in`/`out`. The VMM's #GP stub reports
//! the exception; this module decodes the faulting instruction so the VMM
//! can perform the access itself and resume the guest after it, keeping
//! the protocol's promise on such hosts.

/// One decoded `in`/`out` instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrappedIo {
    /// Port number.
    pub port: u16,
    /// Access size in bytes (1, 2 or 4).
    pub size: usize,
    /// `out` (true) or `in` (false).
    pub write: bool,
    /// Instruction length, to step over it.
    pub len: u64,
}

/// Decodes `bytes` (starting at the faulting rip) as a non-string `in` or
/// `out`; `rdx` supplies the port of the `(%dx)` forms.
pub fn decode(bytes: &[u8], rdx: u64) -> Option<TrappedIo> {
    let (opsize16, rest, prefix_len) = match bytes.first()? {
        0x66 => (true, &bytes[1..], 1),
        _ => (false, bytes, 0),
    };
    let wide = if opsize16 { 2 } else { 4 };
    let opcode = *rest.first()?;
    let (port, size, write, len) = match opcode {
        0xe4 => (u16::from(*rest.get(1)?), 1, false, 2),
        0xe5 => (u16::from(*rest.get(1)?), wide, false, 2),
        0xe6 => (u16::from(*rest.get(1)?), 1, true, 2),
        0xe7 => (u16::from(*rest.get(1)?), wide, true, 2),
        0xec => (rdx as u16, 1, false, 1),
        0xed => (rdx as u16, wide, false, 1),
        0xee => (rdx as u16, 1, true, 1),
        0xef => (rdx as u16, wide, true, 1),
        _ => return None,
    };
    Some(TrappedIo {
        port,
        size,
        write,
        len: len + prefix_len,
    })
}

/// The value of `rax` after an `in` of `size` bytes returned `data`.
pub fn merge_in_value(rax: u64, size: usize, data: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..size].copy_from_slice(&data[..size]);
    let value = u64::from_le_bytes(bytes);
    match size {
        // 32-bit destinations zero the upper half, as the CPU does.
        4 => value,
        _ => (rax & !((1u64 << (size * 8)) - 1)) | value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_form() {
        let out_dx_al = decode(&[0xee], 0x3f8).unwrap();
        assert_eq!(
            out_dx_al,
            TrappedIo {
                port: 0x3f8,
                size: 1,
                write: true,
                len: 1
            }
        );
        let out_dx_eax = decode(&[0xef, 0x90], 0xf4).unwrap();
        assert_eq!(
            out_dx_eax,
            TrappedIo {
                port: 0xf4,
                size: 4,
                write: true,
                len: 1
            }
        );
        let out_imm_ax = decode(&[0x66, 0xe7, 0x80], 0).unwrap();
        assert_eq!(
            out_imm_ax,
            TrappedIo {
                port: 0x80,
                size: 2,
                write: true,
                len: 3
            }
        );
        let in_imm_al = decode(&[0xe4, 0x61], 0).unwrap();
        assert_eq!(
            in_imm_al,
            TrappedIo {
                port: 0x61,
                size: 1,
                write: false,
                len: 2
            }
        );
        assert_eq!(
            decode(&[0xed], 0x1_0070).unwrap().port,
            0x70,
            "port is dx, 16 bits"
        );
        assert_eq!(decode(&[0x0f, 0x0b], 0), None, "ud2 is not I/O");
        assert_eq!(decode(&[0x6e], 0), None, "string I/O is not emulated");
        assert_eq!(decode(&[0xe6], 0), None, "truncated");
    }

    #[test]
    fn in_values_merge_like_the_cpu() {
        assert_eq!(
            merge_in_value(0xffff_ffff_ffff_ffff, 1, &[0x12]),
            0xffff_ffff_ffff_ff12
        );
        assert_eq!(
            merge_in_value(0xffff_ffff_ffff_ffff, 2, &[0x34, 0x12]),
            0xffff_ffff_ffff_1234
        );
        assert_eq!(merge_in_value(0xffff_ffff_ffff_ffff, 4, &[1, 0, 0, 0]), 1);
    }
}

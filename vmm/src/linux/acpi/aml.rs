//! The small part of AML (ACPI Machine Language, ACPI 6.5 chapter 20) the
//! DSDT needs: names, scopes, devices, integers, strings, packages and
//! resource templates. Only data objects are encoded; the DSDT has no
//! methods, so the guest's AML interpreter never runs code of ours.

/// Opcodes and prefixes (ACPI 6.5 §20.2).
mod op {
    pub const ZERO: u8 = 0x00;
    pub const ONE: u8 = 0x01;
    pub const NAME: u8 = 0x08;
    pub const BYTE_PREFIX: u8 = 0x0a;
    pub const WORD_PREFIX: u8 = 0x0b;
    pub const DWORD_PREFIX: u8 = 0x0c;
    pub const STRING_PREFIX: u8 = 0x0d;
    pub const QWORD_PREFIX: u8 = 0x0e;
    pub const SCOPE: u8 = 0x10;
    pub const BUFFER: u8 = 0x11;
    pub const PACKAGE: u8 = 0x12;
    pub const EXT_PREFIX: u8 = 0x5b;
    pub const DEVICE: u8 = 0x82;
    pub const ROOT_CHAR: u8 = b'\\';
    pub const DUAL_NAME_PREFIX: u8 = 0x2e;
    pub const MULTI_NAME_PREFIX: u8 = 0x2f;
}

/// Resource descriptor tags (ACPI 6.5 §6.4).
mod resource {
    /// Small item: IRQ descriptor with 2 bytes of data (no flags byte:
    /// ISA edge-triggered, active high).
    pub const IRQ_NO_FLAGS: u8 = 0x22;
    /// Small item: I/O port descriptor, 7 bytes of data.
    pub const IO_PORT: u8 = 0x47;
    /// Small item: end tag, 1 byte of data (the checksum).
    pub const END_TAG: u8 = 0x79;
    /// Large item: 32-bit fixed memory range.
    pub const MEMORY32_FIXED: u8 = 0x86;
    /// Large item: extended interrupt.
    pub const EXTENDED_INTERRUPT: u8 = 0x89;
}

/// Why a name cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmlError {
    /// A name segment is not 1-4 characters of `A-Z`, `0-9`, `_`, or starts
    /// with a digit.
    #[error("invalid AML name segment {0:?}: 1 to 4 of A-Z, 0-9 and _, not starting with a digit")]
    BadNameSegment(String),
}

/// Encodes a name path such as `\_SB`, `_HID` or `\_SB.V000`: an optional
/// root prefix, then dot-separated segments padded to four characters with
/// `_`, as AML's NameString requires.
pub fn name_string(path: &str) -> Result<Vec<u8>, AmlError> {
    let mut out = Vec::new();
    let relative = match path.strip_prefix('\\') {
        Some(rest) => {
            out.push(op::ROOT_CHAR);
            rest
        }
        None if path.is_empty() => return Err(AmlError::BadNameSegment(String::new())),
        None => path,
    };
    if relative.is_empty() {
        // The root itself: the root prefix followed by a null name.
        out.push(0);
        return Ok(out);
    }
    let segments = relative
        .split('.')
        .map(name_segment)
        .collect::<Result<Vec<_>, _>>()?;
    match segments.len() {
        1 => {}
        2 => out.push(op::DUAL_NAME_PREFIX),
        n => {
            out.push(op::MULTI_NAME_PREFIX);
            out.push(n as u8);
        }
    }
    segments.iter().for_each(|s| out.extend_from_slice(s));
    Ok(out)
}

fn name_segment(segment: &str) -> Result<[u8; 4], AmlError> {
    let bad = || AmlError::BadNameSegment(segment.to_string());
    let bytes = segment.as_bytes();
    let valid = |b: &u8| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_';
    if bytes.is_empty() || bytes.len() > 4 || !bytes.iter().all(valid) || bytes[0].is_ascii_digit()
    {
        return Err(bad());
    }
    let mut seg = [b'_'; 4];
    seg[..bytes.len()].copy_from_slice(bytes);
    Ok(seg)
}

/// A PkgLength followed by `body`: the length counts its own bytes too,
/// and takes 1 to 4 bytes depending on the total (§20.2.4).
fn with_pkg_length(body: &[u8]) -> Vec<u8> {
    let body_bytes = body.len();
    // One byte holds lengths below 2^6; n extra bytes add 8 bits each on
    // top of the first byte's low nibble.
    let (extra_bytes, total) = if body_bytes + 1 < 1 << 6 {
        (0, body_bytes + 1)
    } else if body_bytes + 2 < 1 << 12 {
        (1, body_bytes + 2)
    } else if body_bytes + 3 < 1 << 20 {
        (2, body_bytes + 3)
    } else {
        assert!(body_bytes + 4 < 1 << 28, "AML package too large");
        (3, body_bytes + 4)
    };
    let mut out = Vec::with_capacity(total);
    if extra_bytes == 0 {
        out.push(total as u8);
    } else {
        out.push(((extra_bytes as u8) << 6) | (total & 0xf) as u8);
        for i in 0..extra_bytes {
            out.push((total >> (4 + 8 * i)) as u8);
        }
    }
    out.extend_from_slice(body);
    out
}

/// An integer in its shortest encoding.
pub fn integer(value: u64) -> Vec<u8> {
    match value {
        0 => vec![op::ZERO],
        1 => vec![op::ONE],
        v if v <= u8::MAX as u64 => vec![op::BYTE_PREFIX, v as u8],
        v if v <= u16::MAX as u64 => [&[op::WORD_PREFIX][..], &(v as u16).to_le_bytes()].concat(),
        v if v <= u32::MAX as u64 => [&[op::DWORD_PREFIX][..], &(v as u32).to_le_bytes()].concat(),
        v => [&[op::QWORD_PREFIX][..], &v.to_le_bytes()].concat(),
    }
}

/// A string object; `text` must be ASCII without NUL.
pub fn string(text: &str) -> Vec<u8> {
    debug_assert!(text.is_ascii() && !text.contains('\0'));
    let mut out = vec![op::STRING_PREFIX];
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    out
}

/// A compressed EISA ID such as `PNP0501`, as the 32-bit integer `_HID`
/// and `_CID` take: three letters in 5 bits each, then four hex digits,
/// stored big-endian.
pub fn eisa_id(id: &str) -> Vec<u8> {
    let b = id.as_bytes();
    assert!(
        b.len() == 7
            && b[..3].iter().all(u8::is_ascii_uppercase)
            && b[3..].iter().all(u8::is_ascii_hexdigit),
        "EISA ID {id:?} is not three letters and four hex digits"
    );
    let letter = |c: u8| u32::from(c - b'@') & 0x1f;
    let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0);
    let value = (letter(b[0]) << 26)
        | (letter(b[1]) << 21)
        | (letter(b[2]) << 16)
        | (hex(b[3]) << 12)
        | (hex(b[4]) << 8)
        | (hex(b[5]) << 4)
        | hex(b[6]);
    [&[op::DWORD_PREFIX][..], &value.swap_bytes().to_le_bytes()].concat()
}

/// `Name(path, object)`.
pub fn name(path: &str, object: &[u8]) -> Result<Vec<u8>, AmlError> {
    Ok([&[op::NAME][..], &name_string(path)?, object].concat())
}

/// `Scope(path) { terms }`.
pub fn scope(path: &str, terms: &[u8]) -> Result<Vec<u8>, AmlError> {
    let body = [name_string(path)?, terms.to_vec()].concat();
    Ok([vec![op::SCOPE], with_pkg_length(&body)].concat())
}

/// `Device(name) { terms }`.
pub fn device(path: &str, terms: &[u8]) -> Result<Vec<u8>, AmlError> {
    let body = [name_string(path)?, terms.to_vec()].concat();
    Ok([vec![op::EXT_PREFIX, op::DEVICE], with_pkg_length(&body)].concat())
}

/// `Package() { elements }` of already-encoded data objects.
pub fn package(elements: &[Vec<u8>]) -> Vec<u8> {
    assert!(elements.len() <= u8::MAX as usize, "AML package too long");
    let mut body = vec![elements.len() as u8];
    elements.iter().for_each(|e| body.extend_from_slice(e));
    [vec![op::PACKAGE], with_pkg_length(&body)].concat()
}

/// `Buffer() { bytes }`.
pub fn buffer(bytes: &[u8]) -> Vec<u8> {
    let body = [integer(bytes.len() as u64), bytes.to_vec()].concat();
    [vec![op::BUFFER], with_pkg_length(&body)].concat()
}

/// One resource descriptor of a `ResourceTemplate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// `Memory32Fixed(ReadWrite, base, length)`.
    Memory32Fixed {
        /// First byte.
        base: u32,
        /// Length.
        len_bytes: u32,
    },
    /// `Interrupt(ResourceConsumer, Edge, ActiveHigh, Exclusive) { gsi }`.
    EdgeInterrupt {
        /// The global system interrupt.
        gsi: u32,
    },
    /// `IRQNoFlags() { irq }`: an ISA interrupt, edge-triggered, active
    /// high.
    IsaIrq {
        /// The ISA IRQ, 0-15.
        irq: u8,
    },
    /// `IO(Decode16, port, port, 1, count)`: a fixed port range.
    IoPorts {
        /// First port.
        port: u16,
        /// Ports in the range.
        count: u8,
    },
}

impl Resource {
    fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Resource::Memory32Fixed { base, len_bytes } => {
                out.push(resource::MEMORY32_FIXED);
                out.extend_from_slice(&9u16.to_le_bytes());
                // Bit 0: writable.
                out.push(1);
                out.extend_from_slice(&base.to_le_bytes());
                out.extend_from_slice(&len_bytes.to_le_bytes());
            }
            Resource::EdgeInterrupt { gsi } => {
                out.push(resource::EXTENDED_INTERRUPT);
                out.extend_from_slice(&6u16.to_le_bytes());
                // Bit 0: consumer; bit 1: edge-triggered; bits 2 (active
                // low), 3 (shared) and 4 (wake) clear. Edge because irqfd
                // delivers a pulse per notification.
                out.push(0b0011);
                out.push(1);
                out.extend_from_slice(&gsi.to_le_bytes());
            }
            Resource::IsaIrq { irq } => {
                assert!(irq < 16, "ISA IRQ {irq} out of range");
                out.push(resource::IRQ_NO_FLAGS);
                out.extend_from_slice(&(1u16 << irq).to_le_bytes());
            }
            Resource::IoPorts { port, count } => {
                out.push(resource::IO_PORT);
                // Bit 0: the device decodes 16 address bits.
                out.push(1);
                out.extend_from_slice(&port.to_le_bytes());
                out.extend_from_slice(&port.to_le_bytes());
                out.push(1);
                out.push(count);
            }
        }
    }
}

/// `ResourceTemplate() { resources }`: a buffer of descriptors closed by
/// an end tag whose checksum byte is 0 ("treat as valid", §6.4.2.9).
pub fn resource_template(resources: &[Resource]) -> Vec<u8> {
    let mut bytes = Vec::new();
    resources.iter().for_each(|r| r.encode(&mut bytes));
    bytes.extend_from_slice(&[resource::END_TAG, 0]);
    buffer(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_padded_and_prefixed() {
        assert_eq!(name_string("_HID").unwrap(), b"_HID");
        assert_eq!(name_string("_S5").unwrap(), b"_S5_");
        assert_eq!(name_string("\\_SB").unwrap(), b"\\_SB_");
        assert_eq!(name_string("\\").unwrap(), b"\\\0");
        assert_eq!(
            name_string("\\_SB.V000").unwrap(),
            b"\\\x2e_SB_V000".to_vec()
        );
        assert_eq!(
            name_string("A.B.C").unwrap(),
            b"\x2f\x03A___B___C___".to_vec()
        );
        for bad in ["", "TOOLONG", "0ABC", "ab", "A-B", "A..B"] {
            assert!(name_string(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn integers_take_their_shortest_form() {
        assert_eq!(integer(0), [0x00]);
        assert_eq!(integer(1), [0x01]);
        assert_eq!(integer(5), [0x0a, 5]);
        assert_eq!(integer(0x1234), [0x0b, 0x34, 0x12]);
        assert_eq!(integer(0xd000_0000), [0x0c, 0, 0, 0, 0xd0]);
        assert_eq!(integer(1 << 32), [0x0e, 0, 0, 0, 0, 1, 0, 0, 0]);
    }

    #[test]
    fn pkg_length_counts_itself_in_every_size() {
        // Decodes a PkgLength and checks it spans exactly the encoding.
        for body_bytes in [0, 1, 61, 62, 63, 64, 4092, 4093, 4094, 70_000] {
            let encoded = with_pkg_length(&vec![0xaa; body_bytes]);
            let lead = encoded[0];
            let extra = (lead >> 6) as usize;
            let total = if extra == 0 {
                (lead & 0x3f) as usize
            } else {
                let mut t = (lead & 0xf) as usize;
                for i in 0..extra {
                    t |= (encoded[1 + i] as usize) << (4 + 8 * i);
                }
                t
            };
            assert_eq!(total, encoded.len(), "body {body_bytes}");
            assert_eq!(encoded.len(), body_bytes + 1 + extra);
        }
    }

    #[test]
    fn eisa_ids_match_known_encodings() {
        // PNP0501 (16550 UART) and PNP0A03 (PCI bus) as ACPI tools emit them.
        assert_eq!(eisa_id("PNP0501"), [0x0c, 0x41, 0xd0, 0x05, 0x01]);
        assert_eq!(eisa_id("PNP0A03"), [0x0c, 0x41, 0xd0, 0x0a, 0x03]);
    }

    #[test]
    fn resource_template_bytes() {
        let t = resource_template(&[
            Resource::Memory32Fixed {
                base: 0xd000_0000,
                len_bytes: 0x1000,
            },
            Resource::EdgeInterrupt { gsi: 5 },
        ]);
        let descriptors: Vec<u8> = [
            &[0x86, 9, 0, 1, 0, 0, 0, 0xd0, 0, 0x10, 0, 0][..],
            &[0x89, 6, 0, 0x03, 1, 5, 0, 0, 0],
            &[0x79, 0],
        ]
        .concat();
        // BufferOp, PkgLength, BytePrefix size, then the descriptors.
        let mut want = vec![0x11, (descriptors.len() + 3) as u8, 0x0a];
        want.push(descriptors.len() as u8);
        want.extend_from_slice(&descriptors);
        assert_eq!(t, want);
    }

    #[test]
    fn legacy_port_and_irq_descriptors() {
        let t = resource_template(&[
            Resource::IoPorts {
                port: 0x3f8,
                count: 8,
            },
            Resource::IsaIrq { irq: 4 },
        ]);
        let descriptors = [
            0x47, 1, 0xf8, 3, 0xf8, 3, 1, 8, // IO(Decode16, 0x3f8, 0x3f8, 1, 8)
            0x22, 0x10, 0, // IRQNoFlags() {4}
            0x79, 0,
        ];
        assert_eq!(&t[4..], &descriptors);
    }

    #[test]
    fn device_with_a_string_hid() {
        let hid = name("_HID", &string("LNRO0005")).unwrap();
        let dev = device("V000", &hid).unwrap();
        let mut want = vec![0x5b, 0x82];
        let body = [&b"V000"[..], &hid].concat();
        want.push((body.len() + 1) as u8);
        want.extend_from_slice(&body);
        assert_eq!(dev, want);
        assert_eq!(&hid[..5], b"\x08_HID");
        assert_eq!(&hid[5..], b"\x0dLNRO0005\0");
    }
}

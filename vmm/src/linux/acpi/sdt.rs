//! System description table framing shared by every table: the 36-byte
//! header with its checksum, the RSDP that points at the root tables, and
//! the root tables themselves (RSDT with 32-bit, XSDT with 64-bit
//! pointers).

use crate::linux::board::checksum;

/// OEM ID in every header.
pub const OEM_ID: &[u8; 6] = b"HUGVMM";
/// Creator ID (the "ASL compiler" field) in every header.
const CREATOR_ID: &[u8; 4] = b"HVMM";
/// Bumped when the tables change meaning.
const OEM_REVISION: u32 = 1;
const CREATOR_REVISION: u32 = 1;

/// Size of the common header.
pub const HEADER_BYTES: usize = 36;
const LENGTH_OFFSET: usize = 4;
const CHECKSUM_OFFSET: usize = 9;

/// Size of an ACPI 2.0+ RSDP.
pub const RSDP_BYTES: usize = 36;
/// The RSDP's checksum covers its ACPI 1.0 part only ...
const RSDP_V1_BYTES: usize = 20;
const RSDP_CHECKSUM_OFFSET: usize = 8;
/// ... and the extended checksum all of it.
const RSDP_EXT_CHECKSUM_OFFSET: usize = 32;

/// A table under construction: header fields first, body appended, then
/// [`Table::finish`] fills in the length and checksum.
pub struct Table {
    bytes: Vec<u8>,
}

impl Table {
    /// A table with `signature` and `revision`; the OEM table ID is
    /// `HVMM` followed by the signature, so every table is told apart.
    pub fn new(signature: &[u8; 4], revision: u8) -> Self {
        let mut bytes = Vec::with_capacity(256);
        bytes.extend_from_slice(signature);
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.push(revision);
        bytes.push(0);
        bytes.extend_from_slice(OEM_ID);
        bytes.extend_from_slice(b"HVMM");
        bytes.extend_from_slice(signature);
        bytes.extend_from_slice(&OEM_REVISION.to_le_bytes());
        bytes.extend_from_slice(CREATOR_ID);
        bytes.extend_from_slice(&CREATOR_REVISION.to_le_bytes());
        debug_assert_eq!(bytes.len(), HEADER_BYTES);
        Self { bytes }
    }

    /// Appends body bytes.
    pub fn extend(&mut self, bytes: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// The finished table: length and checksum set.
    pub fn finish(mut self) -> Vec<u8> {
        let len = self.bytes.len() as u32;
        self.bytes[LENGTH_OFFSET..LENGTH_OFFSET + 4].copy_from_slice(&len.to_le_bytes());
        self.bytes[CHECKSUM_OFFSET] = checksum(&self.bytes);
        self.bytes
    }
}

/// The XSDT listing `tables` by their 64-bit addresses.
pub fn xsdt(tables: &[u64]) -> Vec<u8> {
    let mut table = Table::new(b"XSDT", 1);
    tables.iter().for_each(|gpa| {
        table.extend(&gpa.to_le_bytes());
    });
    table.finish()
}

/// The RSDT listing `tables` by their 32-bit addresses, for kernels told
/// `acpi=rsdt` or too old for the XSDT. Every table is below 1 MiB.
pub fn rsdt(tables: &[u64]) -> Vec<u8> {
    let mut table = Table::new(b"RSDT", 1);
    tables.iter().for_each(|gpa| {
        let gpa = u32::try_from(*gpa).expect("ACPI tables live below 4 GiB");
        table.extend(&gpa.to_le_bytes());
    });
    table.finish()
}

/// An ACPI 2.0+ RSDP pointing at both root tables.
pub fn rsdp(rsdt_gpa: u64, xsdt_gpa: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(RSDP_BYTES);
    bytes.extend_from_slice(b"RSD PTR ");
    bytes.push(0);
    bytes.extend_from_slice(OEM_ID);
    // Revision 2: ACPI 2.0 and later, with length and XSDT address.
    bytes.push(2);
    let rsdt_gpa = u32::try_from(rsdt_gpa).expect("the RSDT lives below 4 GiB");
    bytes.extend_from_slice(&rsdt_gpa.to_le_bytes());
    bytes.extend_from_slice(&(RSDP_BYTES as u32).to_le_bytes());
    bytes.extend_from_slice(&xsdt_gpa.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    debug_assert_eq!(bytes.len(), RSDP_BYTES);
    bytes[RSDP_CHECKSUM_OFFSET] = checksum(&bytes[..RSDP_V1_BYTES]);
    bytes[RSDP_EXT_CHECKSUM_OFFSET] = checksum(&bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums_to_zero(bytes: &[u8]) -> bool {
        bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b)) == 0
    }

    #[test]
    fn header_fields_and_checksum() {
        let mut t = Table::new(b"TEST", 3);
        t.extend(&[1, 2, 3]);
        let bytes = t.finish();
        assert_eq!(&bytes[..4], b"TEST");
        assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), 39);
        assert_eq!(bytes[8], 3);
        assert_eq!(&bytes[10..16], OEM_ID);
        assert_eq!(&bytes[16..24], b"HVMMTEST");
        assert!(sums_to_zero(&bytes));
    }

    #[test]
    fn rsdp_checksums_cover_their_ranges() {
        let r = rsdp(0xe0040, 0xe0080);
        assert_eq!(r.len(), 36);
        assert_eq!(&r[..8], b"RSD PTR ");
        assert!(sums_to_zero(&r[..20]));
        assert!(sums_to_zero(&r));
        assert_eq!(u32::from_le_bytes(r[16..20].try_into().unwrap()), 0xe0040);
        assert_eq!(u64::from_le_bytes(r[24..32].try_into().unwrap()), 0xe0080);
    }

    #[test]
    fn root_tables_list_their_entries() {
        let x = xsdt(&[0x1000, 0x2000]);
        assert_eq!(x.len(), HEADER_BYTES + 16);
        assert_eq!(u64::from_le_bytes(x[44..52].try_into().unwrap()), 0x2000);
        assert!(sums_to_zero(&x));
        let r = rsdt(&[0x1000, 0x2000]);
        assert_eq!(r.len(), HEADER_BYTES + 8);
        assert_eq!(u32::from_le_bytes(r[40..44].try_into().unwrap()), 0x2000);
        assert!(sums_to_zero(&r));
    }
}

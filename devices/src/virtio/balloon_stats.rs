//! Guest memory statistics from the balloon's statistics queue.
//!
//! The driver sends an array of `{le16 tag; le64 value}` entries, packed
//! (10 bytes each). Tags this code does not know are kept too, so a newer
//! guest's figures are not lost.

use std::collections::BTreeMap;

/// Bytes of one packed entry.
const ENTRY_BYTES: usize = 10;

/// Pages swapped in, in bytes.
pub const TAG_SWAP_IN: u16 = 0;
/// Pages swapped out, in bytes.
pub const TAG_SWAP_OUT: u16 = 1;
/// Major page faults.
pub const TAG_MAJOR_FAULTS: u16 = 2;
/// Minor page faults.
pub const TAG_MINOR_FAULTS: u16 = 3;
/// Free memory, bytes.
pub const TAG_FREE_MEMORY: u16 = 4;
/// Total memory, bytes.
pub const TAG_TOTAL_MEMORY: u16 = 5;
/// Available memory (MemAvailable), bytes.
pub const TAG_AVAILABLE_MEMORY: u16 = 6;
/// Page cache, bytes.
pub const TAG_DISK_CACHES: u16 = 7;
/// Successful hugetlb page allocations.
pub const TAG_HUGETLB_ALLOCATIONS: u16 = 8;
/// Failed hugetlb page allocations.
pub const TAG_HUGETLB_FAILURES: u16 = 9;

/// Names of the statistics tags Linux sends (0 to 15), for reports.
const TAG_NAMES: [&str; 16] = [
    "swap_in_bytes",
    "swap_out_bytes",
    "major_faults",
    "minor_faults",
    "free_bytes",
    "total_bytes",
    "available_bytes",
    "disk_caches_bytes",
    "hugetlb_allocations",
    "hugetlb_failures",
    "oom_kills",
    "alloc_stalls",
    "async_scans",
    "direct_scans",
    "async_reclaims",
    "direct_reclaims",
];

/// One statistics report from the guest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BalloonStats {
    values: BTreeMap<u16, u64>,
}

impl BalloonStats {
    /// Parses packed entries; a trailing partial entry is ignored, and a
    /// repeated tag keeps its last value.
    pub fn parse(bytes: &[u8]) -> Self {
        let values = bytes
            .chunks_exact(ENTRY_BYTES)
            .map(|entry| {
                let tag = u16::from_le_bytes([entry[0], entry[1]]);
                let value = u64::from_le_bytes(entry[2..10].try_into().expect("8 bytes"));
                (tag, value)
            })
            .collect();
        Self { values }
    }

    /// The value of `tag`, if the guest sent it.
    pub fn get(&self, tag: u16) -> Option<u64> {
        self.values.get(&tag).copied()
    }

    /// Every (tag, value), by tag.
    pub fn iter(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.values.iter().map(|(&tag, &value)| (tag, value))
    }

    /// Whether the report was empty.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Free guest memory in bytes.
    pub fn free_bytes(&self) -> Option<u64> {
        self.get(TAG_FREE_MEMORY)
    }

    /// Total guest memory in bytes.
    pub fn total_bytes(&self) -> Option<u64> {
        self.get(TAG_TOTAL_MEMORY)
    }

    /// Memory the guest could use without swapping, in bytes.
    pub fn available_bytes(&self) -> Option<u64> {
        self.get(TAG_AVAILABLE_MEMORY)
    }

    /// A stable name for `tag` (e.g. `free_bytes`), for JSON and logs.
    pub fn tag_name(tag: u16) -> Option<&'static str> {
        TAG_NAMES.get(usize::from(tag)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, value: u64) -> Vec<u8> {
        let mut bytes = tag.to_le_bytes().to_vec();
        bytes.extend_from_slice(&value.to_le_bytes());
        bytes
    }

    #[test]
    fn parses_packed_entries() {
        let mut bytes = entry(TAG_FREE_MEMORY, 100 << 20);
        bytes.extend(entry(TAG_TOTAL_MEMORY, 512 << 20));
        bytes.extend(entry(42, 7));
        bytes.extend(entry(TAG_FREE_MEMORY, 99 << 20));
        bytes.extend([1, 2, 3]);
        let stats = BalloonStats::parse(&bytes);
        assert_eq!(stats.free_bytes(), Some(99 << 20));
        assert_eq!(stats.total_bytes(), Some(512 << 20));
        assert_eq!(stats.available_bytes(), None);
        assert_eq!(stats.get(42), Some(7));
        assert_eq!(stats.iter().count(), 3);
        assert_eq!(BalloonStats::tag_name(TAG_FREE_MEMORY), Some("free_bytes"));
        assert_eq!(BalloonStats::tag_name(42), None);
        assert!(BalloonStats::parse(&[]).is_empty());
    }
}

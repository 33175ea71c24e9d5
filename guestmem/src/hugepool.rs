//! The host's pool of 2 MiB hugetlb pages.
//!
//! A hugetlb mapping fails (or worse, a later fault gets SIGBUS) when the
//! pool is short, so the pool is checked up front to give the user a message
//! that says exactly how many pages to reserve.

use std::fs;
use std::io;

use crate::GuestMemError;

const POOL_DIR: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";
const SYSCTL_POOL_FILE: &str = "/proc/sys/vm/nr_hugepages";
const SYSFS_POOL_FILE: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

/// A snapshot of the 2 MiB hugetlb pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HugePool {
    /// Pages in the pool (`nr_hugepages`).
    pub pool_pages: u64,
    /// Pages not faulted in by anyone (`free_hugepages`).
    pub free_pages: u64,
    /// Free pages already promised to existing mappings (`resv_hugepages`).
    pub reserved_pages: u64,
}

impl HugePool {
    /// Reads the pool counters from sysfs.
    pub fn read() -> Result<HugePool, GuestMemError> {
        let read = |name: &str| -> Result<u64, GuestMemError> {
            let path = format!("{POOL_DIR}/{name}");
            let unavailable = |detail: String| GuestMemError::HugetlbUnavailable {
                reason: format!("cannot read {path}: {detail}"),
            };
            let text =
                fs::read_to_string(&path).map_err(|e: io::Error| unavailable(e.to_string()))?;
            text.trim()
                .parse()
                .map_err(|_| unavailable(format!("unexpected contents {:?}", text.trim())))
        };
        Ok(HugePool {
            pool_pages: read("nr_hugepages")?,
            free_pages: read("free_hugepages")?,
            reserved_pages: read("resv_hugepages")?,
        })
    }

    /// Pages that a new mapping can still reserve.
    pub fn available_pages(&self) -> u64 {
        self.free_pages.saturating_sub(self.reserved_pages)
    }

    /// Fails with reservation advice unless `needed_pages` are available.
    pub fn ensure_available(&self, needed_pages: u64) -> Result<(), GuestMemError> {
        if self.available_pages() >= needed_pages {
            Ok(())
        } else {
            Err(self.shortage(needed_pages))
        }
    }

    /// The error for a pool that cannot hold `needed_pages` more pages.
    pub fn shortage(&self, needed_pages: u64) -> GuestMemError {
        let available = self.available_pages();
        // When the kernel refuses the mapping although the counters looked
        // fine (a race with another process), still suggest growing the pool.
        let shortfall = needed_pages.saturating_sub(available).max(1);
        GuestMemError::HugePagesShort {
            needed_pages,
            free_pages: available,
            pool_pages: self.pool_pages,
            suggested_pool_pages: self.pool_pages + shortfall,
            pool_file: pool_file(),
        }
    }
}

/// The file that sizes the 2 MiB pool: the sysctl when 2 MiB is the
/// default huge page size (the common case, and the easier path to
/// remember), otherwise the size-specific sysfs file.
fn pool_file() -> &'static str {
    let default_is_2m = fs::read_to_string("/proc/meminfo")
        .map(|meminfo| {
            meminfo.lines().any(|line| {
                line.strip_prefix("Hugepagesize:")
                    .is_some_and(|value| value.trim() == "2048 kB")
            })
        })
        .unwrap_or(false);
    if default_is_2m {
        SYSCTL_POOL_FILE
    } else {
        SYSFS_POOL_FILE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortage_message_says_how_many_to_reserve() {
        let pool = HugePool {
            pool_pages: 10,
            free_pages: 6,
            reserved_pages: 2,
        };
        assert!(pool.ensure_available(4).is_ok());
        let message = pool.ensure_available(32).unwrap_err().to_string();
        assert!(
            message.contains("needs 32 free 2 MiB huge pages"),
            "{message}"
        );
        assert!(message.contains("only 4 are free"), "{message}");
        assert!(message.contains("nr_hugepages = 10"), "{message}");
        assert!(message.contains("`echo 38 > "), "{message}");
        assert!(message.contains("nr_hugepages`"), "{message}");
    }
}

//! The host's pool of 2 MiB hugetlb pages, grown for a test or a bench
//! that needs free pages and shrunk back after it, so the host is left as
//! it was found (the tests grew it and never shrank it back; `.ci/run`,
//! which reserves 1,024 pages for the whole run, gives those back at its
//! end too).

use std::sync::{Mutex, MutexGuard};

const POOL_DIR: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";
const POOL_FILE: &str = "/proc/sys/vm/nr_hugepages";

/// Users of the pool in one process take turns: each counts the free
/// pages, and two at once would count the same ones.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Free 2 MiB hugetlb pages made sure of, held for as long as this lives
/// ([`reserve`]). Dropped, it shrinks the pool by what it grew it by
/// (pages still in use by then are freed by the kernel as they are let
/// go). Users of the pool in one process take turns while one lives.
pub struct HugetlbPages {
    added_pages: u64,
    _turn: MutexGuard<'static, ()>,
}

impl HugetlbPages {
    /// Pages the pool was grown by for this reservation (0: it had them).
    pub fn added_pages(&self) -> u64 {
        self.added_pages
    }
}

fn read(file: &str) -> Result<u64, String> {
    let path = format!("{POOL_DIR}/{file}");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{path} holds {:?}, not a number", text.trim()))
}

/// Pages a new mapping can still reserve: free ones not promised to an
/// existing mapping.
fn available_pages() -> Result<u64, String> {
    Ok(read("free_hugepages")?.saturating_sub(read("resv_hugepages")?))
}

/// Makes sure `pages` 2 MiB hugetlb pages are free to reserve, growing
/// the pool (as root) by what is missing, for as long as the returned
/// value lives. Returns why not otherwise, saying how to reserve them.
pub fn reserve(pages: u64) -> Result<HugetlbPages, String> {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let available = available_pages()?;
    if available >= pages {
        return Ok(HugetlbPages {
            added_pages: 0,
            _turn: turn,
        });
    }
    let total = read("nr_hugepages")?;
    let want = total + (pages - available);
    std::fs::write(POOL_FILE, want.to_string()).map_err(|e| {
        format!("need {pages} free 2 MiB hugetlb pages, {available} free; cannot reserve more ({e}); run as root or `echo {want} > {POOL_FILE}`")
    })?;
    let reserved = HugetlbPages {
        added_pages: read("nr_hugepages")?.saturating_sub(total),
        _turn: turn,
    };
    let available = available_pages()?;
    if available >= pages {
        Ok(reserved)
    } else {
        Err(format!("need {pages} free 2 MiB hugetlb pages; after asking for {want} the kernel has {available} free (memory too fragmented?)"))
    }
}

impl Drop for HugetlbPages {
    fn drop(&mut self) {
        if self.added_pages == 0 {
            return;
        }
        let shrunk = read("nr_hugepages").and_then(|total| {
            let back = total.saturating_sub(self.added_pages);
            std::fs::write(POOL_FILE, back.to_string())
                .map_err(|e| format!("cannot write {back} to {POOL_FILE}: {e}"))
        });
        if let Err(e) = shrunk {
            eprintln!(
                "cannot give back the {} hugetlb pages reserved for this run: {e}; shrink /proc/sys/vm/nr_hugepages by hand",
                self.added_pages
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_leaves_the_pool_as_it_found_it() {
        const TEST: &str = "a_reservation_leaves_the_pool_as_it_found_it";
        let reserved = read("nr_hugepages").and_then(|before| {
            let want = available_pages()? + 2;
            Ok((before, want, reserve(want)?))
        });
        let (before, want, pages) = match reserved {
            Ok(reserved) => reserved,
            Err(why) => {
                crate::skip(TEST, crate::Resource::Hugetlb, why);
                return;
            }
        };
        assert!(available_pages().unwrap() >= want);
        assert!(pages.added_pages() >= 2, "{}", pages.added_pages());
        drop(pages);
        assert_eq!(read("nr_hugepages").unwrap(), before);
    }
}

//! The kind of host memory behind guest RAM.

use std::fmt;
use std::str::FromStr;

/// Host memory backing guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backing {
    /// Anonymous memory with transparent huge pages requested
    /// (`MADV_HUGEPAGE`). Needs no setup, and the swap engine can move whole
    /// huge pages in and out with `UFFDIO_MOVE`.
    #[default]
    Thp,
    /// A hugetlbfs memfd of 2 MiB pages: guaranteed huge, but the pages must
    /// be reserved in the host's pool (`/proc/sys/vm/nr_hugepages`) first.
    Hugetlb,
    /// Anonymous memory with huge pages refused (`MADV_NOHUGEPAGE`): the
    /// baseline to compare huge pages against.
    Small4k,
}

impl Backing {
    /// Every backing, in the order they are offered to users.
    pub const ALL: [Backing; 3] = [Backing::Thp, Backing::Hugetlb, Backing::Small4k];

    /// The word that names this backing on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backing::Thp => "thp",
            Backing::Hugetlb => "hugetlb",
            Backing::Small4k => "4k",
        }
    }
}

/// A backing name that is not one of `thp`, `hugetlb`, `4k`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown memory backing '{given}'; use one of: thp, hugetlb, 4k")]
pub struct BackingParseError {
    /// The name as given.
    pub given: String,
}

impl FromStr for Backing {
    type Err = BackingParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        Backing::ALL
            .into_iter()
            .find(|backing| backing.name().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| BackingParseError {
                given: s.to_string(),
            })
    }
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_names() {
        for backing in Backing::ALL {
            assert_eq!(backing.to_string().parse::<Backing>(), Ok(backing));
        }
        assert_eq!("thp".parse(), Ok(Backing::Thp));
        assert_eq!("hugetlb".parse(), Ok(Backing::Hugetlb));
        assert_eq!("4k".parse(), Ok(Backing::Small4k));
        assert_eq!("4K".parse(), Ok(Backing::Small4k));
        assert_eq!(Backing::default(), Backing::Thp);
    }

    #[test]
    fn unknown_name_lists_valid_ones() {
        let err = "huge".parse::<Backing>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown memory backing 'huge'; use one of: thp, hugetlb, 4k"
        );
    }
}

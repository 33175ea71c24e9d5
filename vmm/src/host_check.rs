//! What the host kernel must offer the swap engine, checked before a VM is
//! built, so that a kernel too old for it is named at once with the
//! feature it lacks and the Linux version that added it, instead of an
//! error from deep inside a run.

use anyhow::{bail, Result};
use guestmem::Backing;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use swap::store::StoreSpec;
use swap::uffd::{feature, Uffd};

/// One kernel feature the engine uses.
struct Feature {
    /// The `UFFD_FEATURE_*` bit.
    bit: u64,
    /// What it is called and what the engine does with it.
    what: &'static str,
    /// The Linux version that added it.
    since: &'static str,
}

const MOVE: Feature = Feature {
    bit: feature::MOVE,
    what: "UFFDIO_MOVE (restoring and evicting whole 2 MiB chunks of THP and 4 KiB memory)",
    since: "6.8",
};
const MISSING_HUGETLBFS: Feature = Feature {
    bit: feature::MISSING_HUGETLBFS,
    what: "userfaultfd on hugetlbfs memory (UFFD_FEATURE_MISSING_HUGETLBFS)",
    since: "4.11",
};
const WP_HUGETLBFS: Feature = Feature {
    bit: feature::WP_HUGETLBFS_SHMEM,
    what: "write-protecting hugetlbfs memory (UFFD_FEATURE_WP_HUGETLBFS_SHMEM), without which a hugetlb chunk cannot be taken from the guest without losing writes",
    since: "5.19",
};
const WP: Feature = Feature {
    bit: feature::PAGEFAULT_FLAG_WP,
    what: "userfaultfd write-protection (UFFD_FEATURE_PAGEFAULT_FLAG_WP), which lets clean chunks be dropped without a write",
    since: "5.7",
};

/// The running kernel's release, for messages.
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The first feature guest RAM of `backing` needs that `features` lacks.
fn first_missing(features: u64, backing: Backing) -> Option<&'static Feature> {
    let required: &'static [Feature] = match backing {
        Backing::Hugetlb => &[MISSING_HUGETLBFS, WP_HUGETLBFS],
        Backing::Thp | Backing::Small4k => &[MOVE],
    };
    required.iter().find(|f| features & f.bit == 0)
}

fn missing_message(f: &Feature, backing: Backing, release: &str) -> String {
    format!(
        "this kernel ({release}) lacks {}, which the swap engine needs for --backing {backing}; it arrived in Linux {}: run on a newer kernel{}",
        f.what,
        f.since,
        if backing == Backing::Hugetlb { "" } else { " (or try --backing hugetlb)" }
    )
}

/// Checks the features the swap engine needs for guest RAM of `backing`
/// with a store `store`. Returns warnings (features whose absence only
/// costs performance); fails naming the first missing requirement.
pub fn check_swap_host(backing: Backing, store: &StoreSpec) -> Result<Vec<String>> {
    let release = kernel_release();
    let uffd = match Uffd::open(0) {
        Ok(uffd) => uffd,
        Err(e) => bail!(
            "the swap engine needs userfaultfd, which this kernel ({release}) refuses: {e}; run as root, set vm.unprivileged_userfaultfd=1, or give access to /dev/userfaultfd (Linux 6.1+)"
        ),
    };
    let features = uffd.features();
    if let Some(f) = first_missing(features, backing) {
        bail!("{}", missing_message(f, backing, &release));
    }
    let mut warnings = Vec::new();
    if backing != Backing::Hugetlb && features & WP.bit == 0 {
        warnings.push(format!(
            "this kernel ({release}) lacks {} (Linux {}): every eviction writes",
            WP.what, WP.since
        ));
    }
    if let Some(why) = default_store_without_direct_io(store) {
        bail!("{why}");
    }
    Ok(warnings)
}

/// For the default store: why none of the directories it may use takes
/// `O_DIRECT` files, or None when one does (other stores say so when they
/// are opened, naming their own path).
fn default_store_without_direct_io(store: &StoreSpec) -> Option<String> {
    if *store != StoreSpec::Default {
        return None;
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(tmp) = std::env::var_os("TMPDIR").filter(|d| !d.is_empty()) {
        dirs.push(tmp.into());
    }
    dirs.push("/var/tmp".into());
    if let Ok(cwd) = std::env::current_dir() {
        dirs.push(cwd);
    }
    let mut refused = Vec::new();
    for dir in &dirs {
        // An unnamed file is gone when closed: the probe leaves nothing.
        let probe = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE | libc::O_DIRECT)
            .mode(0o600)
            .open(dir);
        match probe {
            Ok(_) => return None,
            // Filesystems without O_TMPFILE: the store falls back to a
            // named file it unlinks, and checks O_DIRECT then.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return None,
            Err(e) => refused.push(format!("{}: {e}", dir.display())),
        }
    }
    Some(format!(
        "the default swap store needs a directory whose filesystem takes O_DIRECT files, and none does ({}); tmpfs takes them from Linux 6.6 on (this kernel: {}): set TMPDIR to a directory on a disk filesystem (ext4, xfs, btrfs), or give --swap-store file:PATH or mem:lz4",
        refused.join("; "),
        kernel_release()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_offers_what_the_engine_needs() {
        // The project's hosts run 6.18: everything is there.
        for backing in [Backing::Thp, Backing::Small4k] {
            let warnings = check_swap_host(backing, &StoreSpec::Default).unwrap();
            assert!(warnings.is_empty(), "{warnings:?}");
        }
    }

    #[test]
    fn a_missing_feature_names_the_kernel_version_that_has_it() {
        let thp = first_missing(feature::WP_HUGETLBFS_SHMEM, Backing::Thp).unwrap();
        let message = missing_message(thp, Backing::Thp, "6.1.0-48-cloud-amd64");
        assert!(message.contains("UFFDIO_MOVE"), "{message}");
        assert!(message.contains("Linux 6.8"), "{message}");
        assert!(message.contains("6.1.0-48-cloud-amd64"), "{message}");
        assert!(first_missing(feature::MOVE, Backing::Small4k).is_none());
        let hugetlb = first_missing(feature::MOVE | feature::MISSING_HUGETLBFS, Backing::Hugetlb);
        assert_eq!(hugetlb.map(|f| f.since), Some("5.19"));
    }
}

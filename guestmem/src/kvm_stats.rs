//! KVM binary statistics of a VM, for watching the stage-2 page sizes.
//!
//! `pages_4k`, `pages_2m` and `pages_1g` count the VM's current stage-2
//! (EPT/NPT) mappings by size: the direct measure of whether guest RAM is
//! mapped huge. kvm-ioctls has no API for binary stats, so the stats fd is
//! obtained with a raw `KVM_GET_STATS_FD` and parsed here (layout per the
//! kernel's Documentation/virt/kvm/api.rst, "KVM_GET_STATS_FD").

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use kvm_bindings::{kvm_stats_desc, kvm_stats_header};
use kvm_ioctls::VmFd;
use vmm_sys_util::ioctl::ioctl;

use crate::GuestMemError;

/// The ioctl number, kept private: the macro defines a `pub fn`.
mod ioctl_numbers {
    use kvm_bindings::KVMIO;
    use vmm_sys_util::ioctl_io_nr;

    ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
}
use ioctl_numbers::KVM_GET_STATS_FD;

/// Descriptor names longer than this, or more descriptors than this, mean
/// the header was misread; real kernels use tens of bytes and of entries.
const MAX_NAME_BYTES: u32 = 4096;
const MAX_DESCRIPTORS: u32 = 65536;

/// Current stage-2 mapping counts by page size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTwoPages {
    /// 4 KiB mappings.
    pub pages_4k: u64,
    /// 2 MiB mappings.
    pub pages_2m: u64,
    /// 1 GiB mappings.
    pub pages_1g: u64,
}

/// One statistic: its name and where its first value is in the stats fd.
#[derive(Debug, Clone)]
struct Stat {
    name: String,
    value_offset: u64,
}

/// An open binary-stats fd of a VM.
#[derive(Debug)]
pub struct KvmStats {
    file: File,
    stats: Vec<Stat>,
    /// File offsets of `pages_4k`, `pages_2m`, `pages_1g`, in that order.
    page_offsets: [u64; 3],
}

const PAGE_STAT_NAMES: [&str; 3] = ["pages_4k", "pages_2m", "pages_1g"];

impl KvmStats {
    /// Opens the VM's statistics and finds the stage-2 page counters.
    pub fn open(vm: &VmFd) -> Result<KvmStats, GuestMemError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and touches no memory of
        // ours; it returns a new fd or -1.
        let ret = unsafe { ioctl(vm, KVM_GET_STATS_FD()) };
        if ret < 0 {
            return Err(GuestMemError::StatsUnavailable {
                error: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: the kernel just created this fd for us and nothing else
        // owns it.
        let file = unsafe { File::from_raw_fd(ret) };
        let stats = read_descriptors(&file)?;

        let find = |name: &str| {
            stats
                .iter()
                .find(|stat| stat.name == name)
                .map(|stat| stat.value_offset)
        };
        let found = PAGE_STAT_NAMES.map(find);
        let missing: Vec<String> = PAGE_STAT_NAMES
            .iter()
            .zip(found)
            .filter(|(_, offset)| offset.is_none())
            .map(|(name, _)| name.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(GuestMemError::StatsMissing {
                missing,
                offered: stats.iter().map(|stat| stat.name.clone()).collect(),
            });
        }
        let page_offsets = found.map(|offset| offset.expect("checked above"));
        Ok(KvmStats {
            file,
            stats,
            page_offsets,
        })
    }

    /// Reads the current stage-2 mapping counts.
    pub fn read(&self) -> Result<StageTwoPages, GuestMemError> {
        let [pages_4k, pages_2m, pages_1g] = self.page_offsets;
        Ok(StageTwoPages {
            pages_4k: self.read_u64(pages_4k)?,
            pages_2m: self.read_u64(pages_2m)?,
            pages_1g: self.read_u64(pages_1g)?,
        })
    }

    /// Reads every statistic of the VM (the first value of each, for
    /// histograms the first bucket), for debugging.
    pub fn read_all(&self) -> Result<Vec<(String, u64)>, GuestMemError> {
        self.stats
            .iter()
            .map(|stat| Ok((stat.name.clone(), self.read_u64(stat.value_offset)?)))
            .collect()
    }

    fn read_u64(&self, offset: u64) -> Result<u64, GuestMemError> {
        let mut bytes = [0u8; 8];
        self.file
            .read_exact_at(&mut bytes, offset)
            .map_err(|error| GuestMemError::StatsRead {
                what: "values",
                error,
            })?;
        Ok(u64::from_ne_bytes(bytes))
    }
}

/// Parses the header and the descriptors.
fn read_descriptors(file: &File) -> Result<Vec<Stat>, GuestMemError> {
    let malformed = |reason: String| GuestMemError::StatsFormat { reason };

    let mut header = [0u8; size_of::<kvm_stats_header>()];
    file.read_exact_at(&mut header, 0)
        .map_err(|error| GuestMemError::StatsRead {
            what: "header",
            error,
        })?;
    let name_size = u32_at(&header, offset_of!(kvm_stats_header, name_size));
    let num_desc = u32_at(&header, offset_of!(kvm_stats_header, num_desc));
    let desc_offset = u32_at(&header, offset_of!(kvm_stats_header, desc_offset));
    let data_offset = u32_at(&header, offset_of!(kvm_stats_header, data_offset));
    if name_size == 0 || name_size > MAX_NAME_BYTES || num_desc > MAX_DESCRIPTORS {
        return Err(malformed(format!(
            "header claims name_size {name_size}, num_desc {num_desc}"
        )));
    }

    let desc_bytes = size_of::<kvm_stats_desc>() + name_size as usize;
    let mut descriptors = vec![0u8; desc_bytes * num_desc as usize];
    file.read_exact_at(&mut descriptors, u64::from(desc_offset))
        .map_err(|error| GuestMemError::StatsRead {
            what: "descriptors",
            error,
        })?;

    descriptors
        .chunks_exact(desc_bytes)
        .map(|desc| {
            let offset = u32_at(desc, offset_of!(kvm_stats_desc, offset));
            let name_field = &desc[offset_of!(kvm_stats_desc, name)..];
            let name_len = name_field
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(name_field.len());
            let name = std::str::from_utf8(&name_field[..name_len])
                .map_err(|_| {
                    malformed(format!(
                        "descriptor name {:?} is not UTF-8",
                        &name_field[..name_len]
                    ))
                })?
                .to_string();
            Ok(Stat {
                name,
                value_offset: u64::from(data_offset) + u64::from(offset),
            })
        })
        .collect()
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let field: [u8; 4] = bytes[offset..offset + 4]
        .try_into()
        .expect("slice of 4 bytes");
    u32::from_ne_bytes(field)
}

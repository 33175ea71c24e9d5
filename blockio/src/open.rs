//! Opening and creating block files, `O_DIRECT` probing, and the calls
//! that size a file and report its filesystem's free space.

use std::fs::{File, OpenOptions};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::uring::RingPool;
use crate::{Backend, BlockFile, BlockIoError, BlockOptions, Engine};

/// Alignment assumed for `O_DIRECT` when the kernel does not report one
/// (statx `STATX_DIOALIGN` is missing before Linux 6.1): a page satisfies
/// every common filesystem and device.
const DEFAULT_DIRECT_ALIGN_BYTES: usize = 4096;

/// Bytes an unprivileged writer may still allocate on the filesystem
/// holding `file` (`f_bavail * f_frsize` from `fstatvfs`).
pub fn fs_free_bytes(file: &File) -> io::Result<u64> {
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut st: libc::statvfs64 = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs writes only into `st`, which outlives the call.
    if unsafe { libc::fstatvfs64(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

impl BlockFile {
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path, opts: &BlockOptions) -> Result<Self, BlockIoError> {
        Self::open_with(OpenOptions::new().read(true).write(true), path, opts)
    }

    /// Opens `path` with `how`, then as [`BlockFile::from_file`].
    fn open_with(
        how: &OpenOptions,
        path: &Path,
        opts: &BlockOptions,
    ) -> Result<Self, BlockIoError> {
        let file = how.open(path).map_err(|source| BlockIoError::Open {
            path: path.to_owned(),
            source,
        })?;
        Self::from_file(file, path.to_owned(), opts)
    }

    /// Creates `path`, which must not exist (`O_CREAT | O_EXCL`), mode 0600
    /// because what goes in is private. An existing file is never opened
    /// here, so nothing anyone had is lost; see swap's `FileStore` for how
    /// a store reuses one.
    pub fn create_new(path: &Path, opts: &BlockOptions) -> Result<Self, BlockIoError> {
        let mut how = OpenOptions::new();
        how.read(true).write(true).create_new(true).mode(0o600);
        Self::open_with(&how, path, opts)
    }

    /// Creates an unnamed file in directory `dir` (`O_TMPFILE`; where the
    /// filesystem lacks it, a uniquely named file that is unlinked at once),
    /// mode 0600. The space goes back to the filesystem when it is dropped.
    pub fn temporary_in(dir: &Path, opts: &BlockOptions) -> Result<Self, BlockIoError> {
        let tmpfile = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(dir);
        let file = match tmpfile {
            Ok(file) => file,
            // Filesystems without O_TMPFILE say EOPNOTSUPP (old kernels EISDIR).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EISDIR)
                ) =>
            {
                Self::create_and_unlink(dir)?
            }
            Err(source) => {
                return Err(BlockIoError::Open {
                    path: dir.to_owned(),
                    source,
                })
            }
        };
        Self::from_file(file, dir.to_owned(), opts)
    }

    fn create_and_unlink(dir: &Path) -> Result<File, BlockIoError> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            ".hugevmm-tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| BlockIoError::Open {
                path: path.clone(),
                source,
            })?;
        std::fs::remove_file(&path).map_err(|source| BlockIoError::Open { path, source })?;
        Ok(file)
    }

    /// Wraps an already open file. `name` is used in messages only. With
    /// `opts.direct`, `O_DIRECT` is switched on here, which is where a
    /// filesystem that cannot do it says so.
    pub fn from_file(file: File, name: PathBuf, opts: &BlockOptions) -> Result<Self, BlockIoError> {
        Self::from_file_with_rings(file, name, opts, RingPool::new)
    }

    /// [`Self::from_file`] with the ring setup injectable, so that the
    /// fallback when io_uring is unavailable can be tested without changing
    /// the host's sysctl.
    fn from_file_with_rings(
        file: File,
        name: PathBuf,
        opts: &BlockOptions,
        setup_rings: impl FnOnce(&BlockOptions, RawFd) -> io::Result<RingPool>,
    ) -> Result<Self, BlockIoError> {
        let meta = file.metadata().map_err(|source| BlockIoError::Control {
            what: "fstat",
            path: name.clone(),
            source,
        })?;
        let is_block_device = meta.file_type().is_block_device();
        let (offset_align_bytes, mem_align_bytes) = if opts.direct {
            set_direct(&file, &name)?;
            direct_alignment(&file, is_block_device)
        } else {
            (1, 1)
        };
        let backend = match opts.engine {
            Engine::Sync => Backend::Sync,
            Engine::IoUring => {
                Backend::Uring(setup_rings(opts, file.as_raw_fd()).map_err(|source| {
                    BlockIoError::RingSetup {
                        path: name.clone(),
                        source,
                    }
                })?)
            }
            Engine::Auto => match setup_rings(opts, file.as_raw_fd()) {
                Ok(pool) => Backend::Uring(pool),
                Err(e) => {
                    log::warn!(
                        "warning: io_uring unavailable ({e}); {} uses pread/pwrite, one request at a time per thread",
                        name.display()
                    );
                    Backend::Sync
                }
            },
        };
        Ok(Self {
            file: Some(file),
            path: name,
            is_block_device,
            direct: opts.direct,
            offset_align_bytes,
            mem_align_bytes,
            backend,
        })
    }

    /// Current size of the file or device (or NBD export) in bytes.
    pub fn len_bytes(&self) -> Result<u64, BlockIoError> {
        if let Some(client) = self.nbd() {
            return Ok(client.export().size_bytes);
        }
        if let Some(client) = self.vhost_user_blk() {
            return Ok(client.capacity_bytes());
        }
        // lseek(SEEK_END) is what gives a block device's size; metadata says 0.
        // SAFETY: lseek on an fd we own; it does not touch memory.
        let end = unsafe { libc::lseek(self.as_raw_fd(), 0, libc::SEEK_END) };
        if end < 0 {
            return Err(BlockIoError::Control {
                what: "lseek(SEEK_END)",
                path: self.path.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(end as u64)
    }

    /// Bytes an unprivileged writer may still allocate on the filesystem
    /// holding the file (`fstatvfs`: `f_bavail * f_frsize`), for messages
    /// about a full filesystem.
    pub fn fs_free_bytes(&self) -> io::Result<u64> {
        fs_free_bytes(self.local_file("fstatvfs")?)
    }

    /// Allocates blocks for `[0, len_bytes)` (`fallocate` mode 0), so that
    /// later writes there cannot fail for want of space. Existing content
    /// is kept and the file grows to `len_bytes` if it is shorter.
    pub fn reserve(&self, len_bytes: u64) -> Result<(), BlockIoError> {
        self.local_file("fallocate")?;
        let len = i64::try_from(len_bytes).unwrap_or(i64::MAX);
        loop {
            // SAFETY: fallocate on a descriptor we own; it touches no memory.
            let rc = unsafe { libc::fallocate64(self.as_raw_fd(), 0, 0, len) };
            if rc == 0 {
                return Ok(());
            }
            let source = io::Error::last_os_error();
            if source.raw_os_error() != Some(libc::EINTR) {
                return Err(BlockIoError::Control {
                    what: "fallocate",
                    path: self.path.clone(),
                    source,
                });
            }
        }
    }

    /// Cuts or extends the file to `len_bytes` (`ftruncate`).
    pub fn set_len(&self, len_bytes: u64) -> Result<(), BlockIoError> {
        self.local_file("ftruncate")?
            .set_len(len_bytes)
            .map_err(|source| BlockIoError::Control {
                what: "ftruncate",
                path: self.path.clone(),
                source,
            })
    }
}

/// Switches `O_DIRECT` on. `fcntl(F_SETFL)` checks the filesystem's support,
/// so EINVAL here means exactly "no direct I/O on this filesystem", unlike
/// EINVAL from `open`, which has other causes.
fn set_direct(file: &File, name: &Path) -> Result<(), BlockIoError> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL on an fd we own reads no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(BlockIoError::Control {
            what: "fcntl(F_GETFL)",
            path: name.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: F_SETFL on an fd we own reads no memory of ours.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) {
            return Err(BlockIoError::DirectIoUnsupported {
                path: name.to_owned(),
            });
        }
        return Err(BlockIoError::Control {
            what: "fcntl(F_SETFL, O_DIRECT)",
            path: name.to_owned(),
            source: err,
        });
    }
    Ok(())
}

/// (offset/length alignment, memory alignment) for `O_DIRECT`: what statx
/// reports, else the device's logical sector size, else a page.
fn direct_alignment(file: &File, is_block_device: bool) -> (usize, usize) {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: statx writes at most one struct statx into stx, which is that
    // size; the empty path with AT_EMPTY_PATH refers to the fd itself.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            stx.as_mut_ptr(),
        )
    };
    if rc == 0 {
        // SAFETY: statx succeeded, and the struct was zeroed before, so every
        // field is initialised either way.
        let stx = unsafe { stx.assume_init() };
        if stx.stx_mask & libc::STATX_DIOALIGN != 0
            && stx.stx_dio_offset_align > 0
            && stx.stx_dio_mem_align > 0
        {
            return (
                stx.stx_dio_offset_align as usize,
                stx.stx_dio_mem_align as usize,
            );
        }
    }
    if is_block_device {
        let mut sector: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer, which points
        // to a live c_int.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut sector) };
        if rc == 0 && sector > 0 {
            return (sector as usize, sector as usize);
        }
    }
    (DEFAULT_DIRECT_ALIGN_BYTES, DEFAULT_DIRECT_ALIGN_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{test_dir, with_ramfs};
    use crate::tests::{pattern, temp_file, UNIT};
    use crate::AlignedBuf;

    #[test]
    fn auto_falls_back_when_io_uring_setup_fails() {
        let raw = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(test_dir())
            .unwrap();
        let f = BlockFile::from_file_with_rings(
            raw,
            PathBuf::from("fallback-test"),
            &BlockOptions::default(),
            |_, _| Err(io::Error::from_raw_os_error(libc::EPERM)),
        )
        .expect("Auto must fall back");
        assert_eq!(f.engine_name(), "pread/pwrite");
        let data = pattern(7, UNIT);
        f.write_at(0, &data).unwrap();
        let mut back = AlignedBuf::new(UNIT, 4096);
        f.read_at(0, &mut back).unwrap();
        assert!(back[..] == data[..]);
    }

    #[test]
    fn forced_io_uring_reports_setup_failure() {
        let raw = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(test_dir())
            .unwrap();
        let opts = BlockOptions {
            engine: Engine::IoUring,
            ..BlockOptions::default()
        };
        let err = BlockFile::from_file_with_rings(raw, PathBuf::from("x"), &opts, |_, _| {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        })
        .unwrap_err();
        assert!(matches!(err, BlockIoError::RingSetup { .. }), "{err}");
        assert!(err.to_string().contains("io_uring_disabled"));
    }

    #[test]
    fn create_new_is_private_and_never_reuses_a_file() {
        use std::os::unix::fs::PermissionsExt;
        let path = test_dir().join(format!(".blockio-create-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let f = BlockFile::create_new(&path, &BlockOptions::default()).unwrap();
        assert_eq!(f.len_bytes().unwrap(), 0);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(f);
        std::fs::write(&path, vec![1u8; 3 * UNIT]).unwrap();
        let err = BlockFile::create_new(&path, &BlockOptions::default()).unwrap_err();
        let kept = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(&err, BlockIoError::Open { source, .. } if source.kind() == io::ErrorKind::AlreadyExists),
            "{err}"
        );
        assert!(kept == vec![1u8; 3 * UNIT], "an existing file must be kept");
    }

    #[test]
    fn reserve_allocates_and_keeps_content() {
        let f = temp_file(Engine::Sync);
        f.write_at(0, &pattern(3, UNIT)).unwrap();
        f.reserve(4 * UNIT as u64).unwrap();
        assert_eq!(f.len_bytes().unwrap(), 4 * UNIT as u64);
        let mut buf = AlignedBuf::new(UNIT, 4096);
        f.read_at(0, &mut buf).unwrap();
        assert!(buf[..] == pattern(3, UNIT)[..]);
        assert!(f.fs_free_bytes().unwrap() > 0);
        f.set_len(0).unwrap();
        assert_eq!(f.len_bytes().unwrap(), 0);
    }

    #[test]
    fn direct_io_refusal_is_reported() {
        let outcome =
            with_ramfs(
                |dir| match BlockFile::temporary_in(dir, &BlockOptions::default()) {
                    Err(e @ BlockIoError::DirectIoUnsupported { .. }) => e.to_string(),
                    other => format!("unexpected: {other:?}"),
                },
            );
        match outcome {
            Some(msg) => {
                assert!(msg.contains("refuses O_DIRECT"), "{msg}");
                assert!(msg.contains("/var/tmp"), "{msg}");
            }
            None => test_resources::skip(
                "a ramfs directory refuses O_DIRECT",
                test_resources::Resource::Mount,
                "cannot mount a ramfs here (needs root)",
            ),
        }
    }
}

//! Test helpers shared with the crates that build on this one (enable the
//! `test-support` feature in their dev-dependencies): a directory that takes
//! `O_DIRECT` files, and throwaway mounts of other filesystem types.

use std::path::{Path, PathBuf};

use crate::{BlockFile, BlockOptions};

/// A directory whose filesystem takes O_DIRECT files.
pub fn test_dir() -> PathBuf {
    let dir = std::env::temp_dir();
    // Tests need O_DIRECT; /tmp may be tmpfs on other machines.
    if BlockFile::temporary_in(&dir, &BlockOptions::default()).is_ok() {
        dir
    } else {
        PathBuf::from("/var/tmp")
    }
}

/// Runs `f` on a fresh ramfs directory (ramfs refuses O_DIRECT), mounted
/// in a private mount namespace of a new thread so that nothing outside
/// the test sees it. None where mounting is not allowed.
pub fn with_ramfs<R: Send>(f: impl FnOnce(&Path) -> R + Send) -> Option<R> {
    with_mount(c"ramfs", None, f)
}

/// [`with_ramfs`] for any filesystem type with mount data, e.g. a
/// `size=16m` tmpfs to fill up. None where mounting is not allowed.
pub fn with_mount<R: Send>(
    fstype: &std::ffi::CStr,
    data: Option<&std::ffi::CStr>,
    f: impl FnOnce(&Path) -> R + Send,
) -> Option<R> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: unshare affects only this thread's mount namespace.
                if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                    return None;
                }
                // SAFETY: a mount syscall with NUL-terminated strings; it
                // makes this namespace's mounts private so that none of
                // ours propagates to the host.
                let private = unsafe {
                    libc::mount(
                        c"none".as_ptr(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    )
                } == 0;
                if !private {
                    return None;
                }
                let dir = test_dir().join(format!(
                    ".blockio-{}-{}-{:?}",
                    fstype.to_string_lossy(),
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&dir).ok()?;
                let cdir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
                // SAFETY: as above.
                let mounted = unsafe {
                    libc::mount(
                        c"none".as_ptr(),
                        cdir.as_ptr(),
                        fstype.as_ptr(),
                        0,
                        data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
                    )
                } == 0;
                let result = mounted.then(|| f(&dir));
                if mounted {
                    // SAFETY: unmounting what this thread mounted.
                    unsafe { libc::umount2(cdir.as_ptr(), libc::MNT_DETACH) };
                }
                let _ = std::fs::remove_dir(&dir);
                result
            })
            .join()
            .expect("ramfs test thread")
    })
}

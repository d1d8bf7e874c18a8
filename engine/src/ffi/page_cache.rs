//! A file's pages dropped from the page cache, so the next read of it comes from storage: the
//! runner's cold start (`cold_start`, `memory_limit`).
use std::os::fd::AsRawFd;
use std::path::Path;

/// Asks the kernel to drop `path`'s cached pages (`posix_fadvise(POSIX_FADV_DONTNEED)` over the
/// whole file). Only clean pages that no process maps go: a model another process holds mapped
/// keeps its pages, so the caller releases its own model first.
pub fn drop_file_pages(path: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    // Dirty pages are not dropped; a model file is read-only here, but one just written (a
    // synthetic model) may still be dirty.
    f.sync_data()?;
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for the
    // whole call (`f` lives until the end of this function), and offset 0 with length 0 means
    // "to the end of the file". It touches no memory of this process.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

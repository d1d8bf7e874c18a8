//! Engine-owned address ranges: reserved anonymous memory (`MAP_NORESERVE`, committed as written)
//! whose pages can be handed back (`MADV_DONTNEED`).
use std::ptr::NonNull;

/// A private anonymous mapping.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; access goes through `&self`/`&mut self`.
unsafe impl Send for Region {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing borrows the region any more
        // (tensors pointing here are rebound or their model is being dropped first).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

impl Region {
    /// Reserves `len` bytes (at least one page) without committing memory.
    pub fn reserve(len: usize) -> std::io::Result<Region> {
        let len = len.max(1).next_multiple_of(page_size());
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Region {
            ptr: NonNull::new(p.cast())
                .ok_or_else(|| std::io::Error::other("mmap returned NULL"))?,
            len,
        })
    }

    /// Bytes reserved.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The whole region, read-only (what a weight bound to it computes on).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is readable for `len` bytes; writers need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole region as bytes (untouched pages read as zero).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is readable and writable for `len` bytes and exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Moves the pages of `src` to `[off, off + src.len())` of this region without copying
    /// (`mremap`): the read-ahead path fills a region of its own on a reader thread, then the
    /// owner of the tensor's region takes the pages in at the routing node. Only for a
    /// page-aligned `off` and a `src` of exactly `len` bytes (a whole number of pages); otherwise,
    /// or when the kernel refuses, `src` comes back for the caller to copy.
    pub fn adopt(&mut self, off: usize, len: usize, src: Region) -> Result<(), Region> {
        let page = page_size();
        let fits = off.is_multiple_of(page)
            && src.len == len
            && off.checked_add(len).is_some_and(|end| end <= self.len);
        if !fits {
            return Err(src);
        }
        // SAFETY: both ranges are private anonymous mappings owned by these two values
        // (`&mut self` and `src` by value, so nothing else reads or writes either); the
        // destination lies inside this mapping and is replaced atomically by MREMAP_FIXED; on
        // success the source range no longer exists, so `src` is forgotten instead of unmapped.
        let p = unsafe {
            libc::mremap(
                src.ptr.as_ptr().cast(),
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                self.ptr.as_ptr().add(off).cast::<libc::c_void>(),
            )
        };
        if p == libc::MAP_FAILED {
            return Err(src);
        }
        std::mem::forget(src);
        Ok(())
    }

    /// Hands back the whole pages inside `[off, off + len)`; partial pages at the edges stay,
    /// since a neighbour may live on them. Returns the bytes released.
    pub fn release(&mut self, off: usize, len: usize) -> usize {
        let base = self.ptr.as_ptr() as usize;
        let Some((start, end)) = whole_pages(base + off, len.min(self.len.saturating_sub(off)))
        else {
            return 0;
        };
        // SAFETY: the range is page-aligned and inside the mapping; DONTNEED on private anonymous
        // memory only drops those pages (they read back as zero), and `&mut self` guarantees no
        // one is reading them.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        end - start
    }
}

/// The whole pages inside the address range `[at, at + len)`, as (start, end); `None` when it
/// holds none. What can be handed back without touching a neighbour on a partial page.
pub(super) fn whole_pages(at: usize, len: usize) -> Option<(usize, usize)> {
    let page = page_size();
    let (start, end) = (at.next_multiple_of(page), ((at + len) / page) * page);
    (end > start).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adopt_moves_whole_pages_and_refuses_the_rest() {
        let page = page_size();
        let mut dst = Region::reserve(4 * page).unwrap();
        dst.as_mut_slice().fill(1);
        let mut src = Region::reserve(2 * page).unwrap();
        src.as_mut_slice().fill(9);
        assert!(dst.adopt(page, 2 * page, src).is_ok());
        let s = dst.as_mut_slice();
        assert_eq!(
            (s[page - 1], s[page], s[3 * page - 1], s[3 * page]),
            (1, 9, 9, 1)
        );
        // Unaligned offset, wrong length, past the end: the pages come back untouched.
        for (off, len) in [(page / 2, 2 * page), (0, page), (3 * page, 2 * page)] {
            let mut src = Region::reserve(2 * page).unwrap();
            src.as_mut_slice().fill(5);
            let mut back = dst.adopt(off, len, src).unwrap_err();
            assert!(back.as_mut_slice().iter().all(|&b| b == 5));
        }
        assert_eq!(dst.as_mut_slice()[0], 1);
    }

    #[test]
    fn release_zeroes_only_whole_pages() {
        let page = page_size();
        let mut r = Region::reserve(4 * page).unwrap();
        r.as_mut_slice().fill(7);
        // Release from the middle of page 0 to the middle of page 3: pages 1 and 2 go.
        assert_eq!(r.release(page / 2, 3 * page), 2 * page);
        let s = r.as_mut_slice();
        assert_eq!(s[page - 1], 7);
        assert_eq!(s[page], 0);
        assert_eq!(s[3 * page - 1], 0);
        assert_eq!(s[3 * page], 7);
    }
}

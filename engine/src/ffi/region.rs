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

    /// Moves the pages of `[off, off + len)` out into a region of their own (`mremap` with
    /// `MREMAP_DONTUNMAP`), leaving the range mapped and reading as zero, as after `release`.
    /// An evicted expert's pages, already faulted in, then take the next miss's bytes through
    /// `adopt`, instead of that read faulting in and zeroing fresh pages. `None` for a range that
    /// is not whole pages, or when the kernel refuses (before Linux 5.7); the caller releases it.
    pub fn take_out(&mut self, off: usize, len: usize) -> Option<Region> {
        let page = page_size();
        let fits = off.is_multiple_of(page)
            && len > 0
            && len.is_multiple_of(page)
            && off.checked_add(len).is_some_and(|end| end <= self.len);
        if !fits {
            return None;
        }
        // SAFETY: the range is page-aligned and inside this private anonymous mapping, which
        // `&mut self` holds exclusively; DONTUNMAP moves its pages to a new mapping the kernel
        // places, and leaves the range mapped with no pages (zero on the next touch), so the
        // region stays whole and every pointer into it stays valid.
        let p = unsafe {
            libc::mremap(
                self.ptr.as_ptr().add(off).cast::<libc::c_void>(),
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP,
                // No address wanted; passed, not left out, since this kernel reads the argument
                // with DONTUNMAP and refuses whatever a variadic call leaves there.
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(Region {
            ptr: NonNull::new(p.cast())?,
            len,
        })
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

    /// The process's mappings that overlap `r` (from /proc/self/maps; other tests' threads map
    /// and unmap elsewhere meanwhile).
    fn mappings_in(r: &Region) -> usize {
        let (lo, hi) = (r.ptr.as_ptr() as usize, r.ptr.as_ptr() as usize + r.len);
        let range = |l: &str| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        };
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(range)
            .filter(|&(a, b)| a < hi && b > lo)
            .count()
    }

    #[test]
    fn take_out_moves_the_pages_and_leaves_zeroes() {
        let page = page_size();
        let mut r = Region::reserve(4 * page).unwrap();
        r.as_mut_slice().fill(3);
        let mut out = r.take_out(page, 2 * page).expect("Linux 5.7 or later");
        assert!(out.as_mut_slice().iter().all(|&b| b == 3));
        let s = r.as_mut_slice();
        assert_eq!(
            (s[page - 1], s[page], s[3 * page - 1], s[3 * page]),
            (3, 0, 0, 3)
        );
        // Not whole pages, or past the end: nothing moves.
        assert!(r.take_out(page / 2, page).is_none());
        assert!(r.take_out(0, page / 2).is_none());
        assert!(r.take_out(3 * page, 2 * page).is_none());
        assert_eq!(r.as_mut_slice()[0], 3);
    }

    /// What lets the streamer move slices without a bound on moves: every mapping boundary a
    /// take-out or an adopt leaves inside a region lies at a slice edge, so a region of `n`
    /// slices never splits into more than `n` mappings, whatever the number of moves.
    #[test]
    fn moves_between_slices_never_split_a_region_past_its_slices() {
        let page = page_size();
        let n = 8;
        let mut r = Region::reserve(n * page).unwrap();
        r.as_mut_slice().fill(1);
        assert_eq!(mappings_in(&r), 1);
        for i in 0..200 {
            let (from, to) = ((i * 3) % n, (i * 5 + 1) % n);
            let Some(chunk) = r.take_out(from * page, page) else {
                panic!("take_out refused");
            };
            assert!(r.adopt(to * page, page, chunk).is_ok());
        }
        let now = mappings_in(&r);
        assert!(now > 1 && now <= n, "{now} mappings for {n} slices");
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

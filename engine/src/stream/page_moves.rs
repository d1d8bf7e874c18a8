//! Whether an evicted expert's pages can be moved out of its region (`mremap` with
//! `MREMAP_DONTUNMAP`) and the range they left filled again by `read()`: found once per process by
//! doing exactly that on one page. Kernels before Linux 5.7 (phones launched on 5.4) refuse the
//! flag; qemu-user (7.2, 10.0) accepts it but then fails a `read()` into the range left behind
//! with EFAULT. Where the check fails, the cache releases evicted pages instead
//! (`MADV_DONTNEED`), which every kernel does right.
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;

use crate::ffi::region::{page_size, Region};

/// What the cache does with an evicted expert's pages on this system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageMoves {
    /// Moved out and kept for the next miss (no page fault or zeroing on its read).
    Move,
    /// Released; the reason the self-check gave.
    Release(String),
}

impl PageMoves {
    /// `move` or `release`, as the telemetry column and `bmoe devices` print it.
    pub fn label(&self) -> &'static str {
        match self {
            PageMoves::Move => "move",
            PageMoves::Release(_) => "release",
        }
    }

    /// True when evicted pages are moved out and kept.
    pub fn moves(&self) -> bool {
        matches!(self, PageMoves::Move)
    }
}

/// The self-check's verdict, run on the first call and kept for the process.
pub fn page_moves() -> &'static PageMoves {
    static VERDICT: OnceLock<PageMoves> = OnceLock::new();
    VERDICT.get_or_init(|| match self_check() {
        Ok(()) => PageMoves::Move,
        Err(why) => PageMoves::Release(why),
    })
}

/// Bytes written through the socket into the range a page left; not zero, so a read that
/// "succeeds" without landing is caught too.
const PROBE: [u8; 64] = [0xA5; 64];

/// Moves one page out of a two-page region, as an eviction does, then `read()`s into the range it
/// left, as the next miss's read does (a socket stands in for the GGUF: no file is needed).
pub(crate) fn self_check() -> Result<(), String> {
    let page = page_size();
    let mut region =
        Region::reserve(2 * page).map_err(|e| format!("no memory for the self-check: {e}"))?;
    region.as_mut_slice().fill(1);
    let moved = region
        .take_out(0, page)
        .ok_or("mremap(MREMAP_DONTUNMAP) is refused (Linux before 5.7)")?;
    if moved.as_slice().iter().any(|&b| b != 1) {
        return Err("mremap(MREMAP_DONTUNMAP) moved the page but its bytes did not follow".into());
    }
    let (mut tx, mut rx) =
        UnixStream::pair().map_err(|e| format!("no socket pair for the self-check: {e}"))?;
    tx.write_all(&PROBE)
        .map_err(|e| format!("self-check socket write: {e}"))?;
    let into = &mut region.as_mut_slice()[..PROBE.len()];
    match rx.read(into) {
        Ok(n) if n == PROBE.len() && into[..] == PROBE[..] => Ok(()),
        Ok(n) => Err(format!(
            "a read() into a range a page moved out of landed {n} of {} bytes wrong",
            PROBE.len()
        )),
        Err(e) => Err(format!(
            "a read() into a range a page moved out of fails ({e}; qemu-user does this)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux 5.7 or later, natively: the check passes, and its verdict is kept.
    #[test]
    fn moves_work_on_this_kernel() {
        assert_eq!(self_check(), Ok(()));
        assert!(page_moves().moves());
        assert_eq!(page_moves().label(), "move");
    }
}

//! Freed heap given back to the kernel: after a model is released, the C allocator keeps the
//! pages of its freed chunks resident until it reuses them, and they would count toward the next
//! measurement's resident memory.

/// Returns the allocator's free heap pages to the kernel (glibc's `malloc_trim`); true when
/// some were. A no-op where the C library has no such call.
pub fn trim_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes a byte count to keep free at the top of the heap (0: none)
        // and only releases pages of chunks the allocator already holds as free; it touches no
        // memory a live allocation owns, and glibc serialises it with the arenas' own locks.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

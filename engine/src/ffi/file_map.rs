//! Read-only shared mappings of model files (the dense weights llama.cpp's tensors point into).
use std::fs::File;

use memmap2::{Advice, Mmap, MmapOptions};

/// A model file mapped read-only and shared, advised for random access.
pub struct FileMap(Mmap);

impl FileMap {
    /// Maps all of `f`.
    pub fn map(f: &File) -> std::io::Result<FileMap> {
        // SAFETY: the file is mapped read-only and shared; the engine never writes through it.
        // Like llama.cpp's own mapping, a file truncated underneath a running model would fault
        // on access; model files are not modified while a run uses them.
        let m = unsafe { MmapOptions::new().map(f) }?;
        // Advice is a hint: a kernel that ignores it only reads more.
        let _ = m.advise(Advice::Random);
        Ok(FileMap(m))
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Asks the kernel to read `len` bytes at `offset` ahead (a hint).
    pub fn will_need(&self, offset: usize, len: usize) {
        let _ = self.0.advise_range(Advice::WillNeed, offset, len);
    }

    /// Drops the mapping's resident pages; a later access reads the same bytes from the file.
    pub fn release_pages(&self) {
        // SAFETY: a read-only shared file mapping: DONTNEED only drops its page-table entries; a
        // later access reads the same bytes from the file again.
        let _ = unsafe { self.0.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
    }
}

//! A context's KV cache and recurrent state moved into another buffer type (a prefill device's
//! host buffer), and the pages of llama.cpp's own buffers handed back to the kernel.
//!
//! llama.cpp allocates the memory's tensors at context creation and offers no call that moves
//! them; the engine finds them through the graph (`memory_tensor`), binds each to a buffer of its
//! own and copies the bytes over. llama.cpp keeps its buffers and still writes zeros into them on
//! every `llama_memory_clear`, so their pages are released again after each clear
//! (`MovedMemory::after_clear`), and the moved buffer is zeroed the way llama.cpp zeroes its own.
use ggml_sys as sys;

use super::buffer::{BufferType, WeightsBuffer};
use super::error::FfiError;
use super::quiet::Quiet;
use super::region::{page_size, whole_pages};
use super::tensor::{name, view_root, Binding, TensorPtr};

/// Name prefixes llama.cpp gives the memory's tensors: attention K and V, recurrent R and S.
const MEMORY_PREFIXES: [&str; 4] = ["cache_k_l", "cache_v_l", "cache_r_l", "cache_s_l"];

/// The memory tensor `t` is or views (`cache_k_l3` for `cache_k_l3 (view)`), when it has a
/// buffer. Unlike a weight it lives as long as its context, not its model: the session that owns
/// both keeps the pointer no longer than the context.
pub fn memory_tensor(t: &sys::ggml_tensor) -> Option<TensorPtr> {
    let root = view_root(t);
    let n = name(root);
    let is_memory = MEMORY_PREFIXES.iter().any(|p| {
        n.strip_prefix(p)
            .is_some_and(|il| !il.is_empty() && il.bytes().all(|b| b.is_ascii_digit()))
    });
    (is_memory && !root.buffer.is_null()).then(|| TensorPtr::of_model(root))
}

/// The moved memory: its buffer, and where the tensors lived before.
pub struct MovedMemory {
    buffer: WeightsBuffer,
    tensors: Vec<TensorPtr>,
    /// Each tensor's old bytes (host address, length): llama.cpp's buffers, which nothing reads
    /// any more.
    old: Vec<(usize, usize)>,
}

// SAFETY: the buffer and tensors belong to one context, used only by the session owning both.
unsafe impl Send for MovedMemory {}

impl MovedMemory {
    /// Binds every tensor of `tensors` (memory tensors of one context, in host buffers) to one new
    /// buffer of `buft` and copies its bytes there, then releases the old pages.
    pub fn move_into(
        buft: BufferType,
        tensors: &[TensorPtr],
        quiet: &mut Quiet<'_>,
    ) -> Result<MovedMemory, FfiError> {
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut size = 0usize;
        for &t in tensors {
            let b = t.binding();
            if b.host_bytes().is_none() {
                return Err(FfiError::Argument(format!(
                    "{}: the memory tensor is not in host memory, so it cannot be copied from",
                    t.name()
                )));
            }
            offsets.push(size);
            size += buft.alloc_size(t);
        }
        let buffer = WeightsBuffer::alloc_plain(buft, size)?;
        let was: Vec<Binding> = tensors.iter().map(|t| t.binding()).collect();
        for (i, (&t, &off)) in tensors.iter().zip(&offsets).enumerate() {
            let bytes = was[i].host_bytes().map(<[u8]>::to_vec).unwrap_or_default();
            if let Err(e) = buffer.bind(t, off, quiet).and_then(|()| t.upload(&bytes)) {
                // What was moved goes back, so the context stays whole.
                for (&t, &b) in tensors.iter().zip(&was).take(i + 1) {
                    let _ = t.restore(b, quiet);
                }
                return Err(e);
            }
        }
        let moved = MovedMemory {
            buffer,
            tensors: tensors.to_vec(),
            old: was
                .iter()
                .map(|b| (b.host_address(), b.host_bytes().map_or(0, <[u8]>::len)))
                .collect(),
        };
        moved.release_old();
        Ok(moved)
    }

    /// After llama.cpp cleared its memory (zeros written into its own buffers): the moved buffer
    /// is zeroed the same way and the old pages are released again.
    pub fn after_clear(&mut self) {
        // SAFETY: the buffer is live and owned; the session that owns it runs no decode now
        // (`&mut self` is only reachable from the session's own calls between decodes).
        unsafe { sys::ggml_backend_buffer_clear(self.buffer.raw(), 0) };
        self.release_old();
    }

    /// The whole pages of the old bytes, as (start, end) address ranges: what can be released.
    fn old_pages(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.old
            .iter()
            .filter_map(|&(at, len)| whole_pages(at, len))
    }

    /// Bytes of the old buffers' whole pages (what `release_old` hands back).
    pub fn old_page_bytes(&self) -> usize {
        self.old_pages().map(|(s, e)| e - s).sum()
    }

    /// Hands the old bytes' whole pages back to the kernel; returns how many bytes that was.
    pub fn release_old(&self) -> usize {
        let mut released = 0;
        for (start, end) in self.old_pages() {
            // SAFETY: `[start, end)` lies inside the bytes llama.cpp allocated for a tensor that
            // is now bound elsewhere, so nothing reads them; DONTNEED on that private memory
            // drops the pages (a later write by llama.cpp's clear faults in fresh zero pages).
            // Partial pages at the edges stay: a neighbour may live on them.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
            released += end - start;
        }
        released
    }

    /// Bytes of the old buffers still resident (`mincore`), whole pages only.
    pub fn old_resident_bytes(&self) -> usize {
        let page = page_size();
        let mut resident = 0;
        for (start, end) in self.old_pages() {
            let mut vec = vec![0u8; (end - start) / page];
            // SAFETY: a page-aligned range of mapped memory (llama.cpp's live buffer) and a
            // vector of one byte per page, as mincore requires.
            let rc =
                unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) };
            if rc == 0 {
                resident += vec.iter().filter(|&&b| b & 1 == 1).count() * page;
            }
        }
        resident
    }

    /// Tensors moved.
    pub fn tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Bytes of the new buffer.
    pub fn bytes(&self) -> usize {
        self.buffer.size()
    }
}

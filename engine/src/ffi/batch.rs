//! An owned `llama_batch`: tokens, positions, one sequence id each.
use ggml_sys as sys;

use super::vocab::Token;

/// A token batch with room for `capacity` tokens.
pub struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: `raw` came from llama_batch_init and is freed once.
        unsafe { sys::llama_batch_free(self.raw) }
    }
}

impl Batch {
    /// Allocates a batch for up to `capacity` tokens.
    pub fn new(capacity: usize) -> Self {
        // SAFETY: allocates arrays of `capacity` entries with one sequence id slot each.
        let raw = unsafe { sys::llama_batch_init(capacity as i32, 0, 1) };
        Self { raw, capacity }
    }

    /// Empties the batch.
    pub fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    /// Tokens in the batch.
    pub fn len(&self) -> usize {
        self.raw.n_tokens as usize
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.raw.n_tokens == 0
    }

    /// Appends `token` at position `pos` of sequence 0; `logits` asks for its output row.
    /// Panics only on a programming error (more tokens than capacity).
    pub fn push(&mut self, token: Token, pos: i32, logits: bool) {
        self.push_seq(token, pos, 0, logits);
    }

    /// Appends `token` at position `pos` of sequence `seq`.
    pub fn push_seq(&mut self, token: Token, pos: i32, seq: i32, logits: bool) {
        let i = self.raw.n_tokens as usize;
        assert!(
            i < self.capacity,
            "batch overflow: capacity {}",
            self.capacity
        );
        // SAFETY: `i < capacity`, and every array was allocated for `capacity` entries with one
        // seq-id slot per entry by llama_batch_init.
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = pos;
            *self.raw.n_seq_id.add(i) = 1;
            *(*self.raw.seq_id.add(i)).add(0) = seq;
            *self.raw.logits.add(i) = logits as i8;
        }
        self.raw.n_tokens += 1;
    }

    pub(super) fn raw(&self) -> sys::llama_batch {
        self.raw
    }
}

//! An owned `llama_batch`: tokens, positions, one sequence id each (or up to a fixed number, for
//! tokens several sequences share).
use ggml_sys as sys;

use super::vocab::Token;

/// A token batch with room for `capacity` tokens.
pub struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
    /// Sequence-id slots allocated per token.
    seq_slots: usize,
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
        Self::with_seq_slots(capacity, 1)
    }

    /// Allocates a batch for up to `capacity` tokens, each of which may belong to up to
    /// `seq_slots` sequences at once.
    pub fn with_seq_slots(capacity: usize, seq_slots: usize) -> Self {
        let seq_slots = seq_slots.max(1);
        // SAFETY: allocates arrays of `capacity` entries with `seq_slots` sequence-id slots each.
        let raw = unsafe { sys::llama_batch_init(capacity as i32, 0, seq_slots as i32) };
        Self {
            raw,
            capacity,
            seq_slots,
        }
    }

    /// Empties the batch.
    pub fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    /// Tokens in the batch.
    pub fn len(&self) -> usize {
        self.raw.n_tokens as usize
    }

    /// Appends `token` at position `pos` of sequence 0; `logits` asks for its output row.
    /// Panics only on a programming error (more tokens than capacity).
    pub fn push(&mut self, token: Token, pos: i32, logits: bool) {
        self.push_seq(token, pos, 0, logits);
    }

    /// Appends `token` at position `pos` of sequence `seq`.
    pub fn push_seq(&mut self, token: Token, pos: i32, seq: i32, logits: bool) {
        self.push_seqs(token, pos, &[seq], logits);
    }

    /// Appends `token` at position `pos` of every sequence in `seqs` (one KV cell they share;
    /// llama.cpp masks attention by the first of them). Panics only on a programming error (more
    /// tokens than capacity, no sequence or more sequences than the batch's slots).
    pub fn push_seqs(&mut self, token: Token, pos: i32, seqs: &[i32], logits: bool) {
        let i = self.raw.n_tokens as usize;
        assert!(
            i < self.capacity,
            "batch overflow: capacity {}",
            self.capacity
        );
        assert!(
            !seqs.is_empty() && seqs.len() <= self.seq_slots,
            "{} sequence ids for {} slots",
            seqs.len(),
            self.seq_slots
        );
        // SAFETY: `i < capacity` and `seqs.len() <= seq_slots`, and llama_batch_init allocated
        // every array for `capacity` entries and each entry's seq-id array for `seq_slots` ids.
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = pos;
            *self.raw.n_seq_id.add(i) = seqs.len() as i32;
            let ids = *self.raw.seq_id.add(i);
            for (k, &seq) in seqs.iter().enumerate() {
                *ids.add(k) = seq;
            }
            *self.raw.logits.add(i) = logits as i8;
        }
        self.raw.n_tokens += 1;
    }

    pub(super) fn raw(&self) -> sys::llama_batch {
        self.raw
    }
}

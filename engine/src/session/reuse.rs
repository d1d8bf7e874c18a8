//! Prefix reuse: the session remembers which tokens its KV cache holds (sequence 0, positions
//! 0..n), and a decision keeps the longest common prefix with its own prompt instead of clearing.
//! Where the memory cannot keep a prefix by dropping the rest (a sliding window that already
//! dropped cells the prefix needs, a recurrent state), a decision saves sequence 0's state at the
//! boundary the next prompts will repeat (the end of its rendered `prefix`) and the next decision
//! that starts with those tokens restores it instead of prefilling them again.
use crate::error::Result;
use crate::options::PrefixReuse;
use crate::telemetry::ReuseOutcome;

use super::prefill::{Outputs, FA_TILE, PAD_FROM};
use super::Session;

/// What reuse did before a prefill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reuse {
    /// Tokens kept in the cache (positions `0..kept`).
    pub(crate) kept: usize,
    /// Hit, extend or miss.
    pub(crate) outcome: ReuseOutcome,
    /// Why nothing was kept, for a miss.
    pub(crate) reason: &'static str,
}

/// Sequence 0's state when the cache held exactly `tokens` (positions `0..tokens.len()`).
pub(crate) struct Snapshot {
    pub(crate) tokens: Vec<i32>,
    pub(crate) data: Vec<u8>,
}

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Session<'_> {
    /// Empties the cache and what the session remembers of it.
    pub(crate) fn forget(&mut self) -> Result<()> {
        self.kv.clear();
        self.last_logits.clear();
        self.ctx.clear_memory()?;
        // llama.cpp zeroed its own buffers, faulting their pages back in; the moved memory is
        // zeroed the same way and those pages go back.
        if let Some(m) = self.memory.as_mut() {
            m.after_clear();
        }
        Ok(())
    }

    /// Prepares sequence 0 for `tokens`: keeps the longest prefix the cache already holds, drops
    /// the rest, and returns how many tokens were kept. All of them only when the cache holds
    /// exactly this prompt and its last logits were kept (a `hit`: nothing to prefill); otherwise
    /// at most all but the last token, whose logits the caller needs. Anything the memory cannot
    /// keep exactly is cleared instead.
    pub(crate) fn reuse_prefix(&mut self, tokens: &[i32]) -> Result<Reuse> {
        let miss = |s: &mut Self, reason| {
            s.forget()?;
            Ok(Reuse {
                kept: 0,
                outcome: ReuseOutcome::Miss,
                reason,
            })
        };
        if self.prefix_reuse == PrefixReuse::Off {
            return miss(self, "off");
        }
        if self.kv.is_empty() {
            return miss(self, "empty");
        }
        if self.kv == tokens && !self.last_logits.is_empty() {
            return Ok(Reuse {
                kept: tokens.len(),
                outcome: ReuseOutcome::Hit,
                reason: "",
            });
        }
        self.last_logits.clear();
        let mut keep = common_prefix(&self.kv, tokens).min(tokens.len().saturating_sub(1));
        if keep == 0 {
            return miss(self, "no common prefix");
        }
        if self.prefix_reuse == PrefixReuse::On {
            keep = self.same_kernel_keep(keep, tokens.len());
        }
        if self.prefix_reuse == PrefixReuse::Auto {
            // Back to a piece boundary: the kept cells were computed in the same pieces a
            // fresh prefill of this prompt would run, and so is everything after them.
            let w = self.piece_width().max(1);
            keep -= keep % w;
            if keep == 0 {
                return miss(self, "common prefix shorter than one prompt piece (auto)");
            }
        }
        // A sliding-window cache may already have dropped positions the kept prefix needs (the
        // rule llama.cpp's own server applies before it reuses a slot). A recurrent state's
        // smallest position is its last one (a hybrid memory reports the larger of its two
        // minimums): the same test sends it here whenever the prefix is shorter than the cache.
        let pos_min = self.ctx.seq_pos_min(0);
        let n_swa = self.model.raw.n_swa() as usize;
        if pos_min > 0 && pos_min as usize > keep.saturating_sub(n_swa) {
            let why = if self.recurrent {
                "a recurrent state cannot drop part of a sequence"
            } else {
                "sliding window already dropped part of the prefix"
            };
            return self.restore_or_miss(tokens, keep, why);
        }
        // Recurrent and hybrid memories refuse to drop part of a sequence.
        if keep < self.kv.len() && !self.ctx.seq_rm(0, keep as i32, -1) {
            self.snapshots = true;
            return self.restore_or_miss(tokens, keep, "the memory cannot drop part of a sequence");
        }
        self.kv.truncate(keep);
        Ok(Reuse {
            kept: keep,
            outcome: ReuseOutcome::Extend,
            reason: "",
        })
    }
}

impl Session<'_> {
    /// `on` keeps `keep` of `n` tokens and prefills the rest from there, joining the grid at its
    /// next step. The rows before that step run in a piece of their own; a fresh prefill runs
    /// them in the grid piece that holds them. When that piece takes flash attention's tiled
    /// kernel (at least `FA_TILE` rows, or padded to them), this one must too, or its rows round
    /// differently (the 1e-2 drift `on` had): keep fewer tokens, down to a piece that is padded
    /// (`PAD_FROM` rows) or, where nothing is padded, of `FA_TILE` rows.
    fn same_kernel_keep(&self, keep: usize, n: usize) -> usize {
        let w = self.piece_width().max(1);
        let g0 = keep - keep % w;
        let g1 = (g0 + w).min(n);
        let tiled = |rows: usize| rows >= FA_TILE || self.tail_padding(rows, g1, Outputs::Last) > 0;
        if self.model.arena.is_none() && keep > g0 && tiled(g1 - g0) && !tiled(g1 - keep) {
            let pads = self.tail_padding(PAD_FROM, g1, Outputs::Last) > 0;
            g1 - if pads { PAD_FROM } else { FA_TILE }
        } else {
            keep
        }
    }

    /// The cache cannot keep `keep` tokens (`why`): restores the saved state when `tokens` starts
    /// with its tokens and it holds no more than `keep` of them, else clears (a miss).
    fn restore_or_miss(&mut self, tokens: &[i32], keep: usize, why: &'static str) -> Result<Reuse> {
        self.forget()?;
        let usable = self.saved.as_ref().is_some_and(|s| {
            !s.tokens.is_empty() && s.tokens.len() <= keep && tokens.starts_with(&s.tokens)
        });
        if usable {
            if let Some(s) = self.saved.as_ref() {
                if self.ctx.state_seq_set(0, &s.data) {
                    self.kv = s.tokens.clone();
                    return Ok(Reuse {
                        kept: s.tokens.len(),
                        outcome: ReuseOutcome::Restore,
                        reason: why,
                    });
                }
            }
            // Refused (llama.cpp logged why): whatever it read is discarded; start empty.
            self.saved = None;
            self.forget()?;
            return Ok(Reuse {
                kept: 0,
                outcome: ReuseOutcome::Miss,
                reason: "a saved state could not be restored",
            });
        }
        Ok(Reuse {
            kept: 0,
            outcome: ReuseOutcome::Miss,
            reason: why,
        })
    }

    /// Where a decision over `tokens` (the rendered `text`, whose user message is `user`, of
    /// which `prefix` is the leading part) should save its state: the tokens of the text up to
    /// the end of `prefix`, the part the next decisions repeat; in `auto`, back to a piece
    /// boundary. Without the prefix in the text, the longest prefix at a piece boundary.
    pub(crate) fn snapshot_boundary(
        &self,
        text: &str,
        user: &str,
        prefix: &str,
        tokens: &[i32],
    ) -> usize {
        let w = self.piece_width().max(1);
        let last = tokens.len().saturating_sub(1);
        let at = match text.find(user) {
            Some(i) if !prefix.is_empty() => {
                let end = i + prefix.len();
                match self.model.tokenize(&text[..end], true) {
                    Ok(t) => common_prefix(&t, tokens),
                    Err(_) => last - last % w,
                }
            }
            _ => last - last % w,
        };
        let at = at.min(last);
        if self.prefix_reuse == PrefixReuse::Auto {
            at - at % w
        } else {
            at
        }
    }

    /// Saves sequence 0's state, which holds exactly `self.kv`; keeps the previous one when
    /// llama.cpp cannot write it.
    pub(crate) fn save_snapshot(&mut self) {
        if let Some(data) = self.ctx.state_seq_get(0) {
            self.saved = Some(Snapshot {
                tokens: self.kv.clone(),
                data,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefixes() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}

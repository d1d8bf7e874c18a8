//! Prefix reuse: the session remembers which tokens its KV cache holds (sequence 0, positions
//! 0..n), and a decision keeps the longest common prefix with its own prompt instead of clearing.
use crate::error::Result;
use crate::options::PrefixReuse;
use crate::telemetry::ReuseOutcome;

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

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Session<'_> {
    /// Empties the cache and what the session remembers of it.
    pub(crate) fn forget(&mut self) -> Result<()> {
        self.kv.clear();
        self.last_logits.clear();
        Ok(self.ctx.clear_memory()?)
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
        // rule llama.cpp's own server applies before it reuses a slot).
        let pos_min = self.ctx.seq_pos_min(0);
        let n_swa = self.model.raw.n_swa() as usize;
        if pos_min > 0 && pos_min as usize > keep.saturating_sub(n_swa) {
            return miss(self, "sliding window already dropped part of the prefix");
        }
        // Recurrent and hybrid memories refuse to drop part of a sequence.
        if keep < self.kv.len() && !self.ctx.seq_rm(0, keep as i32, -1) {
            return miss(self, "the memory cannot drop part of a sequence");
        }
        self.kv.truncate(keep);
        Ok(Reuse {
            kept: keep,
            outcome: ReuseOutcome::Extend,
            reason: "",
        })
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

//! Prefill: the prompt goes in pieces cut at fixed positions (multiples of the piece width from
//! position 0, on the CPU at most `PROMPT_GRID` wide); the width rule lives here.
use std::time::Instant;

use crate::error::Result;
use crate::ffi::batch::Batch;
use crate::weights::ExecGuard;

use super::Session;

/// Which rows of a piece need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outputs {
    /// Only the prompt's last token.
    Last,
    /// Only the prompt's last token, of a prompt whose cells no later prompt reuses (`generate`
    /// forgets the cache first and keeps nothing): cut at the CPU batch width (`cpu_ubatch`)
    /// instead of the grid, as llama.cpp's own tools cut a prompt. The grid's narrow pieces
    /// serve prefix reuse only, and cost a resident MoE prefill its matmuls' width: each piece
    /// reads every expert it routes to again (docs/benchmarks.md, "Generate's prefill at the
    /// batch width").
    LastWide,
    /// Every token (perplexity).
    All,
    /// No row (the prompt's head, when its last piece runs with the choices; decide.rs).
    None,
}

/// The widest CPU piece of a prompt whose last row only is read. Prompts are cut at multiples of
/// it, so prefix reuse (`auto`) keeps a shared prefix down to the last multiple and then runs the
/// very pieces a fresh prefill runs: bit for bit the same scores. 64 is the narrowest width whose
/// pieces still take flash attention's tiled kernel (`FA_TILE`). Measured on the small preset's
/// replay (docs/benchmarks.md, "Exact reuse on a 64-token grid, padded tails"): against the
/// 128-token grid it halves what each decision loses to the grid, and a fresh prompt prefills a
/// few per cent slower.
pub(crate) const PROMPT_GRID: u32 = 64;

/// The narrowest CPU piece padded to `FA_TILE` rows (`Session::tail_padding`). At 2,400 cells
/// on the small preset a row of the one-row flash-attention kernel cost about 4.7 ms and a
/// padded 64-row piece about 130 ms, so the two cost the same at about 28 rows; the one-row
/// kernel's cost per row grows with the cache, so deeper in it narrower pieces pay
/// (docs/benchmarks.md, "Exact reuse on a 64-token grid, padded tails"). Below this, a piece
/// runs as it is.
pub(crate) const PAD_FROM: usize = 24;

/// Query rows from which ggml's CPU flash attention runs its tiled kernel (`GGML_FA_TILE_Q`);
/// narrower pieces take a one-row kernel whose sums round differently.
pub(crate) const FA_TILE: usize = 64;

impl Session<'_> {
    /// The width of a prompt's leading pieces: the device's when one runs wide pieces, else the
    /// CPU grid's (pieces start at multiples of it from position 0).
    pub(crate) fn piece_width(&self) -> usize {
        if self.model.arena.is_some() {
            self.widths.device as usize
        } else {
            self.widths.grid as usize
        }
    }

    /// Decodes `tokens` at positions `pos0..` and returns the seconds spent. With `Outputs::All`
    /// the caller must read each piece's rows through `on_piece` before the next piece runs.
    pub(crate) fn prefill(
        &mut self,
        tokens: &[i32],
        pos0: usize,
        outputs: Outputs,
        exec: &mut ExecGuard<'_>,
        mut on_piece: impl FnMut(&Self, usize, usize) -> Result<()>,
    ) -> Result<f64> {
        // Every row an output (perplexity): a piece may not exceed the logit-row cap.
        let cap = |w: u32| match outputs {
            Outputs::Last | Outputs::LastWide | Outputs::None => w.max(1) as usize,
            Outputs::All => w.min(self.widths.outputs).max(1) as usize,
        };
        let cpu_width = match outputs {
            Outputs::All | Outputs::LastWide => cap(self.widths.cpu),
            Outputs::Last | Outputs::None => cap(self.widths.grid),
        };
        let dev_width = if self.model.arena.is_some() {
            cap(self.widths.device)
        } else {
            cpu_width
        };
        let t0 = Instant::now();
        let mut batch = Batch::new(cpu_width.max(dev_width));
        let mut start = 0;
        while start < tokens.len() {
            // Cut at multiples of the width from position 0, whatever `pos0`: a prefill after a
            // kept prefix off the grid (`on`) joins the grid at its next step.
            let at = pos0 + start;
            let end_at = |w: usize| (at + w - at % w - pos0).min(tokens.len());
            let on_device = end_at(dev_width) - start >= self.model.prefill_min_tokens;
            let end = end_at(if on_device { dev_width } else { cpu_width });
            batch.clear();
            for (i, &t) in tokens[start..end].iter().enumerate() {
                let at = start + i;
                let want = match outputs {
                    Outputs::Last | Outputs::LastWide => at + 1 == tokens.len(),
                    Outputs::All => true,
                    Outputs::None => false,
                };
                batch.push(t, (pos0 + at) as i32, want);
            }
            // The width rule: pieces at least `prefill_min_tokens` wide run on the device, a
            // narrower tail and every decode token on the CPU. A device graph and a CPU graph
            // therefore never share a shape, so llama.cpp's graph reuse (which skips
            // re-scheduling) never runs a graph scheduled for one side with weights on the other.
            if on_device {
                self.run_on_device(&batch, exec)?;
            } else {
                let pad = self.tail_padding(end - start, pos0 + end, outputs);
                let last = tokens[end - 1];
                for i in 0..pad {
                    batch.push(last, (pos0 + end + i) as i32, false);
                }
                self.run_batch(&batch, exec)?;
                if pad > 0 {
                    self.drop_padding(pos0 + end)?;
                }
            }
            on_piece(self, start, end)?;
            start = end;
        }
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Rows of padding after a CPU piece of `rows` rows ending at position `end_pos`: enough to
    /// reach `FA_TILE` rows when the piece has from `PAD_FROM` to `FA_TILE` - 1 rows.
    /// Below `FA_TILE` query rows ggml's CPU flash attention takes its one-row kernel, whose
    /// cost per row grows with the cache: at 2,400 cells on the small preset a 62-row tail cost
    /// 2.5x a 68-row one. The padding rows (copies of the piece's last token) sit after the
    /// piece's last position, so the causal mask hides them from its rows, and their cells are
    /// dropped at once. A fresh prefill and a reuse pad the same tail the same way (it depends
    /// on the tail alone), so prefix reuse stays bit for bit. Not where a cell cannot be
    /// dropped (a sliding window, a recurrent state), nor with a prefill device (whose graphs
    /// must not share a CPU graph's shape), nor past the context, nor in stock llama.cpp.
    pub(crate) fn tail_padding(&self, rows: usize, end_pos: usize, outputs: Outputs) -> usize {
        let pad = FA_TILE.saturating_sub(rows);
        let fits = end_pos + pad <= self.n_ctx && (self.widths.grid as usize) >= FA_TILE;
        let plain =
            !self.snapshots && !self.recurrent && self.model.arena.is_none() && !self.model.stock;
        if outputs == Outputs::All || rows < PAD_FROM || pad == 0 || !fits || !plain {
            return 0;
        }
        pad
    }

    /// Drops the padding's cells (every cell of sequence 0 from `end_pos` on).
    fn drop_padding(&mut self, end_pos: usize) -> Result<()> {
        if self.ctx.seq_rm(0, end_pos as i32, -1) {
            Ok(())
        } else {
            let _ = self.forget();
            Err(crate::error::EngineError::PaddingKept(end_pos))
        }
    }
}

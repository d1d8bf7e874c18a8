//! Prefill: the prompt goes in ubatch-wide pieces; the width rule lives here.
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
    /// Every token (perplexity).
    All,
    /// No row (the prompt's head, when its last piece runs with the choices; decide.rs).
    None,
}

impl Session<'_> {
    /// The width of a prompt's leading pieces: the device's when one runs wide pieces, else the
    /// CPU's (pieces start at multiples of it from position 0).
    pub(crate) fn piece_width(&self) -> usize {
        if self.model.arena.is_some() {
            self.widths.device as usize
        } else {
            self.widths.cpu as usize
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
            Outputs::Last | Outputs::None => w.max(1) as usize,
            Outputs::All => w.min(self.widths.outputs).max(1) as usize,
        };
        let cpu_width = cap(self.widths.cpu);
        let dev_width = if self.model.arena.is_some() {
            cap(self.widths.device)
        } else {
            cpu_width
        };
        let t0 = Instant::now();
        let mut batch = Batch::new(cpu_width.max(dev_width));
        let mut start = 0;
        while start < tokens.len() {
            let left = tokens.len() - start;
            let on_device = left.min(dev_width) >= self.model.prefill_min_tokens;
            let width = if on_device { dev_width } else { cpu_width };
            let end = (start + width).min(tokens.len());
            batch.clear();
            for (i, &t) in tokens[start..end].iter().enumerate() {
                let at = start + i;
                let want = match outputs {
                    Outputs::Last => at + 1 == tokens.len(),
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
                self.run_batch(&batch, exec)?;
            }
            on_piece(self, start, end)?;
            start = end;
        }
        Ok(t0.elapsed().as_secs_f64())
    }
}

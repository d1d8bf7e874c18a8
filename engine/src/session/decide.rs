//! `decide`: one prefill (reusing what the cache holds of the prompt), no decode; each choice
//! scored by its first token, or by every token of it with the choices as parallel sequences
//! that share the prompt's KV cells. In the whole-choice modes the choices' rows run in the same
//! batch as the prompt's last piece where they can (one graph, not two: on the CPU a graph of
//! fewer than 64 rows also takes llama.cpp's per-row flash-attention path, which made each choice
//! row cost several prompt rows once the cache is long).
use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::ffi::batch::Batch;
use crate::ffi::vocab::Vocab;
use crate::options::{DecideRequest, PrefixReuse, Scoring};
use crate::telemetry::{DecideRecord, Timing};
use crate::weights::ExecGuard;

use super::prefill::Outputs;
use super::{Session, SEQS};

/// Log-softmax of `logits` in f64 (max-shifted, so it never overflows).
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    logits.iter().map(|&l| l as f64 - lse).collect()
}

/// One choice as it will be scored.
struct Choice {
    /// Prompt + choice tokenized together (whole-choice modes), or just the first token.
    whole: Vec<i32>,
    /// Tokens of `whole` it shares with the prompt's tokens.
    shared: usize,
    /// The continuation: `whole[ctx_len..]` (lm-evaluation-harness's split).
    n_cont: usize,
}

/// One batch row of a choice sequence: (seq, pos, token, target), target = the (choice, token)
/// this row's logits score.
type Row = (i32, usize, i32, Option<(usize, i32)>);

/// What a row of the prompt's last piece run with the choices asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    Nothing,
    /// The prompt's last token: its logits are the prompt's.
    Prompt,
    /// Scores (choice, token).
    Choice(usize, i32),
}

/// Splits `n` rows, of which `wants(r)` ask for logits, into consecutive pieces of at most `width`
/// rows and `outputs` logit rows each; returns the piece ends.
fn piece_ends(n: usize, width: usize, outputs: usize, wants: impl Fn(usize) -> bool) -> Vec<usize> {
    let (width, outputs) = (width.max(1), outputs.max(1));
    let mut ends = Vec::new();
    let (mut start, mut outs) = (0, 0);
    for r in 0..n {
        let o = usize::from(wants(r));
        if r - start == width || outs + o > outputs {
            ends.push(r);
            (start, outs) = (r, 0);
        }
        outs += o;
    }
    if n > start {
        ends.push(n);
    }
    ends
}

/// The choices that need rows of their own: (choice, first position to decode). A choice whose
/// whole text is one token that follows the prompt's own tokens needs nothing more.
fn continuation_work(choices: &[Choice], ctx_len: usize) -> Vec<(usize, usize)> {
    choices
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let start = c.shared.min(ctx_len);
            (start < c.whole.len() - 1).then_some((i, start))
        })
        .collect()
}

/// The (choice, token) that the logits of choice `c`'s row at position `p` score: none before
/// the prompt's end, nor for the first continuation token of a choice that shares the whole
/// prompt (the prompt's own logits score it).
fn row_target(c: &Choice, i: usize, p: usize, ctx_len: usize) -> Option<(usize, i32)> {
    let target = (p + 1 >= ctx_len).then(|| (i, c.whole[p + 1]));
    target.filter(|_| !(c.shared == ctx_len && p + 1 == ctx_len))
}

/// Index of the highest score and the margin to the second (infinite with one choice).
fn best_and_margin(scores: &[f64]) -> (usize, f64) {
    let mut best = 0;
    for (i, &v) in scores.iter().enumerate() {
        if v > scores[best] {
            best = i;
        }
    }
    let second = scores
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .map(|(_, &v)| v)
        .fold(f64::NEG_INFINITY, f64::max);
    (best, scores[best] - second)
}

/// Choice `index`'s tokens as `scoring` sees them: in `first_token` mode the choice tokenized
/// alone (its first token is scored); in the whole-choice modes the prompt `text` (`ctx_len`
/// tokens) and the choice tokenized together, as lm-evaluation-harness does, so that a choice that
/// merges with the prompt's last token is scored on the tokens the model would really see.
/// `EmptyChoice` when the choice adds no token of its own.
pub(crate) fn tokenize_choice(
    vocab: Vocab<'_>,
    scoring: Scoring,
    text: &str,
    ctx_len: usize,
    index: usize,
    choice: &str,
) -> Result<Vec<i32>> {
    let empty = || EngineError::EmptyChoice {
        index,
        choice: choice.to_string(),
    };
    if scoring == Scoring::FirstToken {
        let toks = vocab
            .tokenize(choice, false, false)
            .map_err(EngineError::Tokenize)?;
        if toks.is_empty() {
            return Err(empty());
        }
        return Ok(toks);
    }
    let whole = vocab
        .tokenize(&format!("{text}{choice}"), true, true)
        .map_err(EngineError::Tokenize)?;
    if whole.len() <= ctx_len {
        return Err(empty());
    }
    Ok(whole)
}

/// Each continuation row's (choice, log-probability), in the order the scoring adds them.
type ContinuationRows = Vec<(usize, f64)>;

/// A decision's prompt in its forms: the user message, the rendered text, its tokens.
struct Prompt<'a> {
    user: &'a str,
    text: &'a str,
    prefix: &'a str,
    tokens: &'a [i32],
}

impl Session<'_> {
    /// Scores `req.choices` after `prefix + suffix` (rendered as one user message unless `raw`).
    /// Empty choices, colliding first tokens in `first_token` mode and a prompt (or prompt +
    /// choice) longer than the context are refused before any prefill.
    pub fn decide(&mut self, req: &DecideRequest) -> Result<DecideRecord> {
        if req.choices.is_empty() {
            return Err(EngineError::NoChoices);
        }
        let (user, text, tokens) = self.render_prompt(req)?;
        let choices = self.plan_choices(req, &text, &tokens)?;
        let work = if req.scoring == Scoring::FirstToken {
            Vec::new()
        } else {
            continuation_work(&choices, tokens.len())
        };
        // The (choice, log-probability) of each continuation row, in row order, when the rows
        // ran with the prompt's last piece.
        let mut with_prompt: Option<Vec<(usize, f64)>> = None;
        let (mut exec, before) = self.begin();
        let reuse = self.reuse_prefix(&tokens)?;
        let reuse = self.restore_from_disk(&tokens, reuse)?;
        let mut prefill_s = 0.0;
        if reuse.kept < tokens.len() {
            let prompt = Prompt {
                user: &user,
                text: &text,
                prefix: &req.prefix,
                tokens: &tokens,
            };
            let (s, w) = self.prefill_prompt(&prompt, reuse.kept, &choices, &work, &mut exec)?;
            prefill_s = s;
            with_prompt = w;
        }
        let last = log_softmax(&self.last_logits);
        let ctx_len = tokens.len();
        let mut scores: Vec<f64> = choices
            .iter()
            .map(|c| {
                if c.shared == ctx_len {
                    last[c.whole[ctx_len] as usize]
                } else {
                    0.0
                }
            })
            .collect();
        match with_prompt {
            // Added in the order the separate batches add them, so both paths sum alike.
            Some(lps) => {
                for (i, lp) in lps {
                    scores[i] += lp;
                }
            }
            None if !work.is_empty() => {
                self.score_continuations(&choices, &work, ctx_len, &mut scores, &mut exec)?
            }
            None => {}
        }
        let ntok: Vec<u32> = choices.iter().map(|c| c.n_cont as u32).collect();
        self.normalize(req, &ntok, &mut scores, &mut exec)?;
        let (stream_c, dev_c) = before.since(self.model);
        let (best, margin) = best_and_margin(&scores);
        Ok(DecideRecord {
            best,
            choice_logp: scores,
            choice_tokens: choices.iter().map(|c| c.whole[ctx_len]).collect(),
            choice_ntok: ntok,
            margin,
            n_reused: reuse.kept as u32,
            n_prefilled: (ctx_len - reuse.kept) as u32,
            reuse: reuse.outcome,
            reuse_reason: reuse.reason.to_string(),
            n_tokens: ctx_len as u32,
            timing: Timing {
                n_prompt: (ctx_len - reuse.kept) as u32,
                prefill_s,
                ..Timing::default()
            },
            stream: stream_c,
            prefill_dev: dev_c,
        })
    }

    /// The decision's prompt: `prefix + suffix` as one user message (raw with `raw`), tokenized
    /// and checked to fit the context.
    fn render_prompt(&self, req: &DecideRequest) -> Result<(String, String, Vec<i32>)> {
        let user = format!("{}{}", req.prefix, req.suffix);
        if user.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let text = if req.raw {
            user.clone()
        } else {
            self.model.render_user_message(&user)?
        };
        let tokens = self.model.tokenize(&text, true)?;
        if tokens.len() > self.n_ctx {
            return Err(EngineError::PromptTooLong {
                n_prompt: tokens.len(),
                n_ctx: self.n_ctx,
                extra: String::new(),
            });
        }
        Ok((user, text, tokens))
    }

    /// Prefills the prompt after the `kept` tokens prefix reuse kept (saving a snapshot at the
    /// rendered prefix's end where the memory cannot drop a tail); returns the seconds and, when
    /// the continuations ran with the prompt's last piece, their (choice, log-probability) rows.
    fn prefill_prompt(
        &mut self,
        p: &Prompt<'_>,
        kept: usize,
        choices: &[Choice],
        work: &[(usize, usize)],
        exec: &mut ExecGuard<'_>,
    ) -> Result<(f64, Option<ContinuationRows>)> {
        let tokens = p.tokens;
        let mut prefill_s = 0.0;
        let mut with_prompt = None;
        // Until the prefill succeeds the cache's content is not known.
        self.kv.clear();
        let mut from = kept;
        // A memory that cannot drop a tail: the prefill stops where the rendered prefix
        // ends and saves the state there, for the next decisions that repeat it.
        if self.snapshots && self.prefix_reuse != PrefixReuse::Off {
            let b = self.snapshot_boundary(p.text, p.user, p.prefix, tokens);
            let fresh = self.saved.as_ref().is_none_or(|s| s.tokens != tokens[..b]);
            if b > 0 && b >= from && fresh {
                if b > from {
                    prefill_s += self.prefill(
                        &tokens[from..b],
                        from,
                        Outputs::Last,
                        exec,
                        |_, _, _| Ok(()),
                    )?;
                }
                self.kv = tokens[..b].to_vec();
                self.save_snapshot();
                self.kv.clear();
                from = b;
            }
        }
        // Prefix state on disk: the prefill stops at the rendered prefix's end (on the grid, so
        // the pieces stay a fresh prefill's) and saves the state there for other processes.
        if self.disk.is_some() {
            let b = self.snapshot_boundary(p.text, p.user, p.prefix, tokens);
            if let Some(b) = self.disk_boundary(b, from, tokens) {
                prefill_s += self.prefill(
                    &tokens[from..b],
                    from,
                    Outputs::Last,
                    exec,
                    |_, _, _| Ok(()),
                )?;
                self.kv = tokens[..b].to_vec();
                self.save_to_disk();
                self.kv.clear();
                from = b;
            }
        }
        if self.can_run_with_prompt(work) {
            let t0 = Instant::now();
            let r = self.prefill_with_choices(tokens, from, choices, work, exec);
            prefill_s += t0.elapsed().as_secs_f64();
            with_prompt = Some(r?);
        } else {
            prefill_s +=
                self.prefill(&tokens[from..], from, Outputs::Last, exec, |_, _, _| Ok(()))?;
            self.last_logits = self
                .ctx
                .logits(-1)
                .ok_or_else(|| EngineError::NoLogits("after prefill".into()))?
                .to_vec();
        }
        self.kv = tokens.to_vec();
        Ok((prefill_s, with_prompt))
    }

    /// Tokenizes the choices for `req.scoring`; refuses what cannot be scored.
    fn plan_choices(&self, req: &DecideRequest, text: &str, tokens: &[i32]) -> Result<Vec<Choice>> {
        let vocab = self.model.raw.vocab();
        let ctx_len = tokens.len();
        let mut out: Vec<Choice> = Vec::with_capacity(req.choices.len());
        for (i, c) in req.choices.iter().enumerate() {
            let toks = tokenize_choice(vocab, req.scoring, text, ctx_len, i, c)?;
            let choice = if req.scoring == Scoring::FirstToken {
                let first = toks[0];
                if let Some(j) = out.iter().position(|o| o.whole[ctx_len] == first) {
                    return Err(EngineError::CollidingChoices {
                        first: j,
                        first_text: req.choices[j].clone(),
                        second: i,
                        second_text: c.clone(),
                        token: first,
                    });
                }
                let mut whole = tokens.to_vec();
                whole.push(first);
                Choice {
                    whole,
                    shared: ctx_len,
                    n_cont: 1,
                }
            } else {
                let whole = toks;
                if whole.len() > self.n_ctx {
                    return Err(EngineError::PromptTooLong {
                        n_prompt: whole.len(),
                        n_ctx: self.n_ctx,
                        extra: format!(" with choice {i}"),
                    });
                }
                let shared = whole.iter().zip(tokens).take_while(|(a, b)| a == b).count();
                Choice {
                    n_cont: whole.len() - ctx_len,
                    whole,
                    shared,
                }
            };
            out.push(choice);
        }
        Ok(out)
    }

    /// Turns the summed log-likelihoods into the scoring's scores: per token (`mean`), per
    /// character (`norm`), or less the choice's log-likelihood after the neutral context
    /// (`calibrated`).
    fn normalize(
        &mut self,
        req: &DecideRequest,
        ntok: &[u32],
        scores: &mut [f64],
        exec: &mut ExecGuard<'_>,
    ) -> Result<()> {
        match req.scoring {
            Scoring::Mean => {
                for (s, n) in scores.iter_mut().zip(ntok) {
                    *s /= f64::from((*n).max(1));
                }
            }
            Scoring::Norm => {
                for (s, c) in scores.iter_mut().zip(&req.choices) {
                    *s /= c.chars().count().max(1) as f64;
                }
            }
            Scoring::Calibrated => {
                let neutral = self.neutral_scores(req, exec)?;
                for (s, u) in scores.iter_mut().zip(neutral) {
                    *s -= u;
                }
            }
            Scoring::FirstToken | Scoring::Sum => {}
        }
        Ok(())
    }

    /// Each choice's log-likelihood after the neutral context alone (lm-evaluation-harness's
    /// unconditional request `("", choice)`: the prefix token, then the choice tokenized without
    /// special tokens), all choices as parallel sequences beside the prompt's, as `sum` runs them.
    fn neutral_scores(
        &mut self,
        req: &DecideRequest,
        exec: &mut ExecGuard<'_>,
    ) -> Result<Vec<f64>> {
        let vocab = self.model.raw.vocab();
        let head = vocab.prefix_token().ok_or(EngineError::NoNeutralContext)?;
        let mut neutral = Vec::with_capacity(req.choices.len());
        for (index, c) in req.choices.iter().enumerate() {
            let toks = vocab
                .tokenize(c, false, false)
                .map_err(EngineError::Tokenize)?;
            if toks.is_empty() {
                return Err(EngineError::EmptyChoice {
                    index,
                    choice: c.clone(),
                });
            }
            let mut whole = vec![head];
            whole.extend(toks);
            neutral.push(Choice {
                n_cont: whole.len() - 1,
                whole,
                shared: 0,
            });
        }
        let work: Vec<(usize, usize)> = (0..neutral.len()).map(|i| (i, 0)).collect();
        let mut scores = vec![0.0; neutral.len()];
        self.score_continuations(&neutral, &work, 1, &mut scores, exec)?;
        Ok(scores)
    }

    /// The choice sequences one batch can hold beside the prompt's (sequence 0).
    fn choice_group(&self) -> usize {
        (self.ctx.n_seq_max().min(SEQS) as usize)
            .saturating_sub(1)
            .max(1)
    }

    /// Whether `work` can run with the prompt's last piece (`prefill_with_choices`): there is
    /// work, every choice gets a sequence of its own at once, no prefill device runs wide pieces
    /// (whose width rule the prompt's pieces follow; the separate CPU batches keep it), and the
    /// memory is a plain KV cache (not one that needs snapshots: a sliding window, a recurrent
    /// state, where tokens shared by several sequences are not tried).
    fn can_run_with_prompt(&self, work: &[(usize, usize)]) -> bool {
        !work.is_empty()
            && work.len() <= self.choice_group()
            && self.model.arena.is_none()
            && !self.snapshots
    }

    /// Prefills `tokens[from..]` with the choices' continuation rows after the prompt's last
    /// piece, in the same graphs: the prompt's head in the pieces `prefill` would run, then its
    /// last piece (its tokens also given to the sequences of the choices that share them) and the
    /// choices' rows (sequences 1..), split into pieces of the same width. The prompt's cells and
    /// pieces are those of a plain prefill; the choice rows no longer pay a graph of their own,
    /// nor llama.cpp's per-row flash-attention path that a batch under 64 rows takes on the CPU.
    /// Sets `last_logits`; returns each continuation row's (choice, log-probability), in the
    /// order `score_continuations` adds them.
    fn prefill_with_choices(
        &mut self,
        tokens: &[i32],
        from: usize,
        choices: &[Choice],
        work: &[(usize, usize)],
        exec: &mut ExecGuard<'_>,
    ) -> Result<Vec<(usize, f64)>> {
        let n = tokens.len();
        let width = self.widths.grid.max(1) as usize;
        // Where `prefill(&tokens[from..])` would start its last piece (pieces cut at multiples
        // of the width from position 0).
        let last = ((n - 1) / width * width).max(from);
        if last > from {
            self.prefill(&tokens[from..last], from, Outputs::None, exec, |_, _, _| {
                Ok(())
            })?;
        }
        let result = self.run_last_piece_with_choices(tokens, last, choices, work, exec);
        // Whatever happened, the choice sequences leave nothing behind; after an error the cache
        // no longer matches `kv` (the caller cleared it), the first error is the one reported.
        for k in 0..work.len() {
            self.ctx.seq_rm(k as i32 + 1, -1, -1);
        }
        if result.is_err() {
            let _ = self.forget();
        }
        result
    }

    fn run_last_piece_with_choices(
        &mut self,
        tokens: &[i32],
        last: usize,
        choices: &[Choice],
        work: &[(usize, usize)],
        exec: &mut ExecGuard<'_>,
    ) -> Result<Vec<(usize, f64)>> {
        let n = tokens.len();
        // Each choice's sequence holds the prompt's cells before its first decoded position: the
        // cells already in the cache are copied, those of the last piece are written for it.
        for (k, &(_, start)) in work.iter().enumerate() {
            let seq = k as i32 + 1;
            self.ctx.seq_rm(seq, -1, -1);
            self.ctx.seq_cp(0, seq, 0, start.min(last) as i32)?;
        }
        let mut rows: Vec<(Vec<i32>, usize, i32, Out)> = Vec::new();
        for (p, &tok) in tokens.iter().enumerate().skip(last) {
            let mut seqs = vec![0];
            seqs.extend(
                work.iter()
                    .enumerate()
                    .filter(|&(_, &(_, start))| p < start)
                    .map(|(k, _)| k as i32 + 1),
            );
            let out = if p + 1 == n {
                Out::Prompt
            } else {
                Out::Nothing
            };
            rows.push((seqs, p, tok, out));
        }
        for (k, &(i, start)) in work.iter().enumerate() {
            let c = &choices[i];
            for p in start..c.whole.len() - 1 {
                let out = match row_target(c, i, p, n) {
                    Some((i, tok)) => Out::Choice(i, tok),
                    None => Out::Nothing,
                };
                rows.push((vec![k as i32 + 1], p, c.whole[p], out));
            }
        }
        let width = self.widths.grid.max(1) as usize;
        let ends = piece_ends(rows.len(), width, self.widths.outputs as usize, |r| {
            rows[r].3 != Out::Nothing
        });
        let mut batch = Batch::with_seq_slots(width, work.len() + 1);
        let mut lps = Vec::new();
        let mut at = 0;
        for end in ends {
            let piece = &rows[at..end];
            at = end;
            batch.clear();
            for (seqs, pos, tok, out) in piece {
                batch.push_seqs(*tok, *pos as i32, seqs, *out != Out::Nothing);
            }
            self.run_batch(&batch, exec)?;
            for (r, (_, _, _, out)) in piece.iter().enumerate() {
                let l = || {
                    self.ctx
                        .logits(r as i32)
                        .ok_or_else(|| EngineError::NoLogits(format!("for row {r}")))
                };
                match *out {
                    Out::Nothing => {}
                    Out::Prompt => self.last_logits = l()?.to_vec(),
                    Out::Choice(i, tok) => lps.push((i, log_softmax(l()?)[tok as usize])),
                }
            }
        }
        Ok(lps)
    }

    /// Adds to `scores` the log-probabilities of every continuation token the prompt's last
    /// logits did not already give, running the choices as sequences 1.. that share the prompt's
    /// cells (sequence 0), a group of them per batch.
    fn score_continuations(
        &mut self,
        choices: &[Choice],
        work: &[(usize, usize)],
        ctx_len: usize,
        scores: &mut [f64],
        exec: &mut ExecGuard<'_>,
    ) -> Result<()> {
        // CPU pieces; with a prefill device they stay narrower than any device piece, so a CPU
        // graph never takes the shape of a device graph (the width rule).
        let mut width = self.widths.cpu as usize;
        if self.model.arena.is_some() {
            width = width
                .min(self.model.prefill_min_tokens.saturating_sub(1))
                .max(1);
        }
        let group = self.choice_group();
        let mut batch = Batch::new(width);
        let result = (|| {
            for chunk in work.chunks(group) {
                let mut rows: Vec<Row> = Vec::new();
                for (k, &(i, start)) in chunk.iter().enumerate() {
                    let seq = k as i32 + 1;
                    let c = &choices[i];
                    // A recurrent state cannot be copied up to a position: a choice that parts
                    // from the prompt before its end (it merged with the prompt's last token)
                    // runs from the first token in a sequence of its own.
                    let start = if self.recurrent && start < ctx_len {
                        0
                    } else {
                        start
                    };
                    self.ctx.seq_rm(seq, -1, -1);
                    if start > 0 {
                        self.ctx.seq_cp(0, seq, 0, start as i32)?;
                    }
                    for p in start..c.whole.len() - 1 {
                        rows.push((seq, p, c.whole[p], row_target(c, i, p, ctx_len)));
                    }
                }
                let ends = piece_ends(rows.len(), width, self.widths.outputs as usize, |r| {
                    rows[r].3.is_some()
                });
                let mut at = 0;
                for end in ends {
                    let piece = &rows[at..end];
                    at = end;
                    batch.clear();
                    for &(seq, pos, tok, target) in piece {
                        batch.push_seq(tok, pos as i32, seq, target.is_some());
                    }
                    self.run_batch(&batch, exec)?;
                    for (r, &(_, _, _, target)) in piece.iter().enumerate() {
                        if let Some((i, tok)) = target {
                            let l = self
                                .ctx
                                .logits(r as i32)
                                .ok_or_else(|| EngineError::NoLogits(format!("for choice {i}")))?;
                            scores[i] += log_softmax(l)[tok as usize];
                        }
                    }
                }
                for k in 0..chunk.len() {
                    self.ctx.seq_rm(k as i32 + 1, -1, -1);
                }
            }
            Ok(())
        })();
        if result.is_err() {
            // Whatever the choice sequences left behind, the cache no longer matches `kv`; the
            // first error is the one reported.
            let _ = self.forget();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::{best_and_margin, piece_ends};

    #[test]
    fn best_and_margin_of_scores() {
        assert_eq!(best_and_margin(&[-1.0, -0.5, -3.0]), (1, 0.5));
        assert_eq!(best_and_margin(&[-2.0]).1, f64::INFINITY);
    }

    #[test]
    fn pieces_respect_width_and_output_cap() {
        assert_eq!(piece_ends(0, 4, 4, |_| true), Vec::<usize>::new());
        assert_eq!(piece_ends(10, 4, 4, |_| false), vec![4, 8, 10]);
        assert_eq!(piece_ends(10, 4, 2, |_| true), vec![2, 4, 6, 8, 10]);
        // Rows 0..5 without logits (a prompt piece), then every row an output.
        assert_eq!(piece_ends(9, 8, 3, |r| r >= 5), vec![8, 9]);
    }
}

//! Choices checked against the model's tokenizer before anything runs: a choice that adds no
//! token to its prompt (under the job's scoring) cannot be scored, so `bmoe check` and `bmoe run`
//! refuse it at its line, before a row is written; choices whose first tokens collide under
//! `first_token` scoring, which a run refuses item by item, `bmoe check` reports at their line.
//! The vocabulary is loaded alone (no weights).
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bmoe_engine::{EngineError, Scoring, Tokenizer};

use crate::config::diag::{ConfigErrors, Diagnostic};
use crate::config::item::{Decision, Kind, Payload};
use crate::config::job::LoadedJob;

/// The job's scoring, as the job file spells it.
fn scoring_name(s: Scoring) -> &'static str {
    match s {
        Scoring::FirstToken => "first_token",
        Scoring::Sum => "sum",
        Scoring::Mean => "mean",
        Scoring::Norm => "norm",
        Scoring::Calibrated => "calibrated",
    }
}

/// What is wrong with choice `index`, and what was expected instead.
fn message(index: usize, choice: &str, scoring: Scoring) -> String {
    let how = if scoring == Scoring::FirstToken {
        "tokenizes to nothing".to_string()
    } else {
        format!(
            "adds no token to the prompt under {} scoring (tokenized with the prompt, it merges into the prompt's last tokens)",
            scoring_name(scoring)
        )
    };
    format!(
        "choice {index} ({choice:?}) {how}: expected a choice with at least one token of its own"
    )
}

/// What fixes colliding first tokens; `bmoe decide` and a run's refused rows say the same (the
/// engine's message ends with it).
const COLLISION_HINT: &str = "use scoring = \"sum\" (or --scoring sum)";

/// Every decide job's choices, tokenized with its model's vocabulary: choices that add no token,
/// and with `collisions` (`bmoe check`) choices whose first tokens collide under `first_token`
/// scoring, which a run refuses item by item (an error row each). Models in `skip` (already
/// refused: unreadable, or their probe failed) and models whose vocabulary does not load are left
/// to the run, which reports them as it always has.
pub fn check(
    jobs: &[LoadedJob],
    skip: &dyn Fn(&Path) -> bool,
    collisions: bool,
) -> Result<(), ConfigErrors> {
    let mut tokenizers: HashMap<PathBuf, Option<Tokenizer>> = HashMap::new();
    let mut diags = Vec::new();
    for lj in jobs {
        if lj.job.kind != Kind::Decide || skip(&lj.model) {
            continue;
        }
        let tok = tokenizers
            .entry(lj.model.clone())
            .or_insert_with(|| Tokenizer::load(&lj.model).ok());
        let Some(tok) = tok else {
            continue;
        };
        for it in &lj.items {
            if let Payload::Decide(d) = &it.payload {
                diags.extend(decision_diags(lj, tok, d, collisions));
            }
        }
    }
    if diags.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(diags))
    }
}

/// The refusals of one decision, each at its choice (the JSONL line, or the inline item).
fn decision_diags(
    lj: &LoadedJob,
    tok: &Tokenizer,
    d: &Decision,
    collisions: bool,
) -> Vec<Diagnostic> {
    let at = |index: usize, msg: String| match &lj.items_file {
        Some(f) => Diagnostic::line(f, d.pos, 1, &format!("choices[{index}]"), msg),
        None => lj
            .src
            .diag(&format!("/decisions/{}/choices/{index}", d.pos), false, msg),
    };
    let mut out = Vec::new();
    // A prompt that cannot be rendered or tokenized is the run's to report, per row.
    if let Ok(empty) = tok.empty_choices(&d.req) {
        for e in empty {
            if let EngineError::EmptyChoice { index, choice } = e {
                out.push(at(index, message(index, &choice, d.req.scoring)));
            }
        }
    }
    if !collisions {
        return out;
    }
    if let Ok(colliding) = tok.colliding_choices(&d.req) {
        for e in colliding {
            if let EngineError::CollidingChoices {
                first,
                first_text,
                second,
                second_text,
                token,
            } = e
            {
                let msg = format!(
                    "choices {first} ({first_text:?}) and {second} ({second_text:?}) start with the same token {token}: first-token scoring cannot tell them apart"
                );
                out.push(at(second, msg).with_help(Some(COLLISION_HINT.into())));
            }
        }
    }
    out
}

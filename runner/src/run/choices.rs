//! Choices checked against the model's tokenizer before anything runs: a choice that adds no
//! token to its prompt (under the job's scoring) cannot be scored, so `bmoe check` and `bmoe run`
//! refuse it at its line, before a row is written. The vocabulary is loaded alone (no weights).
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bmoe_engine::{EngineError, Scoring, Tokenizer};

use crate::config::diag::{display_path, ConfigErrors, Diagnostic};
use crate::config::job::{Kind, LoadedJob, Payload};

/// The job's scoring, as the job file spells it.
fn scoring_name(s: Scoring) -> &'static str {
    match s {
        Scoring::FirstToken => "first_token",
        Scoring::Sum => "sum",
        Scoring::Mean => "mean",
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

/// Every decide job's choices, tokenized with its model's vocabulary. Models in `skip` (already
/// refused: unreadable, or their probe failed) and models whose vocabulary does not load are left
/// to the run, which reports them as it always has.
pub fn check(jobs: &[LoadedJob], skip: &dyn Fn(&Path) -> bool) -> Result<(), ConfigErrors> {
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
            let Payload::Decide(d) = &it.payload else {
                continue;
            };
            // A prompt that cannot be rendered or tokenized is the run's to report, per row.
            let Ok(empty) = tok.empty_choices(&d.req) else {
                continue;
            };
            for e in empty {
                let EngineError::EmptyChoice { index, choice } = e else {
                    continue;
                };
                let msg = message(index, &choice, d.req.scoring);
                diags.push(match &lj.items_file {
                    Some(f) => Diagnostic {
                        source: display_path(f),
                        pos: Some((d.pos, 1)),
                        field: format!("choices[{index}]"),
                        message: msg,
                        snippet: None,
                    },
                    None => {
                        lj.src
                            .diag(&format!("/decisions/{}/choices/{index}", d.pos), false, msg)
                    }
                });
            }
        }
    }
    if diags.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(diags))
    }
}

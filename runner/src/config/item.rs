//! A job's items (inline or one JSONL line each): what a decision or a prompt says, and the
//! item the runner runs from it. The job file (`job.rs`) and the JSONL reader (`jsonl.rs`) both
//! build on this file.
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What each item of a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Generate text after each prompt.
    Generate,
    /// Score each decision's choices after one prefill.
    Decide,
    /// Teacher-forced perplexity of each text.
    Perplexity,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Generate => "generate",
            Kind::Decide => "decide",
            Kind::Perplexity => "perplexity",
        })
    }
}

/// An item id: a string or a non-negative integer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ItemId {
    /// A number.
    Int(#[schemars(range(min = 0))] u64),
    /// A name.
    Str(#[schemars(regex(pattern = r"^[^\x00-\x1f]{1,200}$"))] String),
}

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ItemId::Int(n) => write!(f, "{n}"),
            ItemId::Str(s) => f.write_str(s),
        }
    }
}

/// How a decide job scores its choices (the engine's `Scoring`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// Each choice's first-token log-probability (choices must differ in their first token).
    #[default]
    FirstToken,
    /// The sum of the log-probabilities of every token of the choice.
    Sum,
    /// The sum divided by the choice's token count.
    Mean,
    /// The sum divided by the choice's length in characters (lm-eval's `acc_norm`).
    Norm,
    /// The sum minus the choice's log-likelihood after the BOS token alone (lm-eval's
    /// `acc_mutual_info`).
    Calibrated,
}

impl Scoring {
    /// The engine's value.
    pub fn engine(self) -> bmoe_engine::Scoring {
        match self {
            Scoring::FirstToken => bmoe_engine::Scoring::FirstToken,
            Scoring::Sum => bmoe_engine::Scoring::Sum,
            Scoring::Mean => bmoe_engine::Scoring::Mean,
            Scoring::Norm => bmoe_engine::Scoring::Norm,
            Scoring::Calibrated => bmoe_engine::Scoring::Calibrated,
        }
    }
}

impl fmt::Display for Scoring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scoring::FirstToken => "first_token",
            Scoring::Sum => "sum",
            Scoring::Mean => "mean",
            Scoring::Norm => "norm",
            Scoring::Calibrated => "calibrated",
        })
    }
}

/// A decision's expected answer: one of its choices, by text or by 0-based index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Expected {
    /// The choice's index, from 0.
    Index(#[schemars(range(min = 0))] u64),
    /// The choice's text, exactly.
    Text(String),
}

impl Expected {
    /// The index of the choice this names, or why it names none.
    pub fn resolve(&self, choices: &[String]) -> Result<usize, String> {
        match self {
            Expected::Index(i) => usize::try_from(*i)
                .ok()
                .filter(|&i| i < choices.len())
                .ok_or_else(|| {
                    format!(
                        "index {i} names no choice: give 0 to {} ({} choices)",
                        choices.len().saturating_sub(1),
                        choices.len()
                    )
                }),
            Expected::Text(t) => choices.iter().position(|c| c == t).ok_or_else(|| {
                format!("{t:?} is not one of the choices {choices:?}: give a choice's exact text or its 0-based index")
            }),
        }
    }
}

/// `--expected` of `bmoe decide`: a choice's exact text first, else a 0-based index.
pub fn resolve_expected_text(s: &str, choices: &[String]) -> Result<usize, String> {
    if let Some(i) = choices.iter().position(|c| c == s) {
        return Ok(i);
    }
    match s.trim().parse::<u64>() {
        Ok(i) => Expected::Index(i).resolve(choices),
        Err(_) => Expected::Text(s.to_string()).resolve(choices),
    }
}

/// One recorded decision: `prefix + suffix` as one user message, scored over `choices`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionSpec {
    /// Id used to match rows across runs (default: the position, from 0).
    #[serde(default)]
    pub id: Option<ItemId>,
    /// The part that repeats across calls (instructions, history).
    pub prefix: String,
    /// The part that changes (the current screen).
    #[serde(default)]
    pub suffix: String,
    /// The options, scored as the job's `scoring` says.
    #[schemars(length(min = 1, max = 256), inner(length(min = 1)))]
    pub choices: Vec<String>,
    /// The right answer: a choice's exact text or its 0-based index; rows then say `correct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<Expected>,
    /// Free data kept with the decision (trace id, step, ...), written to the `meta` column as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
}

/// One prompt (generate) or text (perplexity) with an explicit id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptSpec {
    /// Id used to match rows across runs (default: the position, from 0).
    #[serde(default)]
    pub id: Option<ItemId>,
    /// The prompt or text.
    #[schemars(length(min = 1))]
    pub text: String,
}

/// A prompt: plain text, or a table with an id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PromptItem {
    /// Just the text; the id is its position.
    Text(#[schemars(length(min = 1))] String),
    /// Text with an id.
    Full(PromptSpec),
}

/// A decision to run and what the runner keeps beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What the engine gets.
    pub req: bmoe_engine::DecideRequest,
    /// The expected choice's index, resolved against the choices.
    pub expected: Option<usize>,
    /// The decision's `meta`, as JSON text (empty without one).
    pub meta: String,
    /// Where it was written: its 1-based line in a JSONL file, its 0-based index inline.
    pub pos: usize,
}

/// What one item asks the engine for.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// A decision.
    Decide(Decision),
    /// A prompt or a perplexity text.
    Text(String),
}

/// One row's worth of work.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Its id, as written to the CSV.
    pub id: String,
    /// What to run.
    pub payload: Payload,
    /// The group it is sharded by (the job's `shard_by`); `None`: its id.
    pub shard_key: Option<String>,
}

impl Item {
    /// What `--shard` hashes: the item's group, else its id.
    pub fn shard_key(&self) -> &str {
        self.shard_key.as_deref().unwrap_or(&self.id)
    }
}

/// A decision as an item; `Err` says why its `expected` names no choice.
pub fn decision_item(i: usize, d: &DecisionSpec) -> Result<Item, String> {
    let expected = d
        .expected
        .as_ref()
        .map(|e| e.resolve(&d.choices))
        .transpose()?;
    Ok(Item {
        id: d
            .id
            .as_ref()
            .map(|x| x.to_string())
            .unwrap_or_else(|| i.to_string()),
        payload: Payload::Decide(Decision {
            req: bmoe_engine::DecideRequest {
                prefix: d.prefix.clone(),
                suffix: d.suffix.clone(),
                choices: d.choices.clone(),
                ..Default::default()
            },
            expected,
            meta: d
                .meta
                .as_ref()
                .map(|m| serde_json::Value::Object(m.clone()).to_string())
                .unwrap_or_default(),
            pos: i,
        }),
        shard_key: None,
    })
}

/// A prompt as an item.
pub fn prompt_item(i: usize, p: &PromptSpec) -> Item {
    Item {
        id: p
            .id
            .as_ref()
            .map(|x| x.to_string())
            .unwrap_or_else(|| i.to_string()),
        payload: Payload::Text(p.text.clone()),
        shard_key: None,
    }
}

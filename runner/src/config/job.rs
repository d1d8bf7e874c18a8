//! A job file (`jobs/*.toml`): a model, a kind, its items (inline or JSONL), sampling, overrides,
//! sweeps and where the CSV goes; checked against the schema, then semantically.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::diag::{ConfigErrors, Diagnostic};
use super::load::{load, SourceFile};
use super::paths::relative_to;
use super::settings::{Overrides, Sweep};

use super::item::{
    decision_item, prompt_item, DecisionSpec, Item, Kind, Payload, PromptItem, Scoring,
};
/// Token selection for `generate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SamplingSpec {
    /// 0 = greedy (argmax, deterministic); above 0 = seeded sampling at this temperature.
    #[serde(default)]
    #[schemars(range(min = bmoe_engine::settings::TEMPERATURE.min, max = bmoe_engine::settings::TEMPERATURE.max))]
    pub temperature: f32,
    /// Top-k for seeded sampling (0 = off).
    #[serde(default = "default_top_k")]
    #[schemars(range(min = bmoe_engine::settings::TOP_K.min, max = bmoe_engine::settings::TOP_K.max))]
    pub top_k: i32,
    /// Top-p for seeded sampling (1 = off).
    #[serde(default = "default_top_p")]
    #[schemars(range(max = 1.0), extend("exclusiveMinimum" = 0))]
    pub top_p: f32,
    /// RNG seed for seeded sampling.
    #[serde(default)]
    pub seed: u32,
}

fn default_top_k() -> i32 {
    bmoe_engine::settings::TOP_K.default_u32() as i32
}
fn default_top_p() -> f32 {
    bmoe_engine::settings::TOP_P.default as f32
}

impl Default for SamplingSpec {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: default_top_k(),
            top_p: default_top_p(),
            seed: 0,
        }
    }
}

/// A job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Short name, written to the CSV's `job` column.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"), length(max = 64))]
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// The GGUF to run (relative to this file's folder).
    #[schemars(length(min = 1))]
    pub model: String,
    /// generate, decide or perplexity.
    pub kind: Kind,
    /// Default device profile (relative to this file's folder); `--profile` replaces it.
    #[serde(default)]
    pub profile: Option<String>,
    /// The CSV rows are appended to (relative to this file's folder).
    #[schemars(regex(pattern = r"\.csv$"))]
    pub csv: String,
    /// Tokens to generate at most per prompt (generate).
    #[serde(default = "default_n_predict")]
    #[schemars(range(min = bmoe_engine::settings::N_PREDICT.min, max = bmoe_engine::settings::N_PREDICT.max))]
    pub n_predict: u32,
    /// Render prompts (generate) or decisions (decide) with the model's chat template; false feeds
    /// them as is.
    #[serde(default = "default_true")]
    pub chat: bool,
    /// How choices are scored (decide): first_token, sum, mean, norm or calibrated.
    #[serde(default)]
    pub scoring: Scoring,
    /// Token selection (generate).
    #[serde(default)]
    pub sampling: SamplingSpec,
    /// Inline decisions (decide).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub decisions: Option<Vec<DecisionSpec>>,
    /// A JSONL file of decisions, one object per line (decide).
    #[serde(default)]
    pub decisions_file: Option<String>,
    /// The key of each decision's `meta` whose value names the group (an episode, a trace) the
    /// decisions are sharded by: a group runs whole in one shard, in file order (decide; default:
    /// each item by its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub shard_by: Option<String>,
    /// Inline prompts (generate) or texts (perplexity).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub prompts: Option<Vec<PromptItem>>,
    /// A JSONL file of `{"id": .., "text": ..}` objects (generate, perplexity).
    #[serde(default)]
    pub prompts_file: Option<String>,
    /// Profile values this job overrides.
    #[serde(default)]
    pub overrides: Overrides,
    /// Profile values to sweep over.
    #[serde(default)]
    pub sweep: Sweep,
    /// Item runs at the start of each (profile, point), before the measured rows, to warm the
    /// expert cache and the prefix; their results are not written.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100000))]
    pub warmup: u32,
    /// Times each item runs per point; rows carry the `repeat` index (from 0).
    #[serde(default = "default_repeat")]
    #[schemars(range(min = 1, max = 1000))]
    pub repeat: u32,
}

fn default_n_predict() -> u32 {
    bmoe_engine::settings::N_PREDICT.default_u32()
}
fn default_repeat() -> u32 {
    1
}
fn default_true() -> bool {
    true
}

/// A job after every check: resolved paths and the items to run.
#[derive(Debug)]
pub struct LoadedJob {
    /// The job as written.
    pub job: Job,
    /// Its source, for positioned errors later (placement).
    pub src: SourceFile,
    /// The model path, resolved.
    pub model: PathBuf,
    /// The CSV path, resolved.
    pub csv: PathBuf,
    /// The job's default profile, resolved.
    pub profile: Option<PathBuf>,
    /// The items, in order.
    pub items: Vec<Item>,
    /// The JSONL file the items came from, resolved; `None` for inline items.
    pub items_file: Option<PathBuf>,
}

/// `schemas/job.schema.json`.
pub fn job_schema() -> serde_json::Value {
    super::json_schema::generate::<Job>("job.schema.json")
}

/// Reads, validates and semantically checks a job file, loading its JSONL items.
pub fn load_job(path: &Path) -> Result<LoadedJob, ConfigErrors> {
    let (job, src): (Job, SourceFile) = load(path, "job", &job_schema())?;
    let mut errs: Vec<Diagnostic> = Vec::new();
    let (model, csv, profile) = job_paths(path, &job, &src, &mut errs);
    let keys = ItemKeys::of(job.kind);
    for k in keys.other {
        if src.doc.value.get(k).is_some() {
            errs.push(src.diag(
                &format!("/{k}"),
                true,
                format!(
                    "a {} job takes `{}` or `{}`, not `{k}`",
                    job.kind, keys.inline, keys.file
                ),
            ));
        }
    }
    let (mut items, items_file) = job_items(path, &job, &src, &keys, &mut errs);
    // The job's scoring and chat apply to every decision, inline or from JSONL.
    for it in &mut items {
        if let Payload::Decide(d) = &mut it.payload {
            d.req.scoring = job.scoring.engine();
            d.req.raw = !job.chat;
        }
    }
    if let Some(key) = &job.shard_by {
        shard_groups(
            key,
            &job,
            &src,
            items_file.as_deref(),
            &mut items,
            &mut errs,
        );
    }
    // A JSONL file's duplicates are reported at their lines as it is read.
    if src.doc.value.get(keys.inline).is_some() {
        check_unique_ids(&src, &items, keys.inline, &mut errs);
    }
    if !errs.is_empty() {
        return Err(ConfigErrors(errs));
    }
    Ok(LoadedJob {
        job,
        src,
        model,
        csv,
        profile,
        items,
        items_file,
    })
}

/// The job's model, CSV and profile paths, resolved against the job file, each checked.
fn job_paths(
    path: &Path,
    job: &Job,
    src: &SourceFile,
    errs: &mut Vec<Diagnostic>,
) -> (PathBuf, PathBuf, Option<PathBuf>) {
    let model = relative_to(path, &job.model);
    if let Err(e) = bmoe_engine::gguf::check_gguf_file(&model) {
        errs.push(src.diag("/model", false, format!("{e}")));
    }
    let csv = relative_to(path, &job.csv);
    if csv.is_dir() {
        errs.push(src.diag(
            "/csv",
            false,
            format!("{} is a directory, expected a CSV file path", csv.display()),
        ));
    }
    let profile = job.profile.as_ref().map(|p| relative_to(path, p));
    if let Some(p) = &profile {
        if !p.is_file() {
            errs.push(src.diag(
                "/profile",
                false,
                format!("profile file {} does not exist", p.display()),
            ));
        }
    }
    (model, csv, profile)
}

/// The keys a job of one kind takes its items from, and the other kind's keys it must not have.
struct ItemKeys {
    inline: &'static str,
    file: &'static str,
    other: [&'static str; 2],
}

impl ItemKeys {
    /// The keys of a job of `kind`.
    fn of(kind: Kind) -> Self {
        match kind {
            Kind::Decide => ItemKeys {
                inline: "decisions",
                file: "decisions_file",
                other: ["prompts", "prompts_file"],
            },
            _ => ItemKeys {
                inline: "prompts",
                file: "prompts_file",
                other: ["decisions", "decisions_file"],
            },
        }
    }
}

/// The job's items, inline or from its JSONL file (resolved, returned beside them); exactly one
/// of the two must be given.
fn job_items(
    path: &Path,
    job: &Job,
    src: &SourceFile,
    keys: &ItemKeys,
    errs: &mut Vec<Diagnostic>,
) -> (Vec<Item>, Option<PathBuf>) {
    let (inline_key, file_key) = (keys.inline, keys.file);
    let has_inline = src.doc.value.get(inline_key).is_some();
    let has_file = src.doc.value.get(file_key).is_some();
    match (has_inline, has_file) {
        (true, true) => errs.push(src.diag(
            &format!("/{file_key}"),
            true,
            format!("give `{inline_key}` or `{file_key}`, not both"),
        )),
        (false, false) => errs.push(src.diag(
            "",
            false,
            format!(
                "a {} job needs its items: `{inline_key}` inline or `{file_key}` (JSONL)",
                job.kind
            ),
        )),
        (true, false) => match inline_items(job) {
            Ok(v) => return (v, None),
            Err(bad) => errs.extend(
                bad.into_iter()
                    .map(|(i, msg)| src.diag(&format!("/decisions/{i}/expected"), false, msg)),
            ),
        },
        (false, true) => {
            let rel = if job.kind == Kind::Decide {
                job.decisions_file.as_deref()
            } else {
                job.prompts_file.as_deref()
            }
            .unwrap_or_default();
            let f = relative_to(path, rel);
            match super::jsonl::read_items(&f, job.kind) {
                Ok(v) => {
                    errs.extend(v.errors);
                    return (v.items, Some(f));
                }
                Err(Some(mut e)) => errs.append(&mut e.0),
                Err(None) => errs.push(src.diag(
                    &format!("/{file_key}"),
                    false,
                    format!("file {} does not exist", f.display()),
                )),
            }
        }
    }
    (Vec::new(), None)
}

/// Gives each decision its group, the value of `key` in its `meta` (a string, or a number as
/// written); a decision without one, or a job that is not a decide job, is an error at `shard_by`
/// naming the decision.
fn shard_groups(
    key: &str,
    job: &Job,
    src: &SourceFile,
    file: Option<&Path>,
    items: &mut [Item],
    errs: &mut Vec<Diagnostic>,
) {
    let at = |msg: String| src.diag("/shard_by", true, msg);
    if job.kind != Kind::Decide {
        errs.push(at(format!(
            "shard_by applies to decide jobs (a decision's meta names its group); this is a {} job",
            job.kind
        )));
        return;
    }
    for it in items.iter_mut() {
        let Payload::Decide(d) = &it.payload else {
            continue;
        };
        let meta: Option<serde_json::Value> = serde_json::from_str(&d.meta).ok();
        let group = match meta.as_ref().and_then(|m| m.get(key)) {
            Some(serde_json::Value::String(v)) if !v.is_empty() => Some(v.clone()),
            Some(v @ serde_json::Value::Number(_)) => Some(v.to_string()),
            _ => None,
        };
        match group {
            Some(g) => it.shard_key = Some(g),
            None => {
                let place = match file {
                    Some(f) => format!("line {} of {}", d.pos, f.display()),
                    None => format!("decisions[{}]", d.pos),
                };
                errs.push(at(format!(
                    "shard_by = {key:?}: decision {:?} ({place}) has no {key:?} in its meta; expected a non-empty string or a number, e.g. \"meta\": {{\"{key}\": \"episode-1\"}}",
                    it.id
                )));
            }
        }
    }
}

/// Rows are matched across runs by id, so the ids of inline items must be unique within a job.
fn check_unique_ids(
    src: &SourceFile,
    items: &[Item],
    inline_key: &str,
    errs: &mut Vec<Diagnostic>,
) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, it) in items.iter().enumerate() {
        if let Some(j) = seen.insert(it.id.as_str(), i) {
            errs.push(src.diag(
                &format!("/{inline_key}/{i}"),
                false,
                format!(
                    "item {i} has id {:?}, the same as item {j}: ids must be unique",
                    it.id
                ),
            ));
        }
    }
}

/// The inline items of a job, ids defaulting to positions; `Err` lists the decisions whose
/// `expected` names no choice (index, message).
fn inline_items(job: &Job) -> Result<Vec<Item>, Vec<(usize, String)>> {
    if let Some(ds) = &job.decisions {
        let mut items = Vec::new();
        let mut bad = Vec::new();
        for (i, d) in ds.iter().enumerate() {
            match decision_item(i, d) {
                Ok(it) => items.push(it),
                Err(msg) => bad.push((i, msg)),
            }
        }
        return if bad.is_empty() { Ok(items) } else { Err(bad) };
    }
    Ok(job
        .prompts
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| match p {
            PromptItem::Text(t) => Item {
                id: i.to_string(),
                payload: Payload::Text(t.clone()),
                shard_key: None,
            },
            PromptItem::Full(p) => prompt_item(i, p),
        })
        .collect())
}

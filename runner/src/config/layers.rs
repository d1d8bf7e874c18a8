//! Layering with figment: defaults < profile < job `[overrides]` < `--overrides FILE` < sweep
//! point < `BMOE_*` environment < `--set key=value` < a one-shot command's own flags; each
//! resolved value remembers which layer gave it.
use std::path::Path;

use figment::providers::{Env, Serialized};
use figment::value::{Dict, Map};
use figment::{Figment, Metadata, Profile as FigProfile, Provider};
use serde_json::Value;

use super::diag::{ConfigErrors, Diagnostic};
use super::paths::display_path;
use super::profile::Profile;
use super::settings::{Settings, KEYS};
use super::validate;

/// A key, its value as text, and the layer that gave it.
pub type Origin = (String, String, String);

/// The resolved values and where each came from.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The values.
    pub settings: Settings,
    /// For each key of [`KEYS`], in order: (key, value as text, origin).
    pub origins: Vec<Origin>,
}

impl Resolved {
    /// Where `key` came from.
    pub fn origin(&self, key: &str) -> &str {
        self.origins
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, _, o)| o.as_str())
            .unwrap_or("default")
    }
}

/// A named layer: figment reports its name as the origin of its values.
struct Layer {
    name: String,
    values: serde_json::Map<String, Value>,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name.clone())
    }
    fn data(&self) -> Result<Map<FigProfile, Dict>, figment::Error> {
        Serialized::defaults(&self.values).data()
    }
}

/// Everything that feeds the layers besides the files.
#[derive(Debug, Clone, Default)]
pub struct LayerInputs {
    /// `--set key=value` pairs, in order (the last wins).
    pub sets: Vec<(String, String)>,
    /// `--overrides FILE` (e.g. written by `bmoe report --best --write-overrides`): the layer's
    /// name as plan shows it, and its values.
    pub overlay: Option<(String, serde_json::Map<String, Value>)>,
    /// A one-shot command's setting flags (`bmoe generate --context 2048`), over everything.
    pub flags: serde_json::Map<String, Value>,
}

/// Parses one `--set` argument.
pub fn parse_set(arg: &str) -> Result<(String, String), Diagnostic> {
    match arg.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(Diagnostic::other(
            "--set",
            "",
            format!("expected key=value, found {arg:?}"),
        )),
    }
}

/// `--set key=a,b,c` pairs: a sweep from the command line, one point per value, as a job's
/// `[sweep]` would (at the `--set` layer, above everything but a one-shot command's flags).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SetSweep(pub Vec<(String, Vec<String>)>);

impl SetSweep {
    /// Takes the comma lists out of `sets` (a quoted JSON string stays one value); the rest
    /// stay plain `--set` values. `Err` names a list with an empty value.
    pub fn split(sets: &mut Vec<(String, String)>) -> Result<Self, Vec<Diagnostic>> {
        let mut sweep = Vec::new();
        let mut errs = Vec::new();
        sets.retain(|(k, v)| {
            if !v.contains(',') || v.starts_with('"') {
                return true;
            }
            let vals: Vec<String> = v.split(',').map(|x| x.trim().to_string()).collect();
            if vals.iter().any(String::is_empty) {
                errs.push(Diagnostic::other(
                    format!("--set {k}={v}"),
                    k,
                    format!(
                        "expected a comma list of values (a sweep), found an empty value in {v:?}"
                    ),
                ));
            } else if let Some(i) = sweep
                .iter()
                .position(|(sk, _): &(String, Vec<String>)| sk == k)
            {
                sweep[i].1 = vals;
            } else {
                sweep.push((k.clone(), vals));
            }
            false
        });
        if errs.is_empty() {
            Ok(SetSweep(sweep))
        } else {
            Err(errs)
        }
    }

    /// The points of the cartesian product, each a list of (key, value as written) in command-line
    /// order; one empty point when nothing is swept.
    pub fn points(&self) -> Vec<Vec<(String, String)>> {
        let mut points: Vec<Vec<(String, String)>> = vec![Vec::new()];
        for (k, vals) in &self.0 {
            points = points
                .iter()
                .flat_map(|p| {
                    vals.iter().map(move |v| {
                        let mut q = p.clone();
                        q.push((k.clone(), v.clone()));
                        q
                    })
                })
                .collect();
        }
        points
    }
}

/// `BMOE_*` variables that are not settings (read elsewhere: the probe's self-test, the memory
/// limit's cgroup folder).
const OTHER_VARS: &[&str] = &["BMOE_PROBE_SELFTEST", "BMOE_CGROUP_ROOT"];

/// The `BMOE_*` variables of `vars` that name no layered key (a typo is otherwise silently
/// ignored), each as a warning: the nearest key's variable when one is close, else the list.
pub fn unknown_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
    let env_name = |k: &str| format!("BMOE_{}", k.to_ascii_uppercase());
    let mut out = Vec::new();
    for (name, _) in vars {
        let Some(key) = name.strip_prefix("BMOE_") else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        if KEYS.contains(&key.as_str()) || OTHER_VARS.contains(&name.as_str()) {
            continue;
        }
        out.push(match super::suggest::closest(&key, KEYS.iter().copied()) {
            Some(k) => format!(
                "environment {name} names no setting: did you mean {}?",
                env_name(k)
            ),
            None => {
                format!(
                "environment {name} names no setting, so it is ignored\nhelp: the settings are {}",
                KEYS.iter().map(|k| env_name(k)).collect::<Vec<_>>().join(", ")
            )
            }
        });
    }
    out
}

/// A `--set` value as JSON: numbers, booleans and quoted strings as such, anything else as text.
pub fn set_value(v: &str) -> Value {
    serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
}

/// A profile's `[engine]` and `[prefill]` values as one layer, named for the file.
pub fn profile_layer(
    profile: &Profile,
    profile_path: &Path,
) -> (String, serde_json::Map<String, Value>) {
    let mut values = serde_json::Map::new();
    for table in [
        serde_json::to_value(&profile.engine),
        serde_json::to_value(&profile.prefill),
    ]
    .into_iter()
    .flatten()
    {
        if let Value::Object(m) = table {
            values.extend(m);
        }
    }
    (format!("profile {}", display_path(profile_path)), values)
}

/// Resolves the layered values for one (job, profile, sweep point).
pub fn resolve(
    profile: &Profile,
    profile_path: &Path,
    job_path: &Path,
    overrides: &serde_json::Map<String, Value>,
    point: &[(String, Value)],
    inputs: &LayerInputs,
) -> Result<Resolved, ConfigErrors> {
    let mut layers = vec![
        profile_layer(profile, profile_path),
        (
            format!("job {} [overrides]", display_path(job_path)),
            overrides.clone(),
        ),
    ];
    if let Some(o) = &inputs.overlay {
        layers.push(o.clone());
    }
    layers.push((
        format!("job {} [sweep]", display_path(job_path)),
        point.iter().cloned().collect(),
    ));
    resolve_layers(layers, inputs)
}

/// Resolves defaults < `layers` (in order) < `BMOE_*` < `--set` < `inputs.flags`.
pub fn resolve_layers(
    layers: Vec<(String, serde_json::Map<String, Value>)>,
    inputs: &LayerInputs,
) -> Result<Resolved, ConfigErrors> {
    let mut errs = Vec::new();
    let sets = set_values(inputs, &mut errs);
    let figment = stack(layers, sets, inputs);
    let (resolved, origins) = values_and_origins(&figment);
    check_values(&resolved, &origins, &mut errs);
    if !errs.is_empty() {
        return Err(ConfigErrors(errs));
    }
    let settings: Settings = serde_json::from_value(Value::Object(resolved))
        .map_err(|e| ConfigErrors(vec![Diagnostic::other("configuration", "", e.to_string())]))?;
    let out = Resolved { settings, origins };
    check_cross(&out)?;
    Ok(out)
}

/// The `--set` values as a layer; an unknown key is an error with a suggestion.
fn set_values(inputs: &LayerInputs, errs: &mut Vec<Diagnostic>) -> serde_json::Map<String, Value> {
    let mut sets = serde_json::Map::new();
    for (k, v) in &inputs.sets {
        if KEYS.contains(&k.as_str()) {
            sets.insert(k.clone(), set_value(v));
        } else {
            let (message, help) = super::suggest::unknown("key", k, KEYS.iter().copied());
            errs.push(Diagnostic::other(format!("--set {k}={v}"), k, message).with_help(help));
        }
    }
    sets
}

/// The layers stacked, lowest first: defaults, `layers`, `BMOE_*`, `--set`, the flags.
fn stack(
    layers: Vec<(String, serde_json::Map<String, Value>)>,
    sets: serde_json::Map<String, Value>,
    inputs: &LayerInputs,
) -> Figment {
    let defaults = match serde_json::to_value(Settings::default()) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let mut figment = Figment::from(Layer {
        name: "default".into(),
        values: defaults,
    });
    for (name, values) in layers {
        figment = figment.merge(Layer { name, values });
    }
    figment
        .merge(Env::prefixed("BMOE_").only(KEYS))
        .merge(Layer {
            name: "--set".into(),
            values: sets,
        })
        .merge(Layer {
            name: "command-line flags".into(),
            values: inputs.flags.clone(),
        })
}

/// Each key's value and the name of the layer that gave it.
fn values_and_origins(figment: &Figment) -> (serde_json::Map<String, Value>, Vec<Origin>) {
    let mut resolved = serde_json::Map::new();
    let mut origins = Vec::new();
    for key in KEYS {
        let (value, origin) = match figment.find_value(key) {
            Ok(v) => {
                let origin = match figment.get_metadata(v.tag()) {
                    Some(m) if m.name.contains("environment") => {
                        format!("environment BMOE_{}", key.to_ascii_uppercase())
                    }
                    Some(m) => m.name.to_string(),
                    None => "default".to_string(),
                };
                (v.deserialize::<Value>().unwrap_or(Value::Null), origin)
            }
            Err(_) => (Value::Null, "default".to_string()),
        };
        let text = match &value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        origins.push((key.to_string(), text, origin));
        resolved.insert(key.to_string(), value);
    }
    (resolved, origins)
}

/// Checks every value once more against the settings' schema.
fn check_values(
    resolved: &serde_json::Map<String, Value>,
    origins: &[Origin],
    errs: &mut Vec<Diagnostic>,
) {
    // Environment and --set values bypassed the file schemas: check every value once more and
    // blame the layer that gave it.
    let schema = super::settings::settings_schema();
    for v in validate::validate(&schema, &Value::Object(resolved.clone())) {
        let key = v
            .field
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_string();
        let origin = origins
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, _, o)| o.clone())
            .unwrap_or_default();
        errs.push(Diagnostic::other(origin, &v.field, v.message));
    }
}

/// Rules between keys.
fn check_cross(r: &Resolved) -> Result<(), ConfigErrors> {
    let s = &r.settings;
    if s.device_name().is_some() && s.device_ubatch < s.min_tokens {
        return Err(Diagnostic::other(
            r.origin("device_ubatch").to_string(),
            "device_ubatch",
            format!(
                "expected at least min_tokens ({}, from {}), found {}: no piece could ever run on the device",
                s.min_tokens,
                r.origin("min_tokens"),
                s.device_ubatch
            ),
        )
        .into());
    }
    if s.device_name().is_some() && s.context != 0 && s.context < s.min_tokens {
        return Err(Diagnostic::other(
            r.origin("context").to_string(),
            "context",
            format!(
                "expected at least min_tokens ({}, from {}), found {}: no piece could ever run on the device; set context >= {} or min_tokens <= {}",
                s.min_tokens,
                r.origin("min_tokens"),
                s.context,
                s.min_tokens,
                s.context
            ),
        )
        .into());
    }
    Ok(())
}

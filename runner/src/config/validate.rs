//! JSON Schema validation of a configuration value, turned into positioned diagnostics that say
//! what was expected (read off the schema itself) and what was found.
use jsonschema::error::ValidationErrorKind;
use serde_json::Value;

/// One schema violation, positioned by JSON pointer.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// JSON pointer of the offending value (or of the unknown key).
    pub pointer: String,
    /// True when the key, not the value, is the problem (unknown key).
    pub at_key: bool,
    /// Dotted field path for humans (`overrides.cache_mb`, `decisions[2].id`).
    pub field: String,
    /// "expected ..., found ..." or similar.
    pub message: String,
    /// What would fix it (the valid keys, when no key is near an unknown one).
    pub help: Option<String>,
}

/// Validates `instance` against `schema`; all violations, in document order of their pointers.
pub fn validate(schema: &Value, instance: &Value) -> Vec<Violation> {
    let validator = match jsonschema::validator_for(schema) {
        Ok(v) => v,
        // The schemas are generated from our own types; a broken one is a bug, not user input.
        Err(e) => {
            return vec![Violation {
                pointer: String::new(),
                at_key: false,
                field: String::new(),
                message: format!("internal error: invalid schema: {e}"),
                help: None,
            }]
        }
    };
    let mut out = Vec::new();
    for err in validator.iter_errors(instance) {
        let ptr = err.instance_path().as_str().to_string();
        let sub = lookup(schema, err.schema_path().as_str());
        match err.kind() {
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                let known: Vec<&str> = sub
                    .and_then(|s| s.get("properties"))
                    .and_then(|p| p.as_object())
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                for k in unexpected {
                    let p = format!("{ptr}/{}", super::spanned::escape_segment(k));
                    let (message, help) = super::suggest::unknown("key", k, known.iter().copied());
                    out.push(Violation {
                        field: field_path(&p),
                        pointer: p,
                        at_key: true,
                        message,
                        help,
                    });
                }
            }
            ValidationErrorKind::Required { property } => {
                let name = property.as_str().unwrap_or_default();
                let p = format!("{ptr}/{}", super::spanned::escape_segment(name));
                let what = sub
                    .and_then(|s| s.get("properties"))
                    .and_then(|p| p.get(name))
                    .map(|s| describe(schema, s))
                    .unwrap_or_else(|| "a value".into());
                out.push(Violation {
                    field: field_path(&p),
                    pointer: ptr.clone(),
                    at_key: false,
                    message: format!("missing required key `{name}`: expected {what}"),
                    help: None,
                });
            }
            _ => {
                // The subschema the failing keyword belongs to says what was expected as a whole.
                let expected = sub
                    .map(|s| describe(schema, s))
                    .unwrap_or_else(|| err.to_string());
                out.push(Violation {
                    field: field_path(&ptr),
                    pointer: ptr.clone(),
                    at_key: false,
                    message: format!("expected {expected}, found {}", found(err.instance())),
                    help: None,
                });
            }
        }
    }
    // One value can break several keywords of the same subschema (type and minimum); say it once.
    out.dedup_by(|a, b| a.pointer == b.pointer && a.message == b.message);
    out
}

/// The value as the user wrote it, shortened.
fn found(v: &Value) -> String {
    let s = match v {
        Value::Object(_) => "a table".to_string(),
        Value::Array(a) if a.len() > 4 => format!("an array of {} items", a.len()),
        _ => v.to_string(),
    };
    if s.chars().count() > 60 {
        format!("{}...", s.chars().take(57).collect::<String>())
    } else {
        s
    }
}

/// `/decisions/2/choices` -> `decisions[2].choices`.
pub fn field_path(pointer: &str) -> String {
    let mut out = String::new();
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if seg.chars().all(|c| c.is_ascii_digit()) && !seg.is_empty() && !out.is_empty() {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&seg);
        }
    }
    out
}

/// The subschema holding the keyword at `keyword_path` (a JSON pointer into `root` ending at the
/// keyword), following `$ref`s met on the way.
fn lookup<'a>(root: &'a Value, keyword_path: &str) -> Option<&'a Value> {
    let segs: Vec<String> = keyword_path
        .split('/')
        .skip(1)
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    let parent = &segs[..segs.len().saturating_sub(1)];
    let mut cur = root;
    for s in parent {
        if s == "$ref" {
            cur = resolve_ref(root, cur)?;
            continue;
        }
        cur = match cur {
            Value::Object(m) => match m.get(s) {
                Some(v) => v,
                None => resolve_ref(root, cur)?.get(s)?,
            },
            Value::Array(a) => a.get(s.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn resolve_ref<'a>(root: &'a Value, node: &'a Value) -> Option<&'a Value> {
    let r = node.get("$ref")?.as_str()?;
    root.pointer(r.strip_prefix('#')?)
}

/// What a subschema accepts, in words: "an integer between 1 and 8", "one of \"a\", \"b\"".
pub fn describe(root: &Value, s: &Value) -> String {
    if let Some(d) = s.get("x-expected").and_then(|v| v.as_str()) {
        return d.to_string();
    }
    if s.get("$ref").is_some() {
        if let Some(t) = resolve_ref(root, s) {
            return describe(root, t);
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = s.get(key).and_then(|v| v.as_array()) {
            // An enum written as documented constants reads best as a list.
            if alts.len() > 1 && alts.iter().all(|a| a.get("const").is_some()) {
                let opts: Vec<String> = alts
                    .iter()
                    .filter_map(|a| a.get("const"))
                    .map(|c| c.to_string())
                    .collect();
                return format!("one of {}", opts.join(", "));
            }
            let parts: Vec<String> = alts.iter().map(|a| describe(root, a)).collect();
            return parts.join(" or ");
        }
    }
    if let Some(c) = s.get("const") {
        return c.to_string();
    }
    if let Some(e) = s.get("enum").and_then(|v| v.as_array()) {
        let opts: Vec<String> = e.iter().map(|v| v.to_string()).collect();
        return if opts.len() == 1 {
            opts[0].clone()
        } else {
            format!("one of {}", opts.join(", "))
        };
    }
    let ty = match s.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => {
            let parts: Vec<String> = ts
                .iter()
                .filter_map(|t| t.as_str())
                .map(|t| describe(root, &serde_json::json!({ "type": t })))
                .collect();
            return parts.join(" or ");
        }
        _ => return "a value matching the schema".into(),
    };
    match ty {
        "integer" | "number" => describe_number(s, ty),
        "string" => describe_string(s),
        "boolean" => "true or false".into(),
        "array" => describe_array(root, s),
        "object" => "a table".into(),
        other => other.to_string(),
    }
}

/// An integer or number subschema in words, with its bounds.
fn describe_number(s: &Value, ty: &str) -> String {
    let noun = if ty == "integer" {
        "an integer"
    } else {
        "a number"
    };
    let min = s.get("minimum").and_then(Value::as_f64);
    let xmin = s.get("exclusiveMinimum").and_then(Value::as_f64);
    let max = s.get("maximum").and_then(Value::as_f64);
    let xmax = s.get("exclusiveMaximum").and_then(Value::as_f64);
    let n = |x: f64| {
        if x.fract() == 0.0 && x.abs() < 1e15 {
            format!("{}", x as i64)
        } else {
            format!("{x}")
        }
    };
    match (min, xmin, max, xmax) {
        (Some(a), None, Some(b), None) => format!("{noun} between {} and {}", n(a), n(b)),
        (None, Some(a), Some(b), None) => format!("{noun} in ({}, {}]", n(a), n(b)),
        (Some(a), None, None, None) if a == 0.0 && ty == "integer" => {
            "a non-negative integer".into()
        }
        (Some(a), None, None, None) => format!("{noun} >= {}", n(a)),
        (None, Some(a), None, None) => format!("{noun} > {}", n(a)),
        (None, None, Some(b), None) => format!("{noun} <= {}", n(b)),
        _ => noun.into(),
    }
}

/// A string subschema in words: its pattern, or whether it may be empty.
fn describe_string(s: &Value) -> String {
    if let Some(p) = s.get("pattern").and_then(|v| v.as_str()) {
        format!("a string matching {p}")
    } else if s.get("minLength").and_then(Value::as_u64).unwrap_or(0) > 0 {
        "a non-empty string".into()
    } else {
        "a string".into()
    }
}

/// An array subschema in words, naming what its items are.
fn describe_array(root: &Value, s: &Value) -> String {
    match s.get("items") {
        Some(items) => {
            let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let what = describe(root, items);
            if min > 0 {
                format!("a non-empty array of {}", plural(&what))
            } else {
                format!("an array of {}", plural(&what))
            }
        }
        None => "an array".into(),
    }
}

/// "an integer" -> "integers" for array descriptions; other phrases are wrapped as "(...) items".
fn plural(what: &str) -> String {
    for (one, many) in [
        ("a string", "strings"),
        ("a non-empty string", "non-empty strings"),
        ("an integer", "integers"),
        ("a number", "numbers"),
        ("a table", "tables"),
    ] {
        if what == one {
            return many.into();
        }
    }
    format!("items each {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "threads": {"type": "integer", "minimum": 1, "maximum": 64},
                "cache_mb": {"$ref": "#/$defs/CacheMb"},
            },
            "$defs": {"CacheMb": {"anyOf": [{"type": "integer", "minimum": 0}, {"const": "auto"}]}}
        })
    }

    #[test]
    fn reports_every_problem_with_expectations() {
        let v = validate(
            &schema(),
            &json!({"threads": 99, "cache_mb": "lots", "zzz": 1}),
        );
        let msgs: Vec<String> = v
            .iter()
            .map(|v| format!("{}: {}", v.field, v.message))
            .collect();
        assert!(
            msgs.contains(&"threads: expected an integer between 1 and 64, found 99".into()),
            "{msgs:?}"
        );
        assert!(
            msgs.contains(
                &"cache_mb: expected a non-negative integer or \"auto\", found \"lots\"".into()
            ),
            "{msgs:?}"
        );
        assert!(msgs.contains(&"zzz: unknown key `zzz`".into()), "{msgs:?}");
        let zzz = v.iter().find(|v| v.field == "zzz").unwrap();
        assert_eq!(
            zzz.help.as_deref(),
            Some("expected one of name, threads, cache_mb")
        );
        assert!(
            msgs.iter()
                .any(|m| m.starts_with("name: missing required key `name`")),
            "{msgs:?}"
        );
    }

    #[test]
    fn field_paths() {
        assert_eq!(field_path("/decisions/2/choices"), "decisions[2].choices");
        assert_eq!(field_path(""), "");
    }
}

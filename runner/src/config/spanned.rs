//! TOML text -> a JSON value plus where each value and key sits in the text, so schema errors (which
//! speak JSON pointers) can be reported at a line and column.
use std::collections::HashMap;
use std::ops::Range;

use serde_json::{Map, Number, Value};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// A parsed TOML document and the byte spans of its values and keys, by JSON pointer.
#[derive(Debug, Default)]
pub struct SpannedDoc {
    /// The document as JSON (datetimes become strings).
    pub value: Value,
    /// JSON pointer -> span of the value.
    pub values: HashMap<String, Range<usize>>,
    /// JSON pointer -> span of the key naming it.
    pub keys: HashMap<String, Range<usize>>,
}

impl SpannedDoc {
    /// The best byte offset for a pointer: its key for "key" problems, else its value, else the
    /// nearest ancestor that has a place.
    pub fn offset(&self, pointer: &str, prefer_key: bool) -> Option<usize> {
        let mut p = pointer.to_string();
        loop {
            let hit = if prefer_key {
                self.keys.get(&p).or_else(|| self.values.get(&p))
            } else {
                self.values.get(&p).or_else(|| self.keys.get(&p))
            };
            if let Some(r) = hit {
                return Some(r.start);
            }
            match p.rfind('/') {
                Some(i) => p.truncate(i),
                None => return None,
            }
        }
    }
}

/// A TOML syntax error: message and byte offset.
#[derive(Debug)]
pub struct SyntaxError {
    /// What the parser said.
    pub message: String,
    /// Where, when known.
    pub offset: Option<usize>,
}

/// Parses `text`; every syntax error the parser can recover past is returned together.
pub fn parse(text: &str) -> Result<SpannedDoc, Vec<SyntaxError>> {
    let (table, errors) = DeTable::parse_recoverable(text);
    if !errors.is_empty() {
        return Err(errors
            .into_iter()
            .map(|e| SyntaxError {
                message: e.message().trim().to_string(),
                offset: e.span().map(|s| s.start),
            })
            .collect());
    }
    let mut doc = SpannedDoc::default();
    doc.values.insert(String::new(), 0..0);
    doc.value = table_to_json(table.get_ref(), "", &mut doc);
    Ok(doc)
}

/// Escapes one JSON-pointer segment (RFC 6901).
pub fn escape_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

fn table_to_json(t: &DeTable<'_>, ptr: &str, doc: &mut SpannedDoc) -> Value {
    let mut m = Map::new();
    for (k, v) in t.iter() {
        let key: &str = k.get_ref();
        let p = format!("{ptr}/{}", escape_segment(key));
        doc.keys.insert(p.clone(), k.span());
        let jv = value_to_json(v, &p, doc);
        m.insert(key.to_string(), jv);
    }
    Value::Object(m)
}

fn value_to_json(v: &Spanned<DeValue<'_>>, ptr: &str, doc: &mut SpannedDoc) -> Value {
    doc.values.insert(ptr.to_string(), v.span());
    match v.get_ref() {
        DeValue::String(s) => Value::String(s.to_string()),
        DeValue::Integer(i) => {
            let digits = i.as_str().replace('_', "");
            match i64::from_str_radix(&digits, i.radix()) {
                Ok(n) => Value::Number(n.into()),
                // Out of i64 range: keep it as text so the schema reports a type error.
                Err(_) => Value::String(i.to_string()),
            }
        }
        DeValue::Float(f) => {
            let x: f64 = f.as_str().replace('_', "").parse().unwrap_or(f64::NAN);
            Number::from_f64(x)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(f.as_str().to_string()))
        }
        DeValue::Boolean(b) => Value::Bool(*b),
        DeValue::Datetime(d) => Value::String(d.to_string()),
        DeValue::Array(a) => Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, e)| value_to_json(e, &format!("{ptr}/{i}"), doc))
                .collect(),
        ),
        DeValue::Table(t) => table_to_json(t, ptr, doc),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_values() {
        let text = "name = \"x\"\n[engine]\ncache_mb = 1_500\nlist = [1, 2.5]\n";
        let d = parse(text).unwrap();
        assert_eq!(d.value["engine"]["cache_mb"], 1500);
        assert_eq!(d.value["engine"]["list"][1], 2.5);
        let off = d.offset("/engine/cache_mb", false).unwrap();
        assert_eq!(&text[off..off + 5], "1_500");
        let off = d.offset("/engine/cache_mb", true).unwrap();
        assert_eq!(&text[off..off + 8], "cache_mb");
        // Unknown pointers fall back to the nearest ancestor.
        assert!(d.offset("/engine/nothing", false).is_some());
    }

    #[test]
    fn syntax_errors() {
        let e = parse("a = \n b = [1,").unwrap_err();
        assert!(!e.is_empty());
        assert!(e[0].offset.is_some());
    }
}

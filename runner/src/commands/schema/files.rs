//! The schema files `bmoe schema` writes (the config files' and the telemetry row's), and the
//! staleness check that keeps the checked-in `schemas/*.json` equal to them.
use std::path::Path;

use anyhow::Context;

use crate::config::job::job_schema;
use crate::config::profile::profile_schema;
use crate::sink::telemetry_schema::telemetry_schema;

/// The files `bmoe schema` writes, and what each holds.
pub const FILES: &[&str] = &[
    "profile.schema.json",
    "job.schema.json",
    "telemetry.schema.json",
];

/// The text of each schema file, as written (pretty JSON, trailing newline).
pub fn rendered() -> Vec<(&'static str, String)> {
    let all = [profile_schema(), job_schema(), telemetry_schema()];
    FILES
        .iter()
        .zip(all)
        .map(|(f, v)| {
            (
                *f,
                format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default()),
            )
        })
        .collect()
}

/// Writes every schema into `dir`.
pub fn write(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in rendered() {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// The files in `dir` that differ from what the code generates (missing counts as different).
pub fn stale(dir: &Path) -> Vec<String> {
    rendered()
        .into_iter()
        .filter(|(name, text)| {
            std::fs::read_to_string(dir.join(name)).ok().as_deref() != Some(text.as_str())
        })
        .map(|(name, _)| name.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_are_enum_for_taplo() {
        let j = job_schema();
        assert_eq!(
            j["$defs"]["Kind"]["enum"],
            serde_json::json!(["generate", "decide", "perplexity"])
        );
        assert!(!job_schema().to_string().contains("\"oneOf\""));
        assert!(!profile_schema().to_string().contains("\"oneOf\""));
    }

    #[test]
    fn options_are_not_nullable() {
        let s = job_schema().to_string();
        assert!(!s.contains("\"null\""), "{s}");
    }

    /// The checked-in schemas must be what the code generates; run `bmoe schema` to refresh them.
    #[test]
    fn checked_in_schemas_are_current() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
        let stale = stale(&dir);
        assert!(
            stale.is_empty(),
            "schemas/{stale:?} differ from the code: run `bmoe schema` (writes schemas/) and commit"
        );
    }

    /// Every shipped profile and job names its schema on its first line (Taplo's directive), and
    /// `.taplo.toml` maps both folders to existing schemas.
    #[test]
    fn shipped_tomls_name_their_schema() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (dir, schema) in [("profiles", "profile"), ("jobs", "job")] {
            let want = format!("#:schema ../schemas/{schema}.schema.json");
            let mut n = 0;
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let p = e.unwrap().path();
                if p.extension().and_then(|x| x.to_str()) != Some("toml") {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                assert_eq!(text.lines().next(), Some(want.as_str()), "{}", p.display());
                n += 1;
            }
            assert!(n > 0, "{dir}");
            assert!(root.join(format!("schemas/{schema}.schema.json")).exists());
        }
        let taplo: toml::Value =
            toml::from_str(&std::fs::read_to_string(root.join(".taplo.toml")).unwrap()).unwrap();
        let rules = taplo["rule"].as_array().unwrap();
        for (glob, path) in [
            ("profiles/**/*.toml", "./schemas/profile.schema.json"),
            ("jobs/**/*.toml", "./schemas/job.schema.json"),
        ] {
            assert!(
                rules.iter().any(|r| r["include"][0].as_str() == Some(glob)
                    && r["schema"]["path"].as_str() == Some(path)),
                "{glob} -> {path}"
            );
        }
    }
}

//! "did you mean ...?" for a misspelt name: the nearest valid name within a small edit distance,
//! as clap and cargo suggest; the whole list only when nothing is close.

/// Names further than this many edits from every valid one get no suggestion.
const MAX_EDITS: usize = 2;

/// The valid name nearest to `name`, when one is at most [`MAX_EDITS`] edits away.
pub fn closest<'a>(name: &str, valid: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    valid
        .into_iter()
        .map(|v| (strsim::levenshtein(&name.to_ascii_lowercase(), v), v))
        .filter(|(d, _)| *d <= MAX_EDITS)
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// The message and `help:` for an unknown name: `unknown key `modle`: did you mean `model`?`
/// with no help, or `unknown key `zzz`` with the valid names as the help.
pub fn unknown<'a>(
    what: &str,
    name: &str,
    valid: impl IntoIterator<Item = &'a str> + Clone,
) -> (String, Option<String>) {
    match closest(name, valid.clone()) {
        Some(v) => (
            format!("unknown {what} `{name}`: did you mean `{v}`?"),
            None,
        ),
        None => (
            format!("unknown {what} `{name}`"),
            Some(format!(
                "expected one of {}",
                valid.into_iter().collect::<Vec<_>>().join(", ")
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_names_are_suggested() {
        let keys = ["model", "kind", "cache_mb", "overrides"];
        assert_eq!(closest("modle", keys), Some("model"));
        assert_eq!(closest("cachemb", keys), Some("cache_mb"));
        assert_eq!(closest("overides", keys), Some("overrides"));
        assert_eq!(closest("zzzzzz", keys), None);
        let (m, h) = unknown("key", "zzzzzz", keys);
        assert_eq!(m, "unknown key `zzzzzz`");
        assert_eq!(
            h.as_deref(),
            Some("expected one of model, kind, cache_mb, overrides")
        );
        assert_eq!(unknown("key", "modle", keys).1, None);
    }
}

//! No script under `scripts/` parses bmoe's human output (issue 53): the lines `bmoe generate`,
//! `bmoe devices` and the engine's examples print on stderr and stdout are for people, and change
//! with them; the scripts read `--format json` documents and the examples' `--json` objects
//! (through `scripts/bmoe-json`). A `sed`, `grep`, `awk` or Python `re` on a line that names one
//! of those lines' prefixes (`decode:`, `storage:`, `system:`, ...: collected here from the code
//! that prints them), or that pipes `bmoe devices`/`bmoe archs` text into one, fails here with the
//! file and the line.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::repo_root;

/// The text tools a script parses with.
const TOOLS: &[&str] = &[
    "sed",
    "grep",
    "awk",
    "re.search",
    "re.match",
    "re.findall",
    "re.compile",
];

/// Words from the middle of bmoe's lines that scripts extracted numbers after (the `storage:` and
/// `prefetch:` lines), beside the prefixes the code gives.
const MID_LINE: &[&str] = &[
    "first token after",
    "peak RSS",
    "file-backed",
    "prediction named",
    "misses served",
    "continue with",
];

/// The files that print bmoe's human lines: the one-shot and listing commands, and the examples.
fn printers() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = Vec::new();
    let mut dirs = vec![
        root.join("runner/src/commands"),
        root.join("engine/examples"),
    ];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files
}

/// The prefix of a printed line: lowercase words (spaces and hyphens inside) and a colon at the
/// start of the format string (`moe-stream decode:`), followed by a space, a value or its end.
fn prefix_of(format: &str) -> Option<&str> {
    let colon = format.find(':')?;
    let head = &format[..colon];
    let ok = head.len() >= 3
        && head.starts_with(|c: char| c.is_ascii_lowercase())
        && head
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == ' ' || c == '-');
    let next = format[colon + 1..].chars().next();
    (ok && matches!(next, None | Some(' ' | '{' | '"'))).then(|| &format[..=colon])
}

/// Every line prefix `println!`/`eprintln!` print in `text`: the first string literal after the
/// macro's parenthesis (on the next line where rustfmt put it there).
fn prefixes_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("println!(") {
        let rest = text[i + "println!(".len()..].trim_start();
        if let Some(lit) = rest.strip_prefix('"') {
            if let Some(p) = prefix_of(lit) {
                out.push(p.to_string());
            }
        }
    }
    out
}

/// The human line prefixes bmoe and its examples print.
fn human_prefixes() -> BTreeSet<String> {
    printers()
        .iter()
        .flat_map(|f| prefixes_in(&std::fs::read_to_string(f).unwrap()))
        .collect()
}

/// Whether `word` stands in `line` as a word of its own (`sed`, not `used`; `load:`, not
/// `test-under-load:`).
fn has_word(line: &str, word: &str) -> bool {
    let inner = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    // A word ending in a colon (`load:`) may run on into anything; `sed` may not (`sedan`).
    let open_end = !word.ends_with(|c: char| c.is_alphanumeric());
    line.match_indices(word).any(|(i, _)| {
        let starts = !line[..i].chars().next_back().is_some_and(inner);
        let ends = open_end || !line[i + word.len()..].chars().next().is_some_and(inner);
        starts && ends
    })
}

/// Whether `line` pipes `bmoe devices` or `bmoe archs` text (not their JSON), or a command's
/// `--help`, into a text tool.
fn pipes_listing_text(line: &str) -> bool {
    let Some(bar) = line.find('|') else {
        return false;
    };
    let (cmd, rest) = line.split_at(bar);
    (has_word(cmd, "devices") || has_word(cmd, "archs") || cmd.contains("--help"))
        && !cmd.contains("--format json")
        && !cmd.contains("--json")
        && TOOLS.iter().any(|t| has_word(rest, t))
}

/// What is wrong with one line of a script, if anything.
fn parses_human_output(line: &str, prefixes: &BTreeSet<String>) -> Option<String> {
    if line.trim_start().starts_with('#') || !TOOLS.iter().any(|t| has_word(line, t)) {
        return None;
    }
    if pipes_listing_text(line) {
        return Some(
            "the text of `bmoe devices`/`bmoe archs` (use --format json) or of `--help`".into(),
        );
    }
    let hit: Vec<&str> = prefixes
        .iter()
        .map(String::as_str)
        .filter(|p| has_word(line, p))
        .chain(MID_LINE.iter().copied().filter(|m| line.contains(m)))
        .collect();
    (!hit.is_empty()).then(|| format!("bmoe's human line(s) {hit:?}"))
}

/// The scripts: every file of `scripts/` and `scripts/device/`.
fn scripts() -> Vec<PathBuf> {
    let root = repo_root();
    let mut out = Vec::new();
    for dir in ["scripts", "scripts/device"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn violations_in(path: &Path, text: &str, prefixes: &BTreeSet<String>) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            parses_human_output(l, prefixes)
                .map(|why| format!("{}:{}: parses {why}: {}", path.display(), i + 1, l.trim()))
        })
        .collect()
}

#[test]
fn no_script_parses_bmoe_human_output() {
    let prefixes = human_prefixes();
    // The scan finds what it looks for: the lines scripts used to read are among the prefixes.
    for p in [
        "decode:",
        "prefill:",
        "storage:",
        "load:",
        "system:",
        "repack:",
        "measured run:",
    ] {
        assert!(prefixes.contains(p), "{p} not found among {prefixes:?}");
    }
    let mut bad = Vec::new();
    for s in scripts() {
        let Ok(text) = std::fs::read_to_string(&s) else {
            continue; // not text: nothing a shell reads
        };
        bad.extend(violations_in(&s, &text, &prefixes));
    }
    assert!(
        bad.is_empty(),
        "scripts parse bmoe's human output; read `--format json` (scripts/bmoe-json) instead:\n{}",
        bad.join("\n")
    );
}

/// The checker itself: what the scripts did before issue 53 fails, what they do now passes.
#[test]
fn the_check_tells_parsing_from_reading_json() {
    let prefixes = human_prefixes();
    let bad = [
        r#"echo "build: $("$B" devices | sed -n 's/^system: //p')""#,
        r#"  local tps=$(sed -n 's/^decode: .*(\(.*\) tok\/s)$/\1/p' "$OUT/$name.err")"#,
        r#"compute = float(re.search(r"first token after ([0-9.]+) s", warm).group(1))"#,
        r#"  mapfile -t ARCHS < <("$B" archs | awk 'NF {print $1}')"#,
        r#"if "$B" generate --help 2>/dev/null | grep -q -- '--repack'; then BMOE_OFF=1; fi"#,
        r#"grep -q "interrupted; continue with" "$log" || fail "no resume hint""#,
    ];
    for l in bad {
        assert!(
            parses_human_output(l, &prefixes).is_some(),
            "not caught: {l}"
        );
    }
    let good = [
        r#"echo "build: $("$B" devices --format json | scripts/bmoe-json system_info)""#,
        r#"echo "test-under-load: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)""#,
        r#"  anon=$(awk '/^RssAnon:/ {print int($2/1024)}' /proc/$pid/status)"#,
        r#"# sed -n 's/^decode: //p' was how it read the rate"#,
    ];
    for l in good {
        assert_eq!(parses_human_output(l, &prefixes), None, "{l}");
    }
}

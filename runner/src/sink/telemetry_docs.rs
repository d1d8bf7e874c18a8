//! docs/telemetry.md agrees with the row and its schema: every column listed, its type the
//! schema's, the configuration columns' rows written from the declarations (test-only).
use super::row::Row;

/// docs/telemetry.md lists every column with the version it appeared in.
#[test]
fn every_column_is_documented() {
    let doc = include_str!("../../../docs/telemetry.md");
    for c in Row::columns() {
        assert!(
            doc.lines().any(|l| l.starts_with(&format!("| `{c}` |"))),
            "docs/telemetry.md does not list column {c}"
        );
    }
}

/// docs/telemetry.md's rows of the configuration columns (`threads` to `n_expert_used`,
/// declared in config/declare.rs) are what the schema says of them: type, unit, schema
/// version and description. `BMOE_BLESS=1` writes them from the declarations (a new
/// setting's row goes after its predecessor's) instead of failing.
#[test]
fn setting_column_rows_are_the_declarations() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/telemetry.md");
    let doc = std::fs::read_to_string(path).expect("docs/telemetry.md");
    let wanted = setting_column_rows();
    if std::env::var_os("BMOE_BLESS").is_some() {
        std::fs::write(path, with_setting_rows(&doc, &wanted)).expect("writing telemetry.md");
        return;
    }
    for (c, want) in &wanted {
        let have = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{c}` |")))
            .unwrap_or_default()
            .replace("|  |", "| |");
        assert_eq!(
            have,
            want.replace("|  |", "| |"),
            "docs/telemetry.md's row of {c} vs its declaration in config/declare.rs: run \
             `BMOE_BLESS=1 cargo test -p bmoe-runner --lib telemetry_docs` to write it"
        );
    }
}

/// (column, docs row) of each configuration column, from the schema.
fn setting_column_rows() -> Vec<(String, String)> {
    let schema = super::telemetry_schema::telemetry_schema();
    let cols = Row::columns();
    let first = cols.iter().position(|c| c == "threads").unwrap();
    let last = cols.iter().position(|c| c == "n_expert_used").unwrap();
    cols[first..=last]
        .iter()
        .map(|c| {
            let p = &schema["properties"][c.as_str()];
            let row = format!(
                "| `{c}` | {} | {} | {} | {} |",
                super::telemetry_schema::type_words(p),
                p["x-unit"].as_str().unwrap_or_default(),
                p["x-since"].as_u64().unwrap_or(1),
                p["description"]
                    .as_str()
                    .unwrap_or_default()
                    .replace('\n', " ")
            );
            (c.clone(), row)
        })
        .collect()
}

/// `doc` with each configuration column's row replaced, or inserted after the row before it.
fn with_setting_rows(doc: &str, rows: &[(String, String)]) -> String {
    let mut lines: Vec<String> = doc.lines().map(String::from).collect();
    let mut after: Option<usize> = None;
    for (c, row) in rows {
        let prefix = format!("| `{c}` |");
        match lines.iter().position(|l| l.starts_with(&prefix)) {
            Some(i) => {
                lines[i] = row.clone();
                after = Some(i);
            }
            None => {
                let i = after.map_or(lines.len(), |a| a + 1);
                lines.insert(i, row.clone());
                after = Some(i);
            }
        }
    }
    lines.join("\n") + "\n"
}

#[test]
fn a_new_settings_row_goes_after_its_predecessor() {
    let doc = "x\n| `a` | 1 |\n| `c` | 3 |\ny\n";
    let rows = [
        ("a", "| `a` | one |"),
        ("b", "| `b` | two |"),
        ("c", "| `c` | 3 |"),
    ]
    .map(|(c, r)| (c.to_string(), r.to_string()));
    assert_eq!(
        with_setting_rows(doc, &rows),
        "x\n| `a` | one |\n| `b` | two |\n| `c` | 3 |\ny\n"
    );
}

/// docs/telemetry.md's type of every column is the schema's (`number or null` where the
/// column can be empty).
#[test]
fn every_columns_documented_type_is_the_schemas() {
    let doc = include_str!("../../../docs/telemetry.md");
    let schema = super::telemetry_schema::telemetry_schema();
    for c in Row::columns() {
        let want = super::telemetry_schema::type_words(&schema["properties"][c.as_str()]);
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{c}` |")))
            .unwrap_or_default();
        let have = row.split('|').nth(2).unwrap_or_default().trim();
        assert_eq!(have, want, "docs/telemetry.md's type of column {c}");
    }
}

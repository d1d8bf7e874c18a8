//! Is a sharded run complete? Every row carries `shard = K/N`, so the inputs say which K of
//! 0..N hold rows; a shard that drew no item has only a header and says nothing, so each input
//! without sharded rows is counted as one such shard (it is given on the command line, which the
//! filename alone could not prove). Shards missing beyond those are a gap.
use std::collections::{BTreeMap, BTreeSet};

use anyhow::bail;

/// The shards an input's rows belong to.
#[derive(Debug, Default)]
pub struct Labels {
    /// The input, as the user names it.
    pub file: String,
    /// (run id, K, N) of its rows.
    pub shards: BTreeSet<(String, u32, u32)>,
}

/// Shards with no rows that no input without rows can stand for.
#[derive(Debug, PartialEq, Eq)]
pub struct Gap {
    /// Each missing shard, `K/N of run R` (empty when the rows name no shard count).
    pub shards: Vec<String>,
    /// What is missing, in a sentence.
    pub message: String,
}

/// `K/N` with K below N; `None` otherwise.
pub fn parse(label: &str) -> Option<(u32, u32)> {
    let (k, n) = label.trim().split_once('/')?;
    let (k, n): (u32, u32) = (k.trim().parse().ok()?, n.trim().parse().ok()?);
    (k < n).then_some((k, n))
}

/// The gap in the inputs' shards, if any: N from the rows (one N per run) or from `expect`
/// (`--expect-shards`, which must agree with the rows). Refuses rows that disagree on N.
pub fn missing(inputs: &[Labels], expect: Option<u32>) -> anyhow::Result<Option<Gap>> {
    let anonymous: Vec<&str> = inputs
        .iter()
        .filter(|i| i.shards.is_empty())
        .map(|i| i.file.as_str())
        .collect();
    // run -> (N -> a file saying it, K seen)
    let mut runs: BTreeMap<&str, (BTreeMap<u32, &str>, BTreeSet<u32>)> = BTreeMap::new();
    for i in inputs {
        for (run, k, n) in &i.shards {
            let e = runs.entry(run.as_str()).or_default();
            e.0.entry(*n).or_insert(i.file.as_str());
            e.1.insert(*k);
        }
    }
    let mut shards = Vec::new();
    for (run, (ns, ks)) in &runs {
        let mut it = ns.iter();
        let (n, file) = it.next().map(|(n, f)| (*n, *f)).unwrap_or((0, ""));
        if let Some((m, other)) = it.next() {
            bail!("merge: run {run} mixes shard counts: {file} holds shards of {n}, {other} of {m}; merge the shards of one fleet");
        }
        if let Some(e) = expect.filter(|&e| e != n) {
            bail!(
                "merge: --expect-shards {e}, but the rows of run {run} in {file} are shards of {n}"
            );
        }
        shards.extend(
            (0..n)
                .filter(|k| !ks.contains(k))
                .map(|k| format!("{k}/{n} of run {run}")),
        );
    }
    let message = match expect {
        // Nothing names a shard: only the count of inputs can say anything.
        Some(e) if runs.is_empty() => {
            if anonymous.len() >= e as usize {
                return Ok(None);
            }
            format!(
                "--expect-shards {e}, but no row names a shard and only {} input(s) hold no sharded rows",
                anonymous.len()
            )
        }
        _ => {
            if shards.len() <= anonymous.len() {
                return Ok(None);
            }
            let mut m = format!("shard(s) {} have no rows", shards.join(", "));
            if !anonymous.is_empty() {
                m.push_str(&format!(
                    "; the {} input(s) without rows ({}) stand for only {} of them",
                    anonymous.len(),
                    anonymous.join(", "),
                    anonymous.len()
                ));
            }
            m
        }
    };
    Ok(Some(Gap { shards, message }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(file: &str, shards: &[(&str, u32, u32)]) -> Labels {
        Labels {
            file: file.into(),
            shards: shards
                .iter()
                .map(|(r, k, n)| (r.to_string(), *k, *n))
                .collect(),
        }
    }

    #[test]
    fn labels() {
        assert_eq!(parse("2/4"), Some((2, 4)));
        assert_eq!(parse("4/4"), None);
        assert_eq!(parse("x"), None);
    }

    #[test]
    fn gaps_and_what_stands_for_them() {
        let s0 = input("s0.csv", &[("r", 0, 4)]);
        let s1 = input("s1.csv", &[("r", 1, 4)]);
        let s3 = input("s3.csv", &[("r", 3, 4)]);
        let empty = input("s2.csv", &[]);
        let g = missing(&[s0, s1], None).unwrap().unwrap();
        assert_eq!(g.shards, ["2/4 of run r", "3/4 of run r"]);
        assert_eq!(
            g.message,
            "shard(s) 2/4 of run r, 3/4 of run r have no rows"
        );
        let s0 = input("s0.csv", &[("r", 0, 4)]);
        let s1 = input("s1.csv", &[("r", 1, 4)]);
        assert_eq!(missing(&[s0, s1, empty, s3], Some(4)).unwrap(), None);
        assert!(missing(&[input("a", &[])], Some(2)).unwrap().is_some());
        assert_eq!(
            missing(&[input("a", &[]), input("b", &[])], Some(2)).unwrap(),
            None
        );
        assert_eq!(missing(&[input("a", &[])], None).unwrap(), None);
        let e = missing(&[input("s0", &[("r", 0, 3)])], Some(4)).unwrap_err();
        assert!(e
            .to_string()
            .contains("--expect-shards 4, but the rows of run r in s0 are shards of 3"));
        let mixed = [input("a", &[("r", 0, 3)]), input("b", &[("r", 1, 4)])];
        assert!(missing(&mixed, None).is_err());
    }
}

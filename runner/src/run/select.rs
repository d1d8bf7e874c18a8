//! Which items a run takes: a stable shard of them (`--shard K/N`, K 0-based, defaulting from a
//! Kubernetes Indexed Job or a Slurm array), a glob over item ids (`--items`) and a count
//! (`--limit`). The shard of an item depends only on its id, so every process of a fleet agrees
//! without talking to the others.
use globset::{Glob, GlobMatcher};
use sha2::{Digest, Sha256};

/// One shard of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// 0-based index, `0 <= k < n`.
    pub k: u32,
    /// Number of shards, at least 1.
    pub n: u32,
}

/// A `--shard` value or environment that does not give a valid shard.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// Not `K/N` or `N`.
    #[error("--shard {0:?}: expected K/N (K 0-based: 0/3, 1/3, 2/3) or N (K from JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID)")]
    Syntax(String),
    /// N = 0.
    #[error("--shard {0}: N must be at least 1 (K/N with K 0-based: 0/1 runs everything)")]
    NoShards(String),
    /// K out of range.
    #[error("--shard {k}/{n}: K is 0-based and must be below N (valid: 0/{n} .. {last}/{n})", last = .n - 1)]
    OutOfRange {
        /// K given.
        k: u32,
        /// N given.
        n: u32,
    },
    /// N given but no K anywhere.
    #[error("--shard {0}: no shard index: give --shard K/{0}, or run where JOB_COMPLETION_INDEX (Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID (Slurm array) is set")]
    NoIndex(u32),
    /// An environment variable that does not hold a number.
    #[error("{var}={value:?}: expected a non-negative integer")]
    BadEnv {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
    },
}

/// Reads the environment through a function, so tests need not touch the process's.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn env_u32(env: Env<'_>, var: &str) -> Result<Option<u32>, ShardError> {
    match env(var) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| ShardError::BadEnv {
            var: var.to_string(),
            value: v,
        }),
    }
}

/// The shard index from the scheduler: `JOB_COMPLETION_INDEX` (Kubernetes, 0-based), else
/// `SLURM_ARRAY_TASK_ID` minus `SLURM_ARRAY_TASK_MIN` (so `--array=1-4` is 0-based too).
fn env_index(env: Env<'_>) -> Result<Option<u32>, ShardError> {
    if let Some(k) = env_u32(env, "JOB_COMPLETION_INDEX")? {
        return Ok(Some(k));
    }
    if let Some(id) = env_u32(env, "SLURM_ARRAY_TASK_ID")? {
        let min = env_u32(env, "SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
        return Ok(Some(id.saturating_sub(min)));
    }
    Ok(None)
}

impl Shard {
    /// The shard of this process: `--shard K/N`; `--shard N` with K from the scheduler; or, with
    /// no `--shard`, a Slurm array (`SLURM_ARRAY_TASK_COUNT` set). `None`: not sharded.
    pub fn resolve(arg: Option<&str>, env: Env<'_>) -> Result<Option<Shard>, ShardError> {
        let (k, n) = match arg {
            Some(a) => {
                let a = a.trim();
                match a.split_once('/') {
                    Some((k, n)) => {
                        let k: u32 = k.trim().parse().map_err(|_| ShardError::Syntax(a.into()))?;
                        let n: u32 = n.trim().parse().map_err(|_| ShardError::Syntax(a.into()))?;
                        if n == 0 {
                            return Err(ShardError::NoShards(a.into()));
                        }
                        (k, n)
                    }
                    None => {
                        let n: u32 = a.parse().map_err(|_| ShardError::Syntax(a.into()))?;
                        if n == 0 {
                            return Err(ShardError::NoShards(a.into()));
                        }
                        (env_index(env)?.ok_or(ShardError::NoIndex(n))?, n)
                    }
                }
            }
            None => match env_u32(env, "SLURM_ARRAY_TASK_COUNT")? {
                Some(n) if n > 0 => (env_index(env)?.ok_or(ShardError::NoIndex(n))?, n),
                _ => return Ok(None),
            },
        };
        if k >= n {
            return Err(ShardError::OutOfRange { k, n });
        }
        Ok(Some(Shard { k, n }))
    }

    /// True when the item belongs to this shard: SHA-256 of the id, its first 8 bytes as a
    /// big-endian number, modulo N. A fixed hash, unlike std's per-process randomised one.
    pub fn takes(&self, item_id: &str) -> bool {
        shard_of(item_id, self.n) == self.k
    }

    /// `K/N`, as written to the `shard` column.
    pub fn label(&self) -> String {
        format!("{}/{}", self.k, self.n)
    }
}

/// The 0-based shard of an item id among `n`.
pub fn shard_of(item_id: &str, n: u32) -> u32 {
    let d = Sha256::digest(item_id.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    (u64::from_be_bytes(b) % u64::from(n.max(1))) as u32
}

/// A selection that leaves no item in any job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{selection} matched none of {of}; {hint}")]
pub struct EmptySelection {
    /// The selection flags, as given.
    pub selection: String,
    /// The items it chose from, per job.
    pub of: String,
    /// What to do.
    pub hint: String,
}

impl EmptySelection {
    /// The finding without the hint, for the note an allowed empty run prints.
    pub fn selection_line(&self) -> String {
        format!("{} matched none of {}", self.selection, self.of)
    }
}

/// The items of each job a run takes.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// This process's shard.
    pub shard: Option<Shard>,
    /// `--items GLOB` over item ids.
    pub items: Option<GlobMatcher>,
    /// `--limit N`: at most this many items per job (after the shard and the glob).
    pub limit: Option<usize>,
}

impl Filter {
    /// Compiles `--items`; the error names the pattern.
    pub fn new(
        shard: Option<Shard>,
        items: Option<&str>,
        limit: Option<usize>,
    ) -> anyhow::Result<Self> {
        let items = match items {
            Some(g) => Some(
                Glob::new(g)
                    .map_err(|e| anyhow::anyhow!("--items {g:?}: not a glob: {e}"))?
                    .compile_matcher(),
            ),
            None => None,
        };
        Ok(Self {
            shard,
            items,
            limit,
        })
    }

    /// The selection flags as given (`--shard 2/4 --items 'd1*'`); `None` when nothing narrows
    /// the items.
    pub fn selection(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(s) = self.shard {
            parts.push(format!("--shard {}", s.label()));
        }
        if let Some(g) = &self.items {
            parts.push(format!("--items '{}'", g.glob().glob()));
        }
        if let Some(n) = self.limit {
            parts.push(format!("--limit {n}"));
        }
        (!parts.is_empty()).then(|| parts.join(" "))
    }

    /// Refuses a selection that leaves no item in any job (a glob typo, `--limit 0`, a shard that
    /// drew nothing): a run that did nothing must not pass for one that worked. `jobs` are
    /// (job name, item ids).
    #[cfg(test)]
    pub fn refuse_empty(&self, jobs: &[(&str, Vec<&str>)]) -> Result<(), EmptySelection> {
        let keyed: Vec<(&str, Vec<(&str, &str)>)> = jobs
            .iter()
            .map(|(name, ids)| (*name, ids.iter().map(|&id| (id, id)).collect()))
            .collect();
        self.refuse_empty_keyed(&keyed)
    }

    /// `refuse_empty` with each item's shard key: `jobs` are (job name, (id, shard key)).
    pub fn refuse_empty_keyed(
        &self,
        jobs: &[(&str, Vec<(&str, &str)>)],
    ) -> Result<(), EmptySelection> {
        let Some(selection) = self.selection() else {
            return Ok(());
        };
        if jobs
            .iter()
            .any(|(_, items)| !self.apply_keyed(items.iter().copied()).is_empty())
        {
            return Ok(());
        }
        let of = jobs
            .iter()
            .map(|(name, ids)| format!("the {} items of job {name}", ids.len()))
            .collect::<Vec<_>>()
            .join(", ");
        let sample: Vec<&str> = jobs
            .iter()
            .flat_map(|(_, items)| items.iter().map(|(id, _)| *id))
            .take(3)
            .collect();
        let hint = if self.shard.is_some() {
            "a shard of a fleet may draw no item: add --allow-empty to the shards' command (an empty shard then writes a header-only CSV and exits 0)".to_string()
        } else if self.limit == Some(0) {
            "--limit 0 takes nothing; add --allow-empty if that is meant".to_string()
        } else if sample.is_empty() {
            "add --allow-empty if that is meant".to_string()
        } else {
            format!(
                "the ids look like {}; check the glob, or add --allow-empty if that is meant",
                sample.join(", ")
            )
        };
        Err(EmptySelection {
            selection,
            of,
            hint,
        })
    }

    /// The ids, in job order, that this run takes.
    #[cfg(test)]
    pub fn apply<'a>(&self, ids: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
        self.apply_keyed(ids.map(|id| (id, id)))
    }

    /// The ids, in job order, that this run takes, of (id, shard key) pairs: the shard goes by
    /// the key (an item's group, `shard_by`), `--items` by the id.
    pub fn apply_keyed<'a>(&self, items: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<&'a str> {
        let picked = items
            .filter(|(id, key)| {
                self.shard.map(|s| s.takes(key)).unwrap_or(true)
                    && self.items.as_ref().map(|g| g.is_match(id)).unwrap_or(true)
            })
            .map(|(id, _)| id);
        match self.limit {
            Some(n) => picked.take(n).collect(),
            None => picked.collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = vars
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        move |k| v.iter().find(|(a, _)| a == k).map(|(_, b)| b.clone())
    }

    #[test]
    fn parse_and_defaults() {
        let none = env_of(&[]);
        assert_eq!(
            Shard::resolve(Some("1/3"), &none).unwrap(),
            Some(Shard { k: 1, n: 3 })
        );
        assert_eq!(Shard::resolve(None, &none).unwrap(), None);
        assert_eq!(
            Shard::resolve(Some("3/2"), &none).unwrap_err(),
            ShardError::OutOfRange { k: 3, n: 2 }
        );
        assert!(Shard::resolve(Some("3/2"), &none)
            .unwrap_err()
            .to_string()
            .contains("K is 0-based and must be below N (valid: 0/2 .. 1/2)"));
        assert!(matches!(
            Shard::resolve(Some("0/0"), &none),
            Err(ShardError::NoShards(_))
        ));
        assert!(matches!(
            Shard::resolve(Some("a/b"), &none),
            Err(ShardError::Syntax(_))
        ));
        assert_eq!(
            Shard::resolve(Some("4"), &none).unwrap_err(),
            ShardError::NoIndex(4)
        );
        let k8s = env_of(&[("JOB_COMPLETION_INDEX", "2")]);
        assert_eq!(
            Shard::resolve(Some("4"), &k8s).unwrap(),
            Some(Shard { k: 2, n: 4 })
        );
        // Without N, Kubernetes' index alone does not shard (it has no count variable).
        assert_eq!(Shard::resolve(None, &k8s).unwrap(), None);
        let slurm = env_of(&[
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]);
        assert_eq!(
            Shard::resolve(None, &slurm).unwrap(),
            Some(Shard { k: 2, n: 4 })
        );
        let bad = env_of(&[("JOB_COMPLETION_INDEX", "x")]);
        assert!(Shard::resolve(Some("2"), &bad).is_err());
    }

    #[test]
    fn split_is_stable_and_covers_every_item() {
        let ids: Vec<String> = (0..300).map(|i| format!("d{i}")).collect();
        let n = 3;
        let mut seen = vec![0u32; ids.len()];
        for k in 0..n {
            let f = Filter::new(Some(Shard { k, n }), None, None).unwrap();
            for id in f.apply(ids.iter().map(|s| s.as_str())) {
                let i = ids.iter().position(|x| x == id).unwrap();
                seen[i] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1));
        // Fixed values: a change of hash would move items between shards across versions.
        assert_eq!(
            (
                shard_of("d1", 3),
                shard_of("d2", 3),
                shard_of("open-settings", 3)
            ),
            (1, 0, 2)
        );
        let sizes: Vec<usize> = (0..n)
            .map(|k| ids.iter().filter(|id| shard_of(id, n) == k).count())
            .collect();
        assert!(sizes.iter().all(|&s| s > 60), "{sizes:?}");
    }

    #[test]
    fn glob_and_limit() {
        let ids = ["a1", "a2", "b1", "a3"];
        let f = Filter::new(None, Some("a*"), Some(2)).unwrap();
        assert_eq!(f.apply(ids.iter().copied()), ["a1", "a2"]);
        assert!(Filter::new(None, Some("a["), None).is_err());
    }

    #[test]
    fn an_empty_selection_names_itself_and_the_jobs() {
        let jobs = [("demo", vec!["a1", "a2", "b1"])];
        let f = Filter::new(None, Some("nomatch-*"), None).unwrap();
        let e = f.refuse_empty(&jobs).unwrap_err().to_string();
        assert!(
            e.starts_with("--items 'nomatch-*' matched none of the 3 items of job demo; the ids look like a1, a2, b1"),
            "{e}"
        );
        assert!(Filter::new(None, Some("a*"), None)
            .unwrap()
            .refuse_empty(&jobs)
            .is_ok());
        assert!(Filter::default().refuse_empty(&[("demo", vec![])]).is_ok());
        let zero = Filter::new(None, None, Some(0)).unwrap();
        assert!(zero.refuse_empty(&jobs).is_err());
    }
}

//! The CPU variant probe's verdicts, remembered per machine state, so that the probe (a forked
//! child per variant) runs and its `bmoe:` line about a skipped variant prints once per machine
//! state, not on every command.
//!
//! A file per state under `${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/cpu-probe/` (or the folder
//! `BMOE_CPU_PROBE_CACHE` names; empty: remember nothing), named by a SHA-256 of what a verdict
//! depends on: the CPU modules (name, size, mtime), the CPU (model name and flags), the OS state
//! (XCR0, the AMX permission, the kernel release) and bmoe's version. Any of them changing names
//! another file, so the probe runs again. Deleting the folder forgets every verdict.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::cpu_select::OsState;

/// One module's verdict: `Ok` it ran the probe matmul, `Err(why)` it did not.
pub(super) type Verdict = Result<(), String>;

/// The verdicts of one machine state: those read from its file and those probed since.
#[derive(Debug, Default)]
pub(super) struct Memo {
    file: Option<PathBuf>,
    known: BTreeMap<String, Verdict>,
    changed: bool,
}

impl Memo {
    /// The memo for this state in the cache folder (none when the folder is unknown or off).
    pub(super) fn open(modules: &Path, cpuinfo: &str, os: OsState) -> Memo {
        let Some(dir) = cache_dir() else {
            return Memo::default();
        };
        let key = state_key(modules, cpuinfo, os);
        Memo::at(dir.join(&key[..32]))
    }

    /// The memo kept in `file` (read now if it exists).
    pub(super) fn at(file: PathBuf) -> Memo {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        Memo {
            known: parse(&text),
            file: Some(file),
            changed: false,
        }
    }

    /// The file the verdicts live in, when remembered.
    pub(super) fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The remembered verdict for `name`, if any.
    pub(super) fn get(&self, name: &str) -> Option<&Verdict> {
        self.known.get(name)
    }

    /// Records a verdict probed now.
    pub(super) fn put(&mut self, name: &str, verdict: Verdict) {
        self.known.insert(name.to_string(), verdict);
        self.changed = true;
    }

    /// Writes the file when a verdict was added (a temporary file renamed over it, so a process
    /// starting beside this one reads the old or the new file, never half of one). Best effort: a
    /// cache that cannot be written only means the probe runs again next time.
    pub(super) fn save(&self) {
        let (Some(file), true) = (&self.file, self.changed) else {
            return;
        };
        let Some(dir) = file.parent() else { return };
        let _ = std::fs::create_dir_all(dir);
        let tmp = dir.join(format!(".tmp-{}", std::process::id()));
        if std::fs::write(&tmp, render(&self.known)).is_ok() && std::fs::rename(&tmp, file).is_err()
        {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("BMOE_CPU_PROBE_CACHE") {
        return (!d.is_empty()).then(|| PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("bmoe").join("cpu-probe"))
}

/// Hex SHA-256 of what a verdict depends on (the module docs).
pub(super) fn state_key(modules: &Path, cpuinfo: &str, os: OsState) -> String {
    let mut h = Sha256::new();
    h.update(concat!(
        "bmoe ",
        env!("CARGO_PKG_VERSION"),
        " cpu probe 1\n"
    ));
    for line in module_lines(modules) {
        h.update(line);
    }
    for field in ["model name", "flags"] {
        let v = cpuinfo
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == field))
            .map_or("", |(_, v)| v.trim());
        h.update(format!("{field}={v}\n"));
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    h.update(format!(
        "xcr0={:?} amx={} kernel={}\n",
        os.xcr0,
        os.amx_permitted,
        kernel.trim()
    ));
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `name size mtime` of every `libggml-cpu*.so` in `dir`, sorted.
fn module_lines(dir: &Path) -> Vec<String> {
    let mut lines: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("libggml-cpu"))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            let t = m
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?;
            Some(format!(
                "{} {} {}\n",
                e.path().display(),
                m.len(),
                t.as_nanos()
            ))
        })
        .collect();
    lines.sort();
    lines
}

const HEADER: &str =
    "# bmoe: CPU variant probe verdicts for one machine state (delete to probe again)\n";

fn render(known: &BTreeMap<String, Verdict>) -> String {
    let mut s = HEADER.to_string();
    for (name, v) in known {
        match v {
            Ok(()) => s += &format!("{name}\tok\n"),
            Err(why) => s += &format!("{name}\tskip\t{}\n", why.replace(['\n', '\t'], " ")),
        }
    }
    s
}

fn parse(text: &str) -> BTreeMap<String, Verdict> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.splitn(3, '\t');
            let name = f.next()?.to_string();
            match (f.next()?, f.next()) {
                ("ok", None) => Some((name, Ok(()))),
                ("skip", Some(why)) => Some((name, Err(why.to_string()))),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OS: OsState = OsState {
        xcr0: Some(0xe7),
        amx_permitted: false,
    };

    #[test]
    fn verdicts_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state");
        let mut m = Memo::at(file.clone());
        assert!(m.get("zen4").is_none());
        m.put(
            "sapphirerapids",
            Err("its probe matmul died of SIGILL".into()),
        );
        m.put("zen4", Ok(()));
        m.save();
        let again = Memo::at(file);
        assert_eq!(again.get("zen4"), Some(&Ok(())));
        assert_eq!(
            again.get("sapphirerapids"),
            Some(&Err("its probe matmul died of SIGILL".to_string()))
        );
    }

    #[test]
    fn a_memo_read_and_not_changed_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state");
        Memo::at(file.clone()).save();
        assert!(!file.exists());
    }

    #[test]
    fn the_key_changes_with_the_cpu_the_os_state_and_the_modules() {
        let dir = tempfile::tempdir().unwrap();
        let info = "model name\t: Xeon\nflags\t\t: sse avx2 avx512f amx_tile\n";
        let k = state_key(dir.path(), info, OS);
        assert_eq!(k, state_key(dir.path(), info, OS));
        assert_ne!(k, state_key(dir.path(), &info.replace(" amx_tile", ""), OS));
        let amx = OsState {
            amx_permitted: true,
            ..OS
        };
        assert_ne!(k, state_key(dir.path(), info, amx));
        std::fs::write(dir.path().join("libggml-cpu-zen4.so"), b"x").unwrap();
        assert_ne!(k, state_key(dir.path(), info, OS));
    }
}

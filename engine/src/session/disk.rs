//! Prefix state on disk (`SessionOptions::prefix_cache`): sequence 0's state when the cache held
//! exactly a grid-aligned token prefix, one file per prefix, so a new process (a shard, a resumed
//! run, a sweep point) restores it instead of prefilling it again. A file's name hashes the key
//! (the caller's: model content, every setting that changes numerics; the engine's: llama.cpp's
//! build and CPU features, the piece widths) with the tokens; its body repeats both and ends with
//! a SHA-256 of the rest, so a damaged or foreign file is ignored with a `bmoe:` line, never
//! restored. The folder is kept under a size limit by dropping the least recently used files.
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::options::PrefixCache;
use crate::telemetry::ReuseOutcome;

use super::reuse::Reuse;
use super::Session;

const MAGIC: &[u8; 8] = b"BMOEPFX1";
const EXT: &str = "bmoe-prefix";

/// The whole key of a session's entries: the caller's (model content, numerics settings, the
/// llama.cpp pin) and the engine's own (the CPU kernels llama.cpp uses, the piece widths).
pub(crate) fn full_key(cache: &PrefixCache, widths: &str) -> String {
    format!(
        "{}\n{}\n{widths}",
        cache.key,
        crate::ffi::registry::system_info()
    )
}

fn tokens_bytes(tokens: &[i32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Where the entry of `tokens` under `key` lives.
pub(crate) fn entry_path(dir: &Path, key: &str, tokens: &[i32]) -> PathBuf {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update([0u8]);
    h.update(tokens_bytes(tokens));
    let name: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dir.join(format!("{name}.{EXT}"))
}

fn body(key: &str, tokens: &[i32], data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(data.len() + key.len() + tokens.len() * 4 + 64);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    b.extend_from_slice(&tokens_bytes(tokens));
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(data);
    let sum = Sha256::digest(&b);
    b.extend_from_slice(&sum);
    b
}

/// Reads the state saved for exactly `tokens` under `key`; `None` when there is none, or (with a
/// `bmoe:` line) when the file is damaged or was written for another key or prefix.
pub(crate) fn load(dir: &Path, key: &str, tokens: &[i32]) -> Option<Vec<u8>> {
    let path = entry_path(dir, key, tokens);
    let bytes = std::fs::read(&path).ok()?;
    match parse(&bytes, key, tokens) {
        Ok(data) => {
            // Recently used: eviction goes by modification time.
            if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
            Some(data)
        }
        Err(why) => {
            eprintln!("bmoe: prefix cache entry {} ignored: {why}", path.display());
            None
        }
    }
}

fn parse(b: &[u8], key: &str, tokens: &[i32]) -> std::result::Result<Vec<u8>, &'static str> {
    if b.len() < MAGIC.len() + 32 || &b[..8] != MAGIC {
        return Err("not a bmoe prefix-cache entry");
    }
    let (rest, sum) = b.split_at(b.len() - 32);
    if Sha256::digest(rest).as_slice() != sum {
        return Err("damaged (checksum mismatch)");
    }
    let mut r = Reader { b: rest, at: 8 };
    let klen = r.len()?;
    let k = r.take(klen)?.to_vec();
    if k != key.as_bytes() {
        return Err("written for another model, setting or build");
    }
    let ntok = r.len()?;
    if r.take(ntok.checked_mul(4).ok_or("truncated")?)? != tokens_bytes(tokens).as_slice() {
        return Err("written for another token prefix");
    }
    let dlen = r.len()?;
    Ok(r.take(dlen)?.to_vec())
}

/// Reads an entry's fields in order.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], &'static str> {
        let end = self.at.checked_add(n).ok_or("truncated")?;
        let s = self.b.get(self.at..end).ok_or("truncated")?;
        self.at = end;
        Ok(s)
    }

    fn len(&mut self) -> std::result::Result<usize, &'static str> {
        let b: [u8; 8] = self.take(8)?.try_into().map_err(|_| "truncated")?;
        Ok(u64::from_le_bytes(b) as usize)
    }
}

/// Writes the state of `tokens` (atomically: a temporary file renamed), then drops the least
/// recently used entries while the folder holds more than `max_bytes`. A failure is said once
/// per call and costs only the entry.
pub(crate) fn save(cache: &PrefixCache, key: &str, tokens: &[i32], data: &[u8]) {
    let path = entry_path(&cache.dir, key, tokens);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::create_dir_all(&cache.dir)
        .and_then(|_| std::fs::File::create(&tmp))
        .and_then(|mut f| f.write_all(&body(key, tokens, data)))
        .and_then(|_| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        eprintln!(
            "bmoe: prefix cache {}: could not write an entry: {e}",
            cache.dir.display()
        );
        return;
    }
    evict(&cache.dir, cache.max_bytes);
}

/// Removes the oldest entries (by modification time) until the folder's entries fit `max`.
fn evict(dir: &Path, max: u64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = rd
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == EXT))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    entries.sort();
    for (_, len, p) in entries {
        if total <= max {
            break;
        }
        if std::fs::remove_file(&p).is_ok() {
            total -= len;
        }
    }
}

impl Session<'_> {
    /// After in-process reuse kept `reuse.kept` tokens: restores the longest grid-aligned prefix
    /// of `tokens` the folder holds, when it is longer.
    pub(crate) fn restore_from_disk(&mut self, tokens: &[i32], reuse: Reuse) -> Result<Reuse> {
        let Some((cache, key)) = self.disk.clone() else {
            return Ok(reuse);
        };
        if reuse.outcome == ReuseOutcome::Hit || tokens.len() < 2 {
            return Ok(reuse);
        }
        let w = self.piece_width().max(1);
        let mut at = (tokens.len() - 1) / w * w;
        while at > reuse.kept {
            if let Some(data) = load(&cache.dir, &key, &tokens[..at]) {
                self.forget()?;
                if self.ctx.state_seq_set(0, &data) {
                    self.kv = tokens[..at].to_vec();
                    return Ok(Reuse {
                        kept: at,
                        outcome: ReuseOutcome::Restore,
                        reason: "prefix cache",
                    });
                }
                eprintln!(
                    "bmoe: prefix cache entry {} ignored: llama.cpp refused the state",
                    entry_path(&cache.dir, &key, &tokens[..at]).display()
                );
                self.forget()?;
                return Ok(Reuse {
                    kept: 0,
                    outcome: ReuseOutcome::Miss,
                    reason: "a saved state could not be restored",
                });
            }
            at -= w;
        }
        Ok(reuse)
    }

    /// Where this prompt's state goes to disk: the end of the rendered prefix cut back to the
    /// grid, when the folder has no entry for it yet and the prefill will pass it.
    pub(crate) fn disk_boundary(&self, b: usize, from: usize, tokens: &[i32]) -> Option<usize> {
        let (cache, key) = self.disk.as_ref()?;
        let w = self.piece_width().max(1);
        let b = b - b % w;
        (b > from && !entry_path(&cache.dir, key, &tokens[..b]).exists()).then_some(b)
    }

    /// Saves sequence 0, which holds exactly `self.kv`, to the folder.
    pub(crate) fn save_to_disk(&mut self) {
        let Some((cache, key)) = self.disk.clone() else {
            return;
        };
        if let Some(data) = self.ctx.state_seq_get(0) {
            save(&cache, &key, &self.kv, &data);
        }
    }
}

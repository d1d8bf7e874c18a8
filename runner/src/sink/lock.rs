//! One writer per CSV: an advisory lock (`flock`) on a hidden sidecar `.<csv name>.lock` that holds
//! the writer's pid, host and start time, so a second `bmoe run` on the same file is refused before
//! it writes anything and can say who holds it. The holder deletes the file when it is done (a
//! `shard-*` glob never takes it, and no stale text stays); the kernel drops the lock when the
//! holder exits, even on SIGKILL: a `.lock` file left behind by a dead process blocks nothing.
//!
//! Deleting a lock file is safe because a taker checks, once it holds the lock, that the path
//! still names the file it locked: one that locked a file deleted meanwhile starts over.
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::config::paths::display_path;

/// Why a CSV could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error("{csv} is being written by {holder}; wait for it to end, or write to another --csv (the lock is {lock})")]
    Busy {
        /// The CSV, as the user names it.
        csv: String,
        /// What the lock file says about its holder (`pid 1234 on host H (started ...)`).
        holder: String,
        /// The lock file.
        lock: String,
    },
    /// The lock file cannot be created or read.
    #[error("{lock}: {source} (the lock that keeps a second writer off {csv})")]
    Io {
        /// The CSV.
        csv: String,
        /// The lock file.
        lock: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The sidecar lock file of a CSV: `runs/x.csv` -> `runs/.x.csv.lock`.
pub fn lock_path(csv: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(csv.file_name().unwrap_or(csv.as_os_str()));
    name.push(".lock");
    csv.with_file_name(name)
}

/// Whether `path` is named as a lock file of [`lock_path`] (or an older build's `x.csv.lock`).
pub fn is_lock_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "lock")
}

/// Held locks; dropping this releases them and deletes their files (the process ending without
/// a drop releases them too, leaving the file).
#[derive(Debug, Default)]
pub struct CsvLocks {
    held: Vec<(PathBuf, File)>,
}

impl Drop for CsvLocks {
    fn drop(&mut self) {
        // Deleted while still locked: a taker waiting on this file finds it gone and starts over.
        for (path, _) in &self.held {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Whether the open file `f` is still the one `path` names (not deleted or replaced).
#[cfg(unix)]
fn still_named(f: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn still_named(_: &File, path: &Path) -> bool {
    path.exists()
}

impl CsvLocks {
    /// Takes the lock of `csv` unless this process already holds it; refuses when another
    /// process holds it.
    pub fn take(&mut self, csv: &Path, host: &str) -> Result<(), LockError> {
        let lock = lock_path(csv);
        if self.held.iter().any(|(p, _)| *p == lock) {
            return Ok(());
        }
        let io = |source| LockError::Io {
            csv: display_path(csv),
            lock: display_path(&lock),
            source,
        };
        if let Some(dir) = lock.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut tries = 0;
        let mut f = loop {
            // Never truncated on open: the holder's line must survive a refused second writer.
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&lock)
                .map_err(io)?;
            match f.try_lock() {
                // A file its holder deleted between our open and our lock: take the new one.
                Ok(()) if !still_named(&f, &lock) && tries < 100 => tries += 1,
                Ok(()) => break f,
                Err(TryLockError::WouldBlock) => return Err(busy(csv, &lock, &mut f)),
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
        };
        let started = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let line = format!(
            "pid {} on host {} (started {started})\n",
            std::process::id(),
            if host.is_empty() { "?" } else { host }
        );
        f.set_len(0).map_err(io)?;
        f.seek(SeekFrom::Start(0)).map_err(io)?;
        f.write_all(line.as_bytes()).map_err(io)?;
        f.flush().map_err(io)?;
        self.held.push((lock, f));
        Ok(())
    }
}

/// The refusal while another process holds the lock, with what its holder wrote.
fn busy(csv: &Path, lock: &Path, f: &mut File) -> LockError {
    let mut said = String::new();
    // What the holder wrote; a holder that has not written yet is still a holder.
    let _ = f.read_to_string(&mut said);
    let holder = match said.trim() {
        "" => "another process".to_string(),
        s => s.to_string(),
    };
    LockError::Busy {
        csv: display_path(csv),
        holder,
        lock: display_path(lock),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_with_the_first_ones_line_and_a_stale_file_blocks_nothing() {
        let d = tempfile::tempdir().unwrap();
        let csv = d.path().join("runs/x.csv");
        // A lock file left by a dead writer: its line is there, its flock is not.
        std::fs::create_dir_all(d.path().join("runs")).unwrap();
        std::fs::write(lock_path(&csv), "pid 999999 on host gone (started 2020)\n").unwrap();
        let mut a = CsvLocks::default();
        a.take(&csv, "h1").unwrap();
        a.take(&csv, "h1").unwrap();
        let said = std::fs::read_to_string(lock_path(&csv)).unwrap();
        assert!(said.starts_with(&format!("pid {} on host h1 (started ", std::process::id())));
        // flock belongs to the open file, so a second open in this process contends like
        // another process would.
        let mut b = CsvLocks::default();
        let e = b.take(&csv, "h2").unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "x.csv is being written by pid {} on host h1",
                std::process::id()
            )),
            "{e}"
        );
        drop(a);
        assert!(
            !lock_path(&csv).exists(),
            "the holder deletes its lock file"
        );
        b.take(&csv, "h2").unwrap();
        assert_eq!(lock_path(&csv), d.path().join("runs/.x.csv.lock"));
    }

    /// A lock taken on a file its holder then deleted is not a lock: the taker that opened it
    /// before the deletion starts over on the path's new file.
    #[test]
    fn a_deleted_lock_file_is_not_held() {
        let d = tempfile::tempdir().unwrap();
        let csv = d.path().join("x.csv");
        let mut a = CsvLocks::default();
        a.take(&csv, "h1").unwrap();
        let old = File::open(lock_path(&csv)).unwrap();
        drop(a);
        old.try_lock().unwrap();
        assert!(!still_named(&old, &lock_path(&csv)));
        let mut b = CsvLocks::default();
        b.take(&csv, "h2").unwrap();
        let mut c = CsvLocks::default();
        assert!(c.take(&csv, "h3").is_err(), "b holds the path's file");
    }
}

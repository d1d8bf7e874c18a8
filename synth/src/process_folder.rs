//! The folder one process's tests share their synthetic models in, swept of the folders of
//! processes that are gone.
//!
//! A test binary keeps the models its tests share in a static, and a static is never dropped: a
//! temporary folder made for it outlives the run. They added up to 560 folders and 19 GiB in the
//! machine's temporary folder, until a CI run there stopped with "No space left on device". A
//! folder named for the process can be told stale by the next run, which removes it.
use std::io;
use std::path::{Path, PathBuf};

/// The prefix of a process folder's name; the process id follows it.
const PREFIX: &str = "bmoe-fixtures-";

/// Makes (empty) the folder for this process under `root` and removes those of processes that no
/// longer run. Where `/proc` is missing (not Linux), nothing is swept: without it a live process
/// cannot be told from a dead one.
pub fn process_folder(root: &Path) -> io::Result<PathBuf> {
    let me = std::process::id();
    if Path::new("/proc/self").exists() {
        sweep(root, me)?;
    }
    let dir = root.join(format!("{PREFIX}{me}"));
    // A folder under our own id is a dead process's whose id the kernel gave us again.
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Removes every process folder under `root` but `me`'s whose process is gone.
fn sweep(root: &Path, me: u32) -> io::Result<()> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != me && !Path::new("/proc").join(pid.to_string()).exists() {
            // Another process may be sweeping the same folder at the same moment: losing that
            // race is not an error.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_process_folder_is_removed_and_a_live_one_and_others_kept() {
        let root = std::env::temp_dir().join(format!("bmoe-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // pid_max is at most 2^22 on Linux: no process has this id.
        let dead = root.join(format!("{PREFIX}{}", u32::MAX - 1));
        // Process 1 (init) always runs.
        let live = root.join(format!("{PREFIX}1"));
        let other = root.join("bmoe-fixtures-notapid");
        for d in [&dead, &live, &other] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("m.gguf"), b"x").unwrap();
        }
        let mine = process_folder(&root).unwrap();
        assert!(mine.is_dir());
        assert!(!dead.exists(), "a dead process's folder stayed");
        assert!(live.exists(), "a live process's folder was removed");
        assert!(
            other.exists(),
            "a folder not named for a process was removed"
        );
        std::fs::write(mine.join("m.gguf"), b"x").unwrap();
        // Made again (our id reused): empty.
        let again = process_folder(&root).unwrap();
        assert_eq!(again, mine);
        assert_eq!(std::fs::read_dir(&again).unwrap().count(), 0);
        std::fs::remove_dir_all(&root).unwrap();
    }
}

//! A cgroup v1 memory group of a test's own: real memory caps, page cache included.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::clean_env;

/// A cgroup v1 memory group of the test's own, emptied (SIGKILL) and removed on drop.
pub struct Group(PathBuf);

impl Group {
    /// A group with `limit` bytes, or `None` where this machine cannot make one (not root, no
    /// cgroup v1 memory controller).
    pub fn new(name: &str, limit: u64) -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup/memory");
        let dir = root.join(format!("bmoe-test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let g = Group(dir);
        std::fs::write(g.0.join("memory.limit_in_bytes"), limit.to_string()).ok()?;
        Some(g)
    }

    /// `program args` started inside the group (the shell joins it, then becomes the program);
    /// `victim`: the OOM killer's first choice (raising the score needs no privilege).
    pub fn spawn(&self, cwd: &Path, victim: bool, program: &str, args: &[&str]) -> Command {
        let adj = if victim {
            "echo 1000 > /proc/self/oom_score_adj && "
        } else {
            ""
        };
        let script = format!(
            "echo $$ > {} && {adj}exec \"$0\" \"$@\"",
            self.0.join("cgroup.procs").display()
        );
        let mut c = Command::new("sh");
        clean_env(&mut c);
        c.current_dir(cwd)
            .env("XDG_CACHE_HOME", cwd.join(".cache"))
            .arg("-c")
            .arg(script)
            .arg(program)
            .args(args);
        c
    }

    pub fn pids(&self) -> Vec<String> {
        std::fs::read_to_string(self.0.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    /// The kernel's count of OOM kills in the group (`oom_kill` of `memory.oom_control`).
    pub fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.0.join("memory.oom_control"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            let _ = Command::new("kill").arg("-9").args(&pids).status();
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

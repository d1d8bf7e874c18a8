//! A memory cgroup per limited point (`memory_limit`): found (v1 or v2), made with its limit and
//! no swap, joined by the point's child, read for its peak and OOM kills, and removed.
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the machine's memory cgroups are made.
pub const V1_ROOT: &str = "/sys/fs/cgroup/memory";
/// The unified (v2) hierarchy's mount point.
pub const V2_MOUNT: &str = "/sys/fs/cgroup";

/// Why a memory cgroup cannot be made or used.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Neither a v1 memory controller nor a v2 hierarchy.
    #[error(
        "this machine has no memory cgroup controller (no {V1_ROOT}, no cgroup v2 at {V2_MOUNT})"
    )]
    NoController,
    /// A v2 folder whose `cgroup.subtree_control` does not hand the memory controller down.
    #[error("cgroup v2 at {}: its cgroup.subtree_control lacks `memory`, so a child group cannot be limited (the memory controller must be delegated to it)", .0.display())]
    NotDelegated(PathBuf),
    /// A file of the hierarchy that could not be made, written or read.
    #[error("{what} {}: {source} (a memory cgroup needs root or a delegated cgroup)", .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
}

/// The cgroup version of a hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The v1 memory controller's own hierarchy.
    V1,
    /// The unified hierarchy.
    V2,
}

/// A folder in which memory groups are made.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    /// The folder (the v1 memory root, or the v2 group this process is in).
    pub dir: PathBuf,
    /// Its version.
    pub version: Version,
}

/// The version of the hierarchy `dir` belongs to: v2 folders have `cgroup.controllers`.
fn version_of(dir: &Path) -> Version {
    if dir.join("cgroup.controllers").exists() {
        Version::V2
    } else {
        Version::V1
    }
}

/// This process's own v2 group (the `0::` line of `/proc/self/cgroup`).
fn own_v2_group() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new(V2_MOUNT).join(rel.trim_start_matches('/')))
}

impl Hierarchy {
    /// Where memory groups are made: `root` when given (`BMOE_CGROUP_ROOT`), else the v1 memory
    /// root, else this process's v2 group, which must delegate the memory controller.
    pub fn find(root: Option<&Path>) -> Result<Self, CgroupError> {
        let h = match root {
            Some(dir) => Hierarchy {
                dir: dir.to_path_buf(),
                version: version_of(dir),
            },
            None if Path::new(V1_ROOT).join("memory.limit_in_bytes").exists() => Hierarchy {
                dir: V1_ROOT.into(),
                version: Version::V1,
            },
            None => match own_v2_group() {
                Some(dir) if dir.join("cgroup.controllers").exists() => Hierarchy {
                    dir,
                    version: Version::V2,
                },
                _ => return Err(CgroupError::NoController),
            },
        };
        if h.version == Version::V2 {
            let control = h.dir.join("cgroup.subtree_control");
            let text = std::fs::read_to_string(&control).unwrap_or_default();
            if !text.split_whitespace().any(|c| c == "memory") {
                return Err(CgroupError::NotDelegated(h.dir));
            }
        }
        Ok(h)
    }

    /// Makes a group and removes it again: whether limited points can run here at all.
    pub fn check(&self) -> Result<(), CgroupError> {
        let name = format!("bmoe-{}-check", std::process::id());
        self.create(&name, 64 << 20).map(drop)
    }

    /// A new group `name` limited to `bytes`, page cache included, with no swap.
    pub fn create(&self, name: &str, bytes: u64) -> Result<MemoryGroup, CgroupError> {
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir).map_err(|source| CgroupError::Io {
            what: "making the memory cgroup",
            path: dir.clone(),
            source,
        })?;
        // Removed on drop, also when setting it up fails below.
        let g = MemoryGroup {
            dir,
            version: self.version,
        };
        let limit = bytes.to_string();
        match self.version {
            Version::V1 => {
                g.write("memory.limit_in_bytes", &limit)?;
                // Memory plus swap at the same limit: nothing is swapped out to make room.
                if g.dir.join("memory.memsw.limit_in_bytes").exists() {
                    g.write("memory.memsw.limit_in_bytes", &limit)?;
                }
                g.write("memory.swappiness", "0")?;
            }
            Version::V2 => {
                g.write("memory.max", &limit)?;
                if g.dir.join("memory.swap.max").exists() {
                    g.write("memory.swap.max", "0")?;
                }
            }
        }
        Ok(g)
    }
}

/// A memory group of one point, removed when dropped (once its processes are gone).
#[derive(Debug)]
pub struct MemoryGroup {
    dir: PathBuf,
    version: Version,
}

impl MemoryGroup {
    /// Writes `value` into the group's `file`.
    fn write(&self, file: &str, value: &str) -> Result<(), CgroupError> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|source| CgroupError::Io {
            what: "writing",
            path,
            source,
        })
    }

    /// The group's `file`, or "" when it cannot be read.
    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Moves process `pid` into the group: what it allocates and reads from now on is charged
    /// to the group.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// The group's peak usage in bytes, page cache included (v2 `memory.peak` needs Linux 5.19).
    pub fn peak_bytes(&self) -> Option<u64> {
        let file = match self.version {
            Version::V1 => "memory.max_usage_in_bytes",
            Version::V2 => "memory.peak",
        };
        self.read(file).trim().parse().ok()
    }

    /// Whether the kernel's OOM killer acted in the group (v1 `memory.oom_control`'s `oom_kill`
    /// or `under_oom`, v2 `memory.events`' `oom_kill`).
    pub fn oom_killed(&self) -> bool {
        let (file, keys): (&str, &[&str]) = match self.version {
            Version::V1 => ("memory.oom_control", &["oom_kill ", "under_oom "]),
            Version::V2 => ("memory.events", &["oom_kill "]),
        };
        self.read(file).lines().any(|l| {
            keys.iter()
                .filter_map(|k| l.strip_prefix(k))
                .any(|v| v.trim().parse::<u64>().is_ok_and(|n| n > 0))
        })
    }
}

impl Drop for MemoryGroup {
    fn drop(&mut self) {
        // The last process's exit is seen a moment after its wait returns: retry while busy.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "bmoe: could not remove the memory cgroup {}",
            self.dir.display()
        );
    }
}

//! How much memory is available: the smaller of the kernel's `MemAvailable` and what the cgroup
//! (v1 or v2) still allows, page cache included.
use std::fs;

fn meminfo_available() -> Option<u64> {
    let s = fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn read_u64(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn cgroup_headroom() -> Option<u64> {
    let groups = fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let base = format!("/sys/fs/cgroup/memory{path}");
            let limit = read_u64(&format!("{base}/memory.limit_in_bytes"))?;
            // Page cache counts toward the cap but can be reclaimed: count only anonymous memory.
            let stat = fs::read_to_string(format!("{base}/memory.stat")).unwrap_or_default();
            let rss = stat
                .lines()
                .find_map(|l| l.strip_prefix("total_rss "))
                .and_then(|v| v.trim().parse().ok());
            let usage = rss.or_else(|| read_u64(&format!("{base}/memory.usage_in_bytes")))?;
            // An unlimited v1 group reports a huge number.
            return (limit < (1u64 << 60)).then(|| limit.saturating_sub(usage));
        }
        if controllers.is_empty() {
            let base = format!("/sys/fs/cgroup{path}");
            let max = fs::read_to_string(format!("{base}/memory.max")).ok()?;
            let limit: u64 = max.trim().parse().ok()?;
            let usage = read_u64(&format!("{base}/memory.current"))?;
            return Some(limit.saturating_sub(usage));
        }
    }
    None
}

/// Bytes this process could still use without being reclaimed or killed.
pub fn available_bytes() -> u64 {
    let (machine, group) = available_split();
    group.map_or(machine, |g| g.min(machine))
}

/// The machine's `MemAvailable` and, inside a memory-limited cgroup, the group's headroom.
pub fn available_split() -> (u64, Option<u64>) {
    (meminfo_available().unwrap_or(0), cgroup_headroom())
}

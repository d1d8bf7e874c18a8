//! `bmoe profile measure`: the machine bmoe runs on, measured rather than typed in (RAM, cores and
//! their frequencies, page size, kernel, whether page moves work, the storage's O_DIRECT random
//! read rate at an expert slice's size, what can be seen of a Hexagon NPU), written as a profile.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bmoe_engine::io::DirectReader;

use crate::config::profile::Measured;
use crate::placement::cores::{read_topology, SYSFS_CPU};

/// How one measurement run reads the storage.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    /// The file read (an existing model, or a scratch file written first).
    pub file: PathBuf,
    /// Bytes per read.
    pub read_bytes: usize,
    /// Time spent at each number of reads in flight.
    pub per_depth: Duration,
}

/// Everything measured, with how each value was found.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// The `[measured]` table.
    pub measured: Measured,
    /// MemTotal, MiB.
    pub ram_total_mb: u64,
    /// `/sys/devices/soc0/machine` (the SoC's name), empty when absent.
    pub soc_name: String,
    /// Whether the reads really bypassed the page cache (O_DIRECT accepted by the file system).
    pub direct: bool,
}

/// A `/proc/meminfo` value in MiB.
fn meminfo_mb(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024)
}

/// The page size from the first mapping of /proc/self/smaps (`KernelPageSize`), in bytes.
fn page_size() -> u64 {
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("KernelPageSize:"))?;
            l["KernelPageSize:".len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(4096, |kib| kib * 1024)
}

/// A one-line sysfs or procfs value, trimmed; empty when absent.
fn read_line(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The Hexagon NPU's user-space access points that exist here (FastRPC device nodes, the CDSP
/// RPC library in the places Android keeps it).
fn npu_seen() -> Vec<String> {
    let mut seen: Vec<String> = std::fs::read_dir("/dev")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with("fastrpc-"))
                .map(|n| format!("/dev/{n}"))
                .collect()
        })
        .unwrap_or_default();
    for dir in [
        "/vendor/lib64",
        "/system/lib64",
        "/system/vendor/lib64",
        "/usr/lib",
    ] {
        let p = Path::new(dir).join("libcdsprpc.so");
        if p.exists() {
            seen.push(p.display().to_string());
        }
    }
    seen.sort();
    seen
}

/// Writes a scratch file of `bytes` for the read test (fsync'd, so the O_DIRECT reads meet the
/// storage and not dirty pages).
pub fn write_scratch(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![0xA5u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

/// MiB/s of random aligned reads of `plan.read_bytes` with `depth` reads in flight (one thread
/// per read, each on its own reader lane), over `plan.per_depth`; 0 where no read completed.
fn read_rate(reader: &Arc<DirectReader>, plan: &ReadPlan, size: u64, depth: usize) -> f64 {
    bmoe_engine::io::random_read_rate(reader, plan.read_bytes, size, depth, plan.per_depth)
        .unwrap_or(0.0)
}

/// Measures this machine; `plan` says what file the storage test reads.
pub fn measure(plan: &ReadPlan) -> anyhow::Result<Measurement> {
    use anyhow::Context;
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    let cores = read_topology(Path::new(SYSFS_CPU), bmoe_engine::process_cpus());
    let size = std::fs::metadata(&plan.file)
        .with_context(|| format!("reading the size of {}", plan.file.display()))?
        .len();
    anyhow::ensure!(
        size >= plan.read_bytes as u64,
        "{} is smaller than one read ({} bytes)",
        plan.file.display(),
        plan.read_bytes
    );
    let depths = Measured::IN_FLIGHT;
    let reader = Arc::new(
        DirectReader::open(
            std::slice::from_ref(&plan.file),
            depths[depths.len() - 1],
            plan.read_bytes,
        )
        .with_context(|| format!("opening {} for O_DIRECT reads", plan.file.display()))?,
    );
    let direct = reader.direct().first().copied().unwrap_or(false);
    let read_mib_s = depths
        .iter()
        .map(|&d| (read_rate(&reader, plan, size, d) * 10.0).round() / 10.0)
        .collect();
    let measured = Measured {
        by: format!("bmoe {} on {}", env!("CARGO_PKG_VERSION"), humantime_now()),
        ram_available_mb: meminfo_mb(&meminfo, "MemAvailable:").unwrap_or(0),
        core_max_mhz: cores
            .iter()
            .map(|c| c.max_khz.unwrap_or(0) / 1000)
            .collect(),
        page_size: page_size(),
        kernel: read_line("/proc/sys/kernel/osrelease"),
        page_moves: match bmoe_engine::page_moves() {
            bmoe_engine::PageMoves::Move => "move".into(),
            bmoe_engine::PageMoves::Release(_) => "release".into(),
        },
        read_kib: (plan.read_bytes / 1024) as u64,
        read_mib_s,
        npu_seen: npu_seen(),
        soc_id: read_line("/sys/devices/soc0/soc_id"),
    };
    Ok(Measurement {
        measured,
        ram_total_mb: meminfo_mb(&meminfo, "MemTotal:").unwrap_or(0),
        soc_name: read_line("/sys/devices/soc0/machine"),
        direct,
    })
}

/// The current UTC time, RFC 3339, seconds.
fn humantime_now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The profile TOML for `m`, named `name`, each measured value with a comment saying how it was
/// measured. The `[engine]` values follow from the measurement (reader lanes at the best rate).
pub fn profile_toml(name: &str, m: &Measurement, plan: &ReadPlan) -> String {
    let x = &m.measured;
    let (best_depth, best_rate) = x.best_read().unwrap_or((4, 0.0));
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut t = String::new();
    t.push_str("#:schema ../schemas/profile.schema.json\n");
    t.push_str(&format!(
        "# Written by `bmoe profile measure` ({}).\n",
        x.by
    ));
    t.push_str(&format!("name = {}\n", q(name)));
    t.push_str(&format!(
        "description = {}\n",
        q(&format!("measured by bmoe profile measure on {}", x.by))
    ));
    t.push_str("# /sys/devices/soc0/machine (empty: the kernel has no soc0).\n");
    t.push_str(&format!("soc = {}\n", q(&m.soc_name)));
    t.push_str(
        "# Not measured: the Hexagon generation cannot be read from user space; set it by hand.\n",
    );
    t.push_str("hexagon = \"none\"\n");
    t.push_str("# MemTotal of /proc/meminfo.\n");
    t.push_str(&format!("ram_mb = {}\n", m.ram_total_mb.max(256)));
    t.push_str(&format!(
        "storage = {}\n\n",
        q(&format!(
            "{:.0} MiB/s O_DIRECT random {} KiB reads, {} in flight",
            best_rate, x.read_kib, best_depth
        ))
    ));
    t.push_str("[engine]\n");
    t.push_str(&format!(
        "# The reads in flight that measured fastest below (1, 2, 4 or 8).\nio_threads = {best_depth}\n\n"
    ));
    t.push_str("[measured]\n");
    t.push_str(&format!("by = {}\n", q(&x.by)));
    t.push_str("# MemAvailable of /proc/meminfo at the time.\n");
    t.push_str(&format!("ram_available_mb = {}\n", x.ram_available_mb));
    t.push_str("# cpufreq/cpuinfo_max_freq of each usable CPU under /sys/devices/system/cpu, MHz (0 = not given).\n");
    t.push_str(&format!("core_max_mhz = {:?}\n", x.core_max_mhz));
    t.push_str("# KernelPageSize of /proc/self/smaps.\n");
    t.push_str(&format!("page_size = {}\n", x.page_size));
    t.push_str("# /proc/sys/kernel/osrelease.\n");
    t.push_str(&format!("kernel = {}\n", q(&x.kernel)));
    t.push_str("# The engine's self-check: a page moved with mremap(MREMAP_DONTUNMAP), then read() into the range it left.\n");
    t.push_str(&format!("page_moves = {}\n", q(&x.page_moves)));
    t.push_str(&format!(
        "# Random aligned reads of {} bytes of {}{}, {:.1} s at each count of reads in flight (1, 2, 4, 8).\n",
        plan.read_bytes,
        plan.file.display(),
        if m.direct {
            " with O_DIRECT"
        } else {
            " (O_DIRECT refused by the file system: buffered reads, the page cache may inflate them)"
        },
        plan.per_depth.as_secs_f64()
    ));
    t.push_str(&format!("read_kib = {}\n", x.read_kib));
    t.push_str(&format!("read_mib_s = {:?}\n", x.read_mib_s));
    t.push_str("# /dev/fastrpc-* and libcdsprpc.so found (the Hexagon NPU's user-space access).\n");
    t.push_str(&format!("npu_seen = {:?}\n", x.npu_seen));
    t.push_str("# /sys/devices/soc0/soc_id.\n");
    t.push_str(&format!("soc_id = {}\n", q(&x.soc_id)));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_values_are_read_in_mib() {
        let t = "MemTotal:       24576000 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(meminfo_mb(t, "MemTotal:"), Some(24000));
        assert_eq!(meminfo_mb(t, "MemAvailable:"), Some(20000));
        assert_eq!(meminfo_mb(t, "SwapTotal:"), None);
    }
}

//! The machine's CPU topology from sysfs (`/sys/devices/system/cpu`): which cores are online and
//! each one's maximum frequency, and the choice `cpus = "auto"` makes from them: the fast cores,
//! where compute threads do not wait at every ggml barrier for an efficiency core.
use std::path::Path;

/// A core is "fast" when its maximum frequency is at least this share of the fastest core's: the
/// prime and performance clusters of a phone (8 Gen 3: 3.3, 3.2, 3.0 GHz kept, 2.3 GHz left out;
/// 8 Elite: 4.32 and 3.53 GHz both kept), every core of a machine whose cores are alike.
const FAST_SHARE: f64 = 0.8;

/// One online core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Core {
    /// Its number (`cpuN`).
    pub id: u32,
    /// `cpufreq/cpuinfo_max_freq`, kHz; `None` where the kernel has no cpufreq for it.
    pub max_khz: Option<u64>,
}

/// The online cores under `root` (`/` on a live machine; a recorded tree in tests).
pub fn read_cores(root: &Path) -> std::io::Result<Vec<Core>> {
    let cpu = root.join("sys/devices/system/cpu");
    let cpu = if cpu.exists() {
        cpu
    } else {
        root.join("devices/system/cpu")
    };
    let online = std::fs::read_to_string(cpu.join("online"))?;
    let ids = parse_cpu_list(&online).ok_or_else(|| {
        std::io::Error::other(format!(
            "{}: expected a CPU list like 0-7, found {:?}",
            cpu.join("online").display(),
            online.trim()
        ))
    })?;
    Ok(ids
        .into_iter()
        .map(|id| Core {
            id,
            max_khz: std::fs::read_to_string(cpu.join(format!("cpu{id}/cpufreq/cpuinfo_max_freq")))
                .ok()
                .and_then(|s| s.trim().parse().ok()),
        })
        .collect())
}

/// A kernel CPU list (`0-3,6,8-9`), in order; `None` when it is not one.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?);
                if b < a {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The cores `cpus = "auto"` puts compute threads on, with the reason in words: those within
/// `FAST_SHARE` of the fastest maximum frequency; every core when frequencies are unknown.
pub fn fast_cores(cores: &[Core]) -> (Vec<u32>, String) {
    let Some(top) = cores.iter().filter_map(|c| c.max_khz).max() else {
        return (
            cores.iter().map(|c| c.id).collect(),
            "no cpufreq: every online core".into(),
        );
    };
    let floor = (top as f64 * FAST_SHARE) as u64;
    let fast: Vec<u32> = cores
        .iter()
        .filter(|c| c.max_khz.is_some_and(|k| k >= floor))
        .map(|c| c.id)
        .collect();
    let why = format!(
        "{} of {} cores reach {:.2} GHz or more ({:.0}% of the fastest, {:.2} GHz)",
        fast.len(),
        cores.len(),
        floor as f64 / 1e6,
        FAST_SHARE * 100.0,
        top as f64 / 1e6
    );
    (fast, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs")
            .join(name)
    }

    #[test]
    fn snapdragon_8_gen_3_leaves_out_the_a520s() {
        let cores = read_cores(&fixture("sd8gen3")).unwrap();
        assert_eq!(cores.len(), 8);
        assert_eq!(cores[7].max_khz, Some(3_300_000));
        let (fast, why) = fast_cores(&cores);
        assert_eq!(fast, vec![2, 3, 4, 5, 6, 7], "{why}");
        assert!(why.starts_with("6 of 8 cores"), "{why}");
    }

    #[test]
    fn snapdragon_8_elite_keeps_every_oryon_core() {
        let cores = read_cores(&fixture("sd8elite")).unwrap();
        assert_eq!(cores.len(), 8);
        assert_eq!(cores[6].max_khz, Some(4_320_000));
        assert_eq!(fast_cores(&cores).0, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(
            parse_cpu_list("0-3,6,8-9\n"),
            Some(vec![0, 1, 2, 3, 6, 8, 9])
        );
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a-b"), None);
    }

    #[test]
    fn without_cpufreq_every_core_is_used() {
        let cores = [
            Core {
                id: 0,
                max_khz: None,
            },
            Core {
                id: 1,
                max_khz: None,
            },
        ];
        assert_eq!(fast_cores(&cores).0, vec![0, 1]);
    }

    /// This machine's own tree reads (whatever its layout).
    #[test]
    fn this_machine_reads() {
        let cores = read_cores(Path::new("/")).unwrap();
        assert!(!cores.is_empty());
        assert!(!fast_cores(&cores).0.is_empty());
    }
}

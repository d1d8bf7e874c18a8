//! Which cores the compute threads run on: the `cpus` setting resolved against this machine's
//! CPU topology (`/sys/devices/system/cpu`). On a phone the cores differ: a compute thread on an
//! efficiency core holds every ggml barrier, so `auto` keeps compute on the fast cores and gives
//! the others to the reader and loader threads.
use std::path::Path;

use crate::config::cpus::{cpulist, parse_cpulist, Cpus};

/// Where `auto` looks for the topology.
pub const SYSFS_CPU: &str = "/sys/devices/system/cpu";

/// A core counts as fast when its maximum frequency is at least this share of the fastest
/// core's. Phones' efficiency cores run at 0.55-0.70 of the prime core (Snapdragon 888: 1.80 of
/// 2.84 GHz; 8 Gen 3: 2.27 of 3.30), their performance cores at 0.80 or more (8 Gen 3: 2.96 of
/// 3.30; 8 Elite: 3.53 of 4.32).
const FAST_SHARE: f64 = 0.75;

/// One CPU of this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Core {
    /// Its number.
    pub id: usize,
    /// `cpufreq/cpuinfo_max_freq` in kHz, where the kernel exposes it.
    pub max_khz: Option<u64>,
}

/// The CPUs of a sysfs tree (`root` = `/sys/devices/system/cpu`) that are online and in
/// `allowed` (the process's affinity), with their maximum frequencies.
pub fn read_topology(root: &Path, allowed: &[usize]) -> Vec<Core> {
    let online = std::fs::read_to_string(root.join("online"))
        .ok()
        .and_then(|s| parse_cpulist(s.trim()).ok());
    allowed
        .iter()
        .copied()
        .filter(|c| online.as_ref().is_none_or(|o| o.contains(c)))
        .map(|id| Core {
            id,
            max_khz: std::fs::read_to_string(
                root.join(format!("cpu{id}/cpufreq/cpuinfo_max_freq")),
            )
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        })
        .collect()
}

/// Resolves `cpus` against this machine: its sysfs topology and this process's CPU affinity.
pub fn this_machine(cpus: &Cpus) -> Result<CoreChoice, String> {
    choose(
        &read_topology(Path::new(SYSFS_CPU), bmoe_engine::process_cpus()),
        cpus,
    )
}

/// Where compute threads and the helper threads (readers, loaders) run, and why.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CoreChoice {
    /// CPUs the compute threads are pinned to (empty = not pinned).
    pub compute: Vec<usize>,
    /// CPUs the reader and loader threads are pinned to (empty = not pinned).
    pub helpers: Vec<usize>,
    /// One line saying how the choice was made.
    pub why: String,
}

/// Resolves `cpus` against `cores` (this machine's usable CPUs).
pub fn choose(cores: &[Core], cpus: &Cpus) -> Result<CoreChoice, String> {
    let ids: Vec<usize> = cores.iter().map(|c| c.id).collect();
    let compute = match cpus {
        Cpus::List(l) => {
            let missing: Vec<usize> = l.iter().copied().filter(|c| !ids.contains(c)).collect();
            if !missing.is_empty() {
                return Err(format!(
                    "cpus = \"{}\": CPU {} is not one this process may use here (usable: {})",
                    cpulist(l),
                    cpulist(&missing),
                    cpulist(&ids)
                ));
            }
            let why = format!("cpus = \"{}\" (as set)", cpulist(l));
            return Ok(with_helpers(l.clone(), &ids, why));
        }
        Cpus::Auto => fast_cores(cores),
    };
    match compute {
        Ok((fast, why)) => Ok(with_helpers(fast, &ids, why)),
        Err(why) => Ok(CoreChoice {
            why,
            ..CoreChoice::default()
        }),
    }
}

/// The helpers get the usable CPUs the compute threads do not (none left: not pinned).
fn with_helpers(compute: Vec<usize>, ids: &[usize], why: String) -> CoreChoice {
    let helpers = ids
        .iter()
        .copied()
        .filter(|c| !compute.contains(c))
        .collect();
    CoreChoice {
        compute,
        helpers,
        why,
    }
}

/// `auto`: the fast cores and why, or why nothing is pinned.
fn fast_cores(cores: &[Core]) -> Result<(Vec<usize>, String), String> {
    let known: Vec<(usize, u64)> = cores
        .iter()
        .filter_map(|c| Some((c.id, c.max_khz?)))
        .collect();
    if known.len() < cores.len() || known.is_empty() {
        return Err("cpus = auto: not pinned (the kernel does not give every core's maximum frequency under /sys/devices/system/cpu)".into());
    }
    let top = known.iter().map(|k| k.1).max().unwrap_or(0);
    let low = known.iter().map(|k| k.1).min().unwrap_or(0);
    if (low as f64) >= FAST_SHARE * top as f64 {
        return Err(format!(
            "cpus = auto: not pinned ({} cores, all within {:.0}% of the fastest's {:.2} GHz)",
            known.len(),
            100.0 * FAST_SHARE,
            top as f64 / 1e6
        ));
    }
    let fast: Vec<usize> = known
        .iter()
        .filter(|k| k.1 as f64 >= FAST_SHARE * top as f64)
        .map(|k| k.0)
        .collect();
    let why = format!(
        "cpus = auto: the {} cores at {:.0}% or more of the fastest's {:.2} GHz; {} slower ones (down to {:.2} GHz) left to readers and loaders",
        fast.len(),
        100.0 * FAST_SHARE,
        top as f64 / 1e6,
        known.len() - fast.len(),
        low as f64 / 1e6
    );
    Ok((fast, why))
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
    fn snapdragon_8_gen_3_computes_on_its_six_big_cores() {
        let cores = read_topology(&fixture("snapdragon-8-gen-3"), &(0..8).collect::<Vec<_>>());
        assert_eq!(cores.len(), 8);
        assert_eq!(cores[7].max_khz, Some(3_302_400));
        let c = choose(&cores, &Cpus::Auto).unwrap();
        assert_eq!(c.compute, vec![2, 3, 4, 5, 6, 7]);
        assert_eq!(c.helpers, vec![0, 1]);
        assert!(
            c.why.contains("6 cores") && c.why.contains("3.30 GHz"),
            "{}",
            c.why
        );
    }

    #[test]
    fn snapdragon_8_elite_has_no_slow_cores() {
        let cores = read_topology(&fixture("snapdragon-8-elite"), &(0..8).collect::<Vec<_>>());
        let c = choose(&cores, &Cpus::Auto).unwrap();
        assert_eq!(c.compute, Vec::<usize>::new());
        assert!(
            c.why.contains("not pinned") && c.why.contains("4.32 GHz"),
            "{}",
            c.why
        );
    }

    #[test]
    fn offline_and_disallowed_cores_are_left_out() {
        // The fixture's `online` file lists 0-7; the process may use only 0-5.
        let cores = read_topology(&fixture("snapdragon-8-gen-3"), &[0, 1, 2, 3, 4, 5, 9]);
        assert_eq!(
            cores.iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4, 5]
        );
        let c = choose(&cores, &Cpus::Auto).unwrap();
        assert_eq!((c.compute, c.helpers), (vec![2, 3, 4, 5], vec![0, 1]));
    }

    #[test]
    fn a_list_is_taken_as_set_or_refused_by_name() {
        let cores = read_topology(&fixture("snapdragon-8-gen-3"), &(0..8).collect::<Vec<_>>());
        let c = choose(&cores, &"7+2-3".parse().unwrap()).unwrap();
        assert_eq!((c.compute, c.helpers), (vec![2, 3, 7], vec![0, 1, 4, 5, 6]));
        let e = choose(&cores, &Cpus::List(vec![6, 8, 9])).unwrap_err();
        assert!(
            e.contains("CPU 8-9 is not") && e.contains("usable: 0-7"),
            "{e}"
        );
    }

    #[test]
    fn no_frequencies_no_pinning() {
        let cores = read_topology(Path::new("/nonexistent"), &[0, 1]);
        let c = choose(&cores, &Cpus::Auto).unwrap();
        assert!(c.compute.is_empty() && c.helpers.is_empty());
        assert!(c.why.contains("maximum frequency"), "{}", c.why);
    }
}

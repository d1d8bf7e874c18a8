//! The plan of a load, before it happens: the prefill device (or why the CPU prefills), the
//! memory budget (KV cache, compute buffers, dense weights, arena slots) against the memory
//! planned for, and the expert cache `cache_mb = "auto"` makes of what is left. Reads only the
//! GGUF header. The runner plans against a profile's RAM, the one-shot commands and
//! [`crate::Model::load`] against this machine's available memory: one formula for all three.
mod budget;
mod dims;

pub use budget::BudgetLine;
pub use dims::ModelDims;

use budget::MIB;

use crate::error::Result;
use crate::options::{LoadOptions, SessionOptions};

/// The memory a plan is made for: RAM and the floor kept free (`cache_floor_mb`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory {
    /// RAM in MiB: a profile's `ram_mb`, or what this machine has available.
    pub ram_mib: f64,
    /// MiB kept free for everything else.
    pub floor_mib: f64,
}

impl Memory {
    /// A profile's RAM and floor.
    pub fn ram(ram_mb: u64, floor_mb: u64) -> Self {
        Memory {
            ram_mib: ram_mb as f64,
            floor_mib: floor_mb as f64,
        }
    }

    /// What this machine (its cgroup included) has available now, and the floor.
    pub fn this_machine(floor_mb: u64) -> Self {
        let (machine, group) = crate::stream::memory::available_split();
        Self::split(
            machine as f64 / MIB,
            group.map(|g| g as f64 / MIB),
            floor_mb as f64,
        )
    }

    /// The floor leaves memory to the other apps on the machine. A memory cgroup's limit is
    /// already what this process was given: other apps live outside it, so where the group is
    /// tighter than the machine less its floor, the group's headroom is planned for, less an
    /// eighth of it (or the floor, if smaller) for what the plan does not count and the group
    /// still holds: the program's own code pages and the page cache's working room. A 1.2 GiB
    /// group would otherwise lose 1 GiB to the default floor and leave the expert cache nothing;
    /// with no slack at all the cache took 745 MiB of it and decode fell from 0.88 to 0.35
    /// tok/s, the dense weights' pages evicted and read again every token (bench10).
    fn split(machine_mib: f64, group_mib: Option<f64>, floor_mib: f64) -> Self {
        match group_mib {
            Some(g) if g < machine_mib - floor_mib => Memory {
                ram_mib: g,
                floor_mib: floor_mib.min(g / 8.0),
            },
            _ => Memory {
                ram_mib: machine_mib,
                floor_mib,
            },
        }
    }
}

/// Where prefill runs, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillPlace {
    /// The device kept, or `None` for the CPU.
    pub device: Option<String>,
    /// Why, in words.
    pub reason: String,
    /// Why the CPU runs prefill, when it does (the `reason` without its `CPU (...)` frame).
    pub cpu_because: Option<String>,
}

impl PrefillPlace {
    /// Prefill on the CPU, for this reason.
    pub fn on_cpu(why: String) -> Self {
        PrefillPlace {
            device: None,
            reason: format!("CPU ({why})"),
            cpu_because: Some(why),
        }
    }

    /// The prefill device `load` names, resolved ([`PrefillPlace::resolve`]), or the CPU.
    pub fn of(load: &LoadOptions) -> Self {
        match &load.prefill {
            Some(p) => PrefillPlace::resolve(&p.device),
            None => PrefillPlace::on_cpu("no prefill device configured".into()),
        }
    }

    /// The device named, resolved as [`crate::Model::load`] resolves it: in this build's
    /// registry, not the CPU, and it opens; else the CPU and why.
    pub fn resolve(name: &str) -> Self {
        match crate::device::resolve(name) {
            crate::device::Resolution::Cpu(why) => PrefillPlace::on_cpu(why),
            crate::device::Resolution::Device(d, name) => {
                let info = d.info();
                PrefillPlace {
                    reason: format!(
                        "{name} ({}, {}); a device that fails to open leaves the run on the CPU",
                        info.description, info.backend
                    ),
                    device: Some(name),
                    cpu_because: None,
                }
            }
        }
    }
}

/// The plan of one load.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Model shape.
    pub dims: ModelDims,
    /// Prefill device.
    pub prefill: PrefillPlace,
    /// Context size that will be used.
    pub n_ctx: u64,
    /// The budget lines, the expert cache last.
    pub budget: Vec<BudgetLine>,
    /// Expert cache in MiB (after `auto`).
    pub cache_mb: u64,
    /// RAM minus the floor.
    pub available_mib: f64,
    /// RAM planned for.
    pub ram_mib: f64,
    /// Floor.
    pub floor_mib: f64,
}

/// Plans `load` with sessions like `session` on `memory`. `load.prefill`'s device is resolved
/// here; the caller drops it first where its own policy refuses it (a profile without an NPU).
pub fn plan(load: &LoadOptions, session: &SessionOptions, memory: Memory) -> Result<Plan> {
    let dims = ModelDims::read(&load.path)?;
    Ok(plan_with(
        dims,
        PrefillPlace::of(load),
        load,
        session,
        memory,
    ))
}

/// [`plan_with`] against this machine's memory now, with the floor an `auto` expert cache asks
/// for (`cache_floor_mb`; none for a fixed cache): how a load without a given plan plans.
pub fn plan_here(
    dims: ModelDims,
    prefill: PrefillPlace,
    load: &LoadOptions,
    session: &SessionOptions,
) -> Plan {
    let floor_mb = match load.stream.as_ref().map(|st| st.cache) {
        Some(crate::options::CacheBudget::Auto { floor_mb }) => floor_mb,
        _ => 0,
    };
    plan_with(dims, prefill, load, session, Memory::this_machine(floor_mb))
}

/// [`plan`] for a model already read and a prefill place already decided.
pub fn plan_with(
    dims: ModelDims,
    prefill: PrefillPlace,
    load: &LoadOptions,
    session: &SessionOptions,
    memory: Memory,
) -> Plan {
    let n_ctx = match session.n_ctx {
        0 => dims.n_ctx_train.max(1),
        n => u64::from(n),
    };
    let device = prefill.device.is_some();
    let stream = load.stream.as_ref();
    let mut lines = budget::state_lines(&dims, n_ctx);
    let ubatch = (session.n_ubatch, session.n_ubatch_device);
    lines.extend(budget::compute_lines(&dims, n_ctx, ubatch, device));
    lines.extend(budget::weight_lines(&dims, stream));
    let available_mib = memory.ram_mib - memory.floor_mib;
    let fixed: f64 = lines.iter().filter(|l| l.counted).map(|l| l.mib).sum();
    let (cache_mb, note) = budget::expert_cache(&dims, stream, available_mib - fixed);
    lines.push(BudgetLine {
        what: "expert cache",
        mib: cache_mb as f64,
        counted: true,
        note,
    });
    Plan {
        dims,
        prefill,
        n_ctx,
        budget: lines,
        cache_mb,
        available_mib,
        ram_mib: memory.ram_mib,
        floor_mib: memory.floor_mib,
    }
}

impl Plan {
    /// MiB of the counted lines.
    pub fn total_mib(&self) -> f64 {
        self.budget
            .iter()
            .filter(|l| l.counted)
            .map(|l| l.mib)
            .sum()
    }

    /// MiB of the counted lines besides the expert cache.
    pub fn fixed_mib(&self) -> f64 {
        self.total_mib() - self.cache_mb as f64
    }

    /// Whether the counted lines fit the memory planned for.
    pub fn fits(&self) -> bool {
        self.available_mib > 0.0 && self.total_mib() <= self.available_mib
    }

    /// The budget as an aligned table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for l in &self.budget {
            out.push_str(&format!(
                "    {:<26} {:>10.1} MiB{}  {}\n",
                l.what,
                l.mib,
                if l.counted { "" } else { " (not counted)" },
                l.note
            ));
        }
        out.push_str(&format!(
            "    {:<26} {:>10.1} MiB\n",
            "total counted",
            self.total_mib()
        ));
        out.push_str(&format!(
            "    {:<26} {:>10.1} MiB  (RAM {:.0} MiB - floor {:.0} MiB)",
            "available", self.available_mib, self.ram_mib, self.floor_mib
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{CacheBudget, StreamOptions};

    fn dims() -> ModelDims {
        ModelDims {
            n_layer: 4,
            n_embd: 64,
            kv_bytes_per_token: 1024,
            n_kv_layers: 4,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 64,
            n_ctx_train: 512,
            n_vocab_max: 256,
            file_bytes: 40 << 20,
            expert_bytes: 30 << 20,
            max_layer_bytes: 10 << 20,
            max_layer_expert_bytes: (30 << 20) / 4,
            ..ModelDims::default()
        }
    }

    /// A damaged header's widths (the fuzzer found one) plan without overflowing: every load
    /// plans now, before llama.cpp would refuse such a file.
    #[test]
    fn a_damaged_headers_widths_do_not_overflow_the_plan() {
        let huge = ModelDims {
            n_embd: u64::MAX / 3,
            n_ff_exp: u64::MAX / 5,
            n_expert_used: 1 << 40,
            n_vocab_max: u64::MAX / 7,
            max_layer_expert_bytes: u64::MAX / 2,
            ..dims()
        };
        let mut load = streamed(CacheBudget::Auto { floor_mb: 0 });
        load.prefill = None;
        let p = plan_with(
            huge,
            PrefillPlace::on_cpu("test".into()),
            &load,
            &SessionOptions::default(),
            Memory::ram(1024, 0),
        );
        assert!(!p.fits(), "{}", p.table());
    }

    fn streamed(cache: CacheBudget) -> LoadOptions {
        LoadOptions {
            stream: Some(StreamOptions {
                cache,
                ..StreamOptions::default()
            }),
            ..LoadOptions::new("m.gguf")
        }
    }

    fn plan_on(ram_mb: u64, cache: CacheBudget) -> Plan {
        let session = SessionOptions {
            n_ctx: 512,
            ..SessionOptions::default()
        };
        plan_with(
            dims(),
            PrefillPlace::on_cpu("none".into()),
            &streamed(cache),
            &session,
            Memory::ram(ram_mb, 100),
        )
    }

    #[test]
    fn auto_takes_what_the_other_lines_leave_at_most_every_expert() {
        let auto = CacheBudget::Auto { floor_mb: 100 };
        // Plenty of memory: every expert (30 MiB).
        assert_eq!(plan_on(4096, auto).cache_mb, 30);
        // Tight: what the counted lines leave of RAM - floor, rounded down.
        let p = plan_on(150, auto);
        let left = (p.available_mib - p.fixed_mib()).floor() as u64;
        assert!(left < 30, "{}", p.table());
        assert_eq!(p.cache_mb, left);
        assert!(p.fits());
        // A fixed size is kept whatever it costs; the plan says it does not fit.
        let p = plan_on(150, CacheBudget::Mib(500));
        assert_eq!(p.cache_mb, 500);
        assert!(!p.fits());
    }

    #[test]
    fn experts_under_one_mib_are_all_cached_by_auto() {
        let mut d = dims();
        d.expert_bytes = 300 << 10;
        let p = plan_with(
            d,
            PrefillPlace::on_cpu("none".into()),
            &streamed(CacheBudget::Auto { floor_mb: 100 }),
            &SessionOptions::default(),
            Memory::ram(4096, 100),
        );
        assert_eq!(p.cache_mb, 1);
    }

    #[test]
    fn a_memory_group_tighter_than_the_machine_is_planned_whole() {
        // 1.2 GiB group on a 23 GiB machine: the group's headroom, an eighth of it kept.
        assert_eq!(
            Memory::split(23_000.0, Some(1_200.0), 1024.0),
            Memory::ram(1_200, 150)
        );
        // A smaller floor than that is kept as it is.
        assert_eq!(
            Memory::split(23_000.0, Some(1_200.0), 100.0),
            Memory::ram(1_200, 100)
        );
        // No group, or one looser than the machine less its floor: the machine and the floor.
        assert_eq!(
            Memory::split(4_000.0, None, 1024.0),
            Memory::ram(4_000, 1024)
        );
        assert_eq!(
            Memory::split(4_000.0, Some(3_500.0), 1024.0),
            Memory::ram(4_000, 1024)
        );
    }
}

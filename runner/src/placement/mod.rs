//! Placement before loading: the profile's policy over the engine's plan. The engine plans
//! (`bmoe_engine::plan`: the prefill device as a load resolves it, the memory budget, the expert
//! cache `auto` makes of it); this module decides what only a profile knows (an NPU generation that
//! refuses a Hexagon device, the RAM to plan for) and the threads and cores of this machine.
pub mod cores;

use std::path::Path;

use bmoe_engine::plan::{Memory, ModelDims, Plan, PrefillPlace};
use bmoe_engine::{LoadOptions, SessionOptions};

use crate::config::profile::{Hexagon, Profile};
use crate::config::settings::{CacheMb, Settings};

/// Why a configuration cannot be placed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The model header could not be read.
    #[error("{0}")]
    Model(#[from] bmoe_engine::EngineError),
    /// The budget does not fit.
    #[error("memory budget does not fit on profile {profile}: {detail}\n{table}")]
    Budget {
        /// Profile name.
        profile: String,
        /// The numbers, in one line.
        detail: String,
        /// The whole table.
        table: String,
        /// What would fit (`cache_mb <= N fits, or cache_mb = "auto"`).
        help: String,
    },
    /// `cpus` names cores this process cannot use.
    #[error("{0}")]
    Cpus(String),
}

impl PlacementError {
    /// What would fix it, for a `help:` line.
    pub fn help(&self) -> Option<&str> {
        match self {
            PlacementError::Budget { help, .. } => Some(help),
            PlacementError::Model(_) | PlacementError::Cpus(_) => None,
        }
    }
}

/// Decides the prefill device: named in the values, allowed by the profile's NPU generation, and
/// present in this build's device registry.
pub fn place_prefill(profile: &Profile, s: &Settings) -> PrefillPlace {
    let Some(name) = s.device_name() else {
        return PrefillPlace::on_cpu("no prefill device configured".into());
    };
    let cpu = PrefillPlace::on_cpu;
    // ggml names its Hexagon devices HTP<n>; the profile's generation decides whether they can run.
    if name.to_ascii_uppercase().starts_with("HTP") {
        if profile.hexagon == Hexagon::None {
            return cpu(format!(
                "{name} is a Hexagon NPU but profile {} has none (hexagon = \"none\")",
                profile.name
            ));
        }
        if profile.hexagon < Hexagon::MIN_PREFILL {
            return cpu(format!(
                "Hexagon {} is older than {}: {name} refused for prefill",
                profile.hexagon,
                Hexagon::MIN_PREFILL
            ));
        }
    }
    PrefillPlace::resolve(name)
}

/// What to do when a named prefill device will not run: `Err` (a refusal, exit 2) when the name
/// came from the command line (`--set device=`, `--device`) and the fallback was not allowed, as
/// llama.cpp refuses an unknown `--device`; else the warning to print. `None` when nothing falls
/// back.
pub fn device_fallback(
    asked: Option<&str>,
    origin: &str,
    place: &PrefillPlace,
    allow_cpu_fallback: bool,
) -> Option<Result<String, String>> {
    let name = asked?;
    let why = place.cpu_because.as_deref()?;
    let from_command_line = origin == "--set" || origin == "command-line flags";
    if from_command_line && !allow_cpu_fallback {
        return Some(Err(format!(
            "prefill device {name} (from {origin}) cannot run here: {why}; give --allow-cpu-fallback to run prefill on the CPU instead"
        )));
    }
    Some(Ok(format!(
        "prefill device {name} (from {origin}) is not used: {why}; prefill runs on the CPU"
    )))
}

/// The resolved placement of one (job, profile point): the engine's plan against the profile's
/// RAM, the threads and cores, and the engine options they make.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The engine's plan: model shape, prefill device, context, budget, expert cache.
    pub plan: Plan,
    /// Compute threads as configured and as they will run on this machine.
    pub threads: bmoe_engine::settings::ThreadChoice,
    /// The cores compute threads and reader/loader threads run on, and why.
    pub cores: crate::placement::cores::CoreChoice,
    /// The engine options of the load.
    pub load: LoadOptions,
    /// The engine options of its sessions.
    pub session: SessionOptions,
}

/// The engine options the values `s` ask for on `model`, with the threads and cores chosen:
/// what a run asks the engine for before anything is planned.
pub fn requested_options(
    s: &Settings,
    model: &Path,
    threads: u32,
    cores: &cores::CoreChoice,
) -> (LoadOptions, SessionOptions) {
    let mut load = LoadOptions {
        stream: s.streams().then(|| bmoe_engine::StreamOptions {
            cpus: cores.helpers.clone(),
            ..Default::default()
        }),
        prefill: s.device_name().map(|d| bmoe_engine::PrefillOptions {
            device: d.to_string(),
            cpus: cores.helpers.clone(),
            ..Default::default()
        }),
        ..LoadOptions::new(model)
    };
    let mut session = SessionOptions {
        threads,
        cpus: cores.compute.clone(),
        ..SessionOptions::default()
    };
    crate::config::settings::to_engine(s, &mut load, &mut session);
    (load, session)
}

/// The cores `s.cpus` chooses on this machine and the compute threads on them.
pub fn threads_and_cores(
    s: &Settings,
) -> Result<(bmoe_engine::settings::ThreadChoice, cores::CoreChoice), String> {
    let cores = cores::this_machine(&s.cpus)?;
    let threads = bmoe_engine::settings::ThreadChoice::resolve(
        s.threads.explicit(),
        // Pinned, `auto` is one thread per chosen core, and more than those would share them.
        match cores.compute.len() {
            0 => bmoe_engine::settings::usable_cores(),
            n => n as u32,
        },
    );
    Ok((threads, cores))
}

/// Places one (profile, values) on a model: the profile's policy (its NPU generation decides
/// whether a Hexagon device may prefill), then the engine's plan against the profile's RAM.
pub fn place(profile: &Profile, s: &Settings, model: &Path) -> Result<Placement, PlacementError> {
    place_with(profile, s, model, place_prefill(profile, s))
}

/// [`place`] with the prefill place already decided ([`place_prefill`]): the device is resolved
/// (opened) once, by whoever decided it.
pub fn place_with(
    profile: &Profile,
    s: &Settings,
    model: &Path,
    prefill: PrefillPlace,
) -> Result<Placement, PlacementError> {
    let dims = ModelDims::read(model)?;
    let (threads, cores) = threads_and_cores(s).map_err(PlacementError::Cpus)?;
    let (mut load, mut session) = requested_options(s, model, threads.used, &cores);
    if prefill.device.is_none() {
        load.prefill = None;
        session.n_ubatch_device = session.n_ubatch;
    }
    let memory = Memory::ram(profile.ram_mb, s.cache_floor_mb);
    let plan = bmoe_engine::plan::plan_with(dims, prefill, &load, &session, memory);
    // `auto` is resolved here against the profile's RAM, not the machine this runs on; the
    // context is the one the budget was sized for.
    if let Some(st) = load.stream.as_mut() {
        st.cache = bmoe_engine::CacheBudget::Mib(plan.cache_mb);
    }
    session.n_ctx = plan.n_ctx as u32;
    if !plan.fits() {
        return Err(over_budget(profile, s, &plan));
    }
    Ok(Placement {
        plan,
        threads,
        cores,
        load,
        session,
    })
}

/// The refusal of a placement that does not fit: every counted line, the table, and what would.
fn over_budget(profile: &Profile, s: &Settings, p: &Plan) -> PlacementError {
    let (fixed, total) = (p.fixed_mib(), p.total_mib());
    let detail = format!(
        "needs {total:.1} MiB ({}) but RAM {:.0} MiB minus floor {:.0} MiB leaves {:.1} MiB",
        p.budget
            .iter()
            .filter(|l| l.counted)
            .map(|l| format!("{} {:.1}", l.what, l.mib))
            .collect::<Vec<_>>()
            .join(" + "),
        p.ram_mib,
        p.floor_mib,
        p.available_mib
    );
    PlacementError::Budget {
        profile: profile.name.clone(),
        detail,
        table: p.table(),
        help: budget_help(s, fixed, p.available_mib),
    }
}

/// What would fit a budget that does not: the largest explicit expert cache the other counted
/// lines leave room for (they do not depend on it), else what the rest alone needs.
fn budget_help(s: &Settings, fixed: f64, available_mib: f64) -> String {
    let left = (available_mib - fixed).floor();
    match s.cache_mb {
        CacheMb::Mib(n) if s.streams() && n > 0 && left >= 1.0 => {
            format!("cache_mb <= {left:.0} fits, or cache_mb = \"auto\"")
        }
        _ => format!(
            "without an expert cache the rest needs {fixed:.1} MiB of the {available_mib:.1} MiB left: lower context, raise the profile's ram_mb or lower cache_floor_mb"
        ),
    }
}

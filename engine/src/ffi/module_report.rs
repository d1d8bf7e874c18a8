//! What the x86 module loader (modules.rs) reports: the folders it searched, the modules it
//! loaded, the CPU variant it chose and the ones it skipped. A file of its own so that the loader
//! and the queries over it (cpu_variant.rs) both build on it and neither on the other.

/// What the loader found and chose; `None` from [`super::cpu_variant::backend_modules`] in a
/// build with the backends linked in (and on aarch64, where ggml's own `ggml_backend_load_all`
/// loads them).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct BackendModules {
    /// The folders searched, in order.
    pub searched: Vec<String>,
    /// The folder the modules were loaded from (`None`: no CPU module anywhere).
    pub dir: Option<String>,
    /// The module files loaded, in order.
    pub loaded: Vec<String>,
    /// The CPU variant chosen by bmoe (`None` on aarch64, where ggml's scoring chooses).
    pub cpu_variant: Option<String>,
    /// Variants better than the chosen one that were not used, each with why.
    pub skipped: Vec<String>,
    /// Variants this CPU runs whose module file is absent from `dir`.
    pub missing: Vec<String>,
    /// The file the probe's verdicts for this machine state are remembered in (`None`: probed
    /// each start, or not probed; modules.rs).
    pub probe_memo: Option<String>,
}

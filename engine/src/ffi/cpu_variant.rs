//! Which CPU kernels this process computes with: the ggml CPU module the registry loaded (one per
//! Arm or x86 feature level in a `GGML_CPU_ALL_VARIANTS` build, scored against the CPU at load)
//! and the features that module was compiled for.
use std::ffi::CStr;

use ggml_sys as sys;

pub use super::module_report::BackendModules;

/// The CPU backend in use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CpuVariant {
    /// The loaded module's variant (`armv8.6_1` from `libggml-cpu-armv8.6_1.so`), `module` for a
    /// single `libggml-cpu.so`, `built-in` when the CPU backend is linked into the executable.
    pub variant: String,
    /// The features its kernels use, as ggml names them (`NEON`, `DOTPROD`, `MATMUL_INT8`, ...);
    /// a feature with a value other than `1` is `NAME=value` (`SVE_CNT=16`).
    pub features: Vec<String>,
}

impl CpuVariant {
    /// One line for a CSV cell or a log: `armv8.6_1: NEON ARM_FMA DOTPROD MATMUL_INT8 ...`.
    pub fn line(&self) -> String {
        format!("{}: {}", self.variant, self.features.join(" "))
    }
}

/// Where ggml's modules were found, which were loaded, the CPU variant chosen and the ones skipped
/// (modules.rs); `None` in a build without the x86 CPU variants.
pub fn backend_modules() -> Option<BackendModules> {
    super::backend_init();
    #[cfg(all(feature = "cpu-variants", target_arch = "x86_64"))]
    return super::modules::report().cloned();
    #[cfg(not(all(feature = "cpu-variants", target_arch = "x86_64")))]
    None
}

/// The CPU backend the registry holds now (loading the backends first, as every query does).
pub fn cpu_variant() -> CpuVariant {
    super::backend_init();
    let variant = match backend_modules() {
        // Every runnable variant skipped or missing: no CPU backend (modules.rs said why).
        Some(m) => m.cpu_variant.unwrap_or_else(|| "none".into()),
        None => variant_in_maps(&std::fs::read_to_string("/proc/self/maps").unwrap_or_default()),
    };
    CpuVariant {
        variant,
        features: cpu_features(),
    }
}

/// The variant name of the first `libggml-cpu*.so` mapped, from /proc/self/maps' text.
pub(crate) fn variant_in_maps(maps: &str) -> String {
    maps.lines()
        .filter_map(|l| l.rsplit('/').next())
        .find_map(|file| {
            let rest = file.strip_prefix("libggml-cpu")?.strip_suffix(".so")?;
            Some(match rest.strip_prefix('-') {
                Some(v) => v.to_string(),
                None => "module".to_string(),
            })
        })
        .unwrap_or_else(|| "built-in".to_string())
}

/// The CPU registry's `ggml_backend_get_features` list, switched-on entries only.
fn cpu_features() -> Vec<String> {
    // SAFETY: registry lookups by a NUL-terminated name; NULL when absent.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"CPU".as_ptr()) };
    if reg.is_null() {
        return Vec::new();
    }
    // SAFETY: `reg` is a live registry entry; the name is NUL-terminated.
    let f = unsafe {
        sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_get_features".as_ptr())
    };
    if f.is_null() {
        return Vec::new();
    }
    // SAFETY: ggml documents this proc address as `ggml_backend_get_features_t`.
    let get: sys::ggml_backend_get_features_t = unsafe { std::mem::transmute(f) };
    let Some(get) = get else {
        return Vec::new();
    };
    // SAFETY: returns a static array ending in an entry with a NULL name, owned by the module.
    let mut p = unsafe { get(reg) };
    let mut out = Vec::new();
    // SAFETY: walks the array up to its NULL-named terminator; the strings are static.
    unsafe {
        while !p.is_null() && !(*p).name.is_null() {
            let name = CStr::from_ptr((*p).name).to_string_lossy();
            let value = if (*p).value.is_null() {
                String::new()
            } else {
                CStr::from_ptr((*p).value).to_string_lossy().into_owned()
            };
            match value.as_str() {
                "1" => out.push(name.into_owned()),
                "0" | "" => {}
                v => out.push(format!("{name}={v}")),
            }
            p = p.add(1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_from_the_mapped_module() {
        let line =
            |f: &str| format!("7f00-7f10 r-xp 00000000 08:01 12 /data/local/tmp/bmoe/lib/{f}\n");
        let maps = line("libc.so.6") + &line("libggml-cpu-armv8.6_1.so") + &line("libggml-base.so");
        assert_eq!(variant_in_maps(&maps), "armv8.6_1");
        assert_eq!(variant_in_maps(&line("libggml-cpu.so")), "module");
        assert_eq!(variant_in_maps(&line("libggml-base.so")), "built-in");
    }

    /// The default x86 build loads one CPU variant module, chosen by bmoe; a build without the
    /// feature links the CPU backend in. Its features are ggml's own names.
    #[test]
    fn this_build_reports_its_cpu_backend() {
        let v = cpu_variant();
        if cfg!(all(feature = "cpu-variants", target_arch = "x86_64")) {
            let m = backend_modules().expect("the loader's report");
            assert_eq!(m.cpu_variant.as_deref(), Some(v.variant.as_str()), "{m:?}");
            assert!(
                v.features
                    .iter()
                    .any(|f| f.starts_with("AVX") || f == "SSE3"),
                "{v:?}"
            );
        } else {
            assert_eq!(v.variant, "built-in");
        }
        assert!(!v.line().is_empty());
    }
}

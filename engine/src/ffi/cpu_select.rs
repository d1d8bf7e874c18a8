//! Which of ggml's x86 CPU modules (`GGML_CPU_ALL_VARIANTS`: `libggml-cpu-<variant>.so`, one per
//! feature level) this machine may run: pure logic over the CPU's flags and the OS's enabled state,
//! so that it is tested on recorded data (`tests` below: an AVX2-only AMD, this Intel with AVX-512
//! and AMX, an OS that leaves the AVX-512 or AMX state off).
//!
//! ggml's own choice (`ggml_backend_load_best`) scores each module by its `ggml_backend_score`
//! export, which reads cpuid only ("FIXME: this does not check for OS support"): a CPU that
//! announces AMX or AVX-512 whose state the OS (or a hypervisor) does not enable gets a module that
//! traps with SIGILL. Here a feature counts only when the CPU has it *and* the OS enabled its
//! register state: XCR0 bits 1-2 (SSE, AVX) for the AVX family, 5-7 (opmask, ZMM) for AVX-512,
//! 17-18 (tile config, tile data) plus Linux's `arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`
//! permission for AMX. The loader (`modules.rs`) then probes the chosen module in a child process
//! before trusting it, since a hypervisor can get even that wrong.

/// A feature group as ggml's CMake variants and its score function name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feat {
    Sse42,
    Avx,
    F16c,
    Fma,
    Avx2,
    Bmi2,
    AvxVnni,
    /// AVX512 F, CD, VL, DQ and BW (ggml's `GGML_AVX512`).
    Avx512,
    Avx512Vbmi,
    Avx512Bf16,
    Avx512Vnni,
    /// AMX_TILE and AMX_INT8.
    Amx,
}

use Feat::*;

const HASWELL: &[Feat] = &[Sse42, Avx, F16c, Fma, Avx2, Bmi2];

/// ggml's x86 variants at this pin (ggml/src/CMakeLists.txt, `GGML_CPU_ALL_VARIANTS`), with the
/// features each is compiled for.
pub const X86_VARIANTS: &[(&str, &[Feat])] = &[
    ("x64", &[]),
    ("sse42", &[Sse42]),
    ("sandybridge", &[Sse42, Avx]),
    ("ivybridge", &[Sse42, Avx, F16c]),
    ("piledriver", &[Sse42, Avx, F16c, Fma]),
    ("haswell", HASWELL),
    ("skylakex", &[Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512]),
    (
        "cannonlake",
        &[Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi],
    ),
    (
        "cascadelake",
        &[Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vnni],
    ),
    (
        "icelake",
        &[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi, Avx512Vnni,
        ],
    ),
    (
        "cooperlake",
        &[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vnni, Avx512Bf16,
        ],
    ),
    (
        "zen4",
        &[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi, Avx512Vnni, Avx512Bf16,
        ],
    ),
    ("alderlake", &[Sse42, Avx, F16c, Fma, Avx2, Bmi2, AvxVnni]),
    (
        "sapphirerapids",
        &[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi, Avx512Vnni, Avx512Bf16, Amx,
        ],
    ),
];

/// The OS's side: XCR0 (`None` when the OS has not enabled XSAVE, so no AVX state at all) and
/// whether Linux granted this process the AMX tile data state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsState {
    pub xcr0: Option<u64>,
    pub amx_permitted: bool,
}

const XCR0_AVX: u64 = 0b110; // SSE and AVX (YMM_Hi128) state
const XCR0_AVX512: u64 = 0b1110_0000; // opmask, ZMM_Hi256, Hi16_ZMM
const XCR0_AMX: u64 = 0b11 << 17; // XTILECFG, XTILEDATA

/// The cpuid flags (as /proc/cpuinfo names them) a feature group needs.
fn flags_of(f: Feat) -> &'static [&'static str] {
    match f {
        Sse42 => &["sse4_2"],
        Avx => &["avx"],
        F16c => &["f16c"],
        Fma => &["fma"],
        Avx2 => &["avx2"],
        Bmi2 => &["bmi2"],
        AvxVnni => &["avx_vnni"],
        Avx512 => &["avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"],
        Avx512Vbmi => &["avx512vbmi"],
        Avx512Bf16 => &["avx512_bf16"],
        Avx512Vnni => &["avx512_vnni"],
        Amx => &["amx_tile", "amx_int8"],
    }
}

/// ggml's weight for a feature group in `ggml_backend_cpu_x86_score` (AMX counts through AMX_INT8).
fn weight(f: Feat) -> u32 {
    match f {
        Fma => 1,
        F16c => 1 << 1,
        Sse42 => 1 << 2,
        Bmi2 => 1 << 3,
        Avx => 1 << 4,
        Avx2 => 1 << 5,
        AvxVnni => 1 << 6,
        Avx512 => 1 << 7,
        Avx512Vbmi => 1 << 8,
        Avx512Bf16 => 1 << 9,
        Avx512Vnni => 1 << 10,
        Amx => 1 << 11,
    }
}

/// The XCR0 bits the OS must have set for a feature group's registers.
fn xcr0_of(f: Feat) -> u64 {
    match f {
        Sse42 => 0,
        Avx | F16c | Fma | Avx2 | AvxVnni => XCR0_AVX,
        Bmi2 => 0,
        Avx512 | Avx512Vbmi | Avx512Bf16 | Avx512Vnni => XCR0_AVX | XCR0_AVX512,
        Amx => XCR0_AMX,
    }
}

/// Why a feature group cannot run here: the CPU lacks it (`Err(None)`: not worth a message) or
/// the OS left its state off (`Err(Some(why))`).
fn usable(f: Feat, flags: &[&str], os: OsState) -> Result<(), Option<String>> {
    if flags_of(f).iter().any(|x| !flags.contains(x)) {
        return Err(None);
    }
    let need = xcr0_of(f);
    if need != 0 {
        let Some(xcr0) = os.xcr0 else {
            return Err(Some(format!(
                "{f:?}: the OS has not enabled XSAVE (no XCR0)"
            )));
        };
        if xcr0 & need != need {
            return Err(Some(format!(
                "{f:?}: the OS has not enabled its register state (XCR0 {xcr0:#x}, needs {need:#x})"
            )));
        }
    }
    if f == Amx && !os.amx_permitted {
        return Err(Some(
            "Amx: Linux refused arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)".into(),
        ));
    }
    Ok(())
}

/// One variant as judged here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    pub name: &'static str,
    /// ggml's score for it on this CPU (what `ggml_backend_load_best` would compare).
    pub score: u32,
    /// `None`: runnable here, as far as flags and OS state tell. `Some(why)`: the CPU announces
    /// every feature but the OS does not enable one (a variant ggml would load and that traps).
    pub blocked: Option<String>,
}

/// The variants this CPU announces every feature of, best score first, each with what the OS
/// state says. Variants needing a feature the CPU lacks are left out, as ggml scores them 0.
pub fn rank(flags: &[&str], os: OsState) -> Vec<Ranked> {
    let mut out: Vec<Ranked> = X86_VARIANTS
        .iter()
        .filter_map(|(name, feats)| {
            let mut blocked = None;
            for f in feats.iter() {
                match usable(*f, flags, os) {
                    Ok(()) => {}
                    Err(None) => return None,
                    Err(Some(why)) => blocked = blocked.or(Some(why)),
                }
            }
            let score = 1 + feats.iter().map(|f| weight(*f)).sum::<u32>();
            Some(Ranked {
                name,
                score,
                blocked,
            })
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.score));
    out
}

/// The runnable variants in the order to try them: a variant named by `BMOE_CPU_VARIANT` first
/// (when runnable), then by score.
pub fn candidates(ranked: &[Ranked], forced: Option<&str>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = ranked
        .iter()
        .filter(|r| r.blocked.is_none())
        .map(|r| r.name)
        .collect();
    if let Some(f) = forced {
        if let Some(i) = out.iter().position(|n| *n == f) {
            let n = out.remove(i);
            out.insert(0, n);
        }
    }
    out
}

/// The flags field of /proc/cpuinfo's first processor.
pub fn cpuinfo_flags(cpuinfo: &str) -> Vec<&str> {
    cpuinfo
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "flags").then_some(v)
        })
        .map(|v| v.split_whitespace().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An AMD EPYC 7B12 (Zen 2): AVX2, no AVX-512, no VNNI.
    const AMD_ZEN2: &str = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw topoext ssbd ibrs ibpb stibp vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 clzero xsaveerptr arat npt nrip_save umip rdpid";
    /// This machine's Intel Xeon (Sapphire Rapids class, in a VM): AVX-512 with VNNI, BF16, VBMI,
    /// AVX-VNNI, and the AMX flags.
    const INTEL_SPR: &str = "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 arat avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid cldemote movdiri movdir64b md_clear serialize tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 arch_capabilities";

    const OS_FULL: OsState = OsState {
        xcr0: Some(0x600e7),
        amx_permitted: true,
    };

    fn first(flags: &str, os: OsState) -> &'static str {
        candidates(&rank(&cpuinfo_flags(flags), os), None)[0]
    }

    #[test]
    fn amd_avx2_only_picks_haswell() {
        let os = OsState {
            xcr0: Some(0x207),
            amx_permitted: false,
        };
        let r = rank(&cpuinfo_flags(AMD_ZEN2), os);
        assert_eq!(r[0].name, "haswell");
        assert!(r.iter().all(|v| v.blocked.is_none()), "{r:?}");
        assert!(!r
            .iter()
            .any(|v| v.name.contains("lake") || v.name == "zen4"));
        assert_eq!(first(AMD_ZEN2, os), "haswell");
    }

    #[test]
    fn this_intel_ranks_amx_first_as_ggml_would() {
        // Flags and OS agree on AMX: sapphirerapids is the best (and the probe decides).
        assert_eq!(first(INTEL_SPR, OS_FULL), "sapphirerapids");
    }

    #[test]
    fn this_intel_without_amx_picks_the_avx512_vnni_variant() {
        // The AMX tile state off in XCR0 (bits 17-18), as a hypervisor that traps AMX leaves it.
        let os = OsState {
            xcr0: Some(0xe7),
            amx_permitted: true,
        };
        let r = rank(&cpuinfo_flags(INTEL_SPR), os);
        assert_eq!(r[0].name, "sapphirerapids");
        assert!(r[0].blocked.as_deref().unwrap().contains("XCR0"));
        let c = candidates(&r, None);
        assert_eq!(c[0], "zen4", "AVX-512 with VBMI, VNNI and BF16, no AMX");
        assert!(!c.contains(&"sapphirerapids"));
        // Permission refused by Linux: the same choice, another reason.
        let os = OsState {
            xcr0: Some(0x600e7),
            amx_permitted: false,
        };
        let r = rank(&cpuinfo_flags(INTEL_SPR), os);
        assert!(r[0].blocked.as_deref().unwrap().contains("arch_prctl"));
        assert_eq!(candidates(&r, None)[0], "zen4");
    }

    #[test]
    fn avx512_state_off_falls_back_to_avx_vnni() {
        let os = OsState {
            xcr0: Some(0x7),
            amx_permitted: false,
        };
        let c = candidates(&rank(&cpuinfo_flags(INTEL_SPR), os), None);
        assert_eq!(c[0], "alderlake");
        assert!(c.iter().all(|n| !n.contains("lake") || *n == "alderlake"));
        // No XSAVE at all: nothing with AVX registers.
        let os = OsState {
            xcr0: None,
            amx_permitted: false,
        };
        assert_eq!(first(INTEL_SPR, os), "sse42");
    }

    #[test]
    fn a_forced_variant_goes_first_only_when_runnable() {
        let r = rank(&cpuinfo_flags(AMD_ZEN2), OS_FULL);
        assert_eq!(candidates(&r, Some("sse42"))[0], "sse42");
        assert_eq!(candidates(&r, Some("zen4"))[0], "haswell");
    }

    #[test]
    fn scores_match_ggml() {
        let r = rank(&cpuinfo_flags(INTEL_SPR), OS_FULL);
        let score = |n: &str| r.iter().find(|v| v.name == n).unwrap().score;
        assert_eq!(score("x64"), 1);
        assert_eq!(score("haswell"), 1 + 1 + 2 + 4 + 8 + 16 + 32);
        assert_eq!(score("zen4"), score("haswell") + 128 + 256 + 512 + 1024);
        assert_eq!(score("sapphirerapids"), score("zen4") + 2048);
    }
}

//! ggml's backends as modules (a `GGML_BACKEND_DL` build, feature `cpu-variants`): found, chosen and
//! loaded here before llama.cpp's own `ggml_backend_load_all` would run (`llama_backend_init`
//! loads nothing once a backend is registered).
//!
//! Where: `BMOE_BACKEND_DIR`, then the executable's folder (a bundle, `dist/`), then the build's
//! own module folder (llama-cpp-sys-2's `OUT_DIR/backends`, compiled in: what `cargo run`, `cargo
//! test` and `target/*/bmoe` use); the first folder holding a `libggml-cpu-*.so` is taken.
//!
//! What: every non-CPU module there (RPC, Vulkan, ...), then on x86_64 one CPU variant: the best
//! this CPU and OS run ([`super::cpu_select`]), tried in a child process first (a small quantized
//! matmul through the module, on each buffer type it offers: a kernel that traps kills the child,
//! not bmoe), and skipped for the next best with a `bmoe:` line when it fails. x86_64 only: on
//! aarch64 (scripts/build-aarch64) ggml's own `ggml_backend_load_all` still scores the Arm
//! variants against the HWCAPs, which the kernel sets only for what it enabled. `BMOE_CPU_VARIANT=NAME` tries NAME first;
//! `BMOE_CPU_PROBE=0` trusts flags and OS state without the child; `BMOE_CPU_PROBE_FAULT=NAME[,..]`
//! makes the probe of those variants trap on purpose (SIGILL), for the tests.
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ggml_sys as sys;

use super::module_report::BackendModules;
use super::probe_memo::Memo;

static MODULES: OnceLock<BackendModules> = OnceLock::new();

/// The loader's report, once [`load`] ran.
pub(super) fn report() -> Option<&'static BackendModules> {
    MODULES.get()
}

/// The non-CPU module names `ggml_backend_load_all` tries, in its order.
const OTHER_BACKENDS: &[&str] = &[
    "blas", "zendnn", "cann", "cuda", "hip", "metal", "rpc", "sycl", "vulkan", "virtgpu", "opencl",
    "hexagon", "musa", "openvino",
];

fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("BMOE_BACKEND_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(d));
    }
    if let Some(d) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push(d);
    }
    if let Some(d) = sys::BACKENDS_DIR {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

fn has_cpu_module(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|it| {
        it.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("libggml-cpu") && n.ends_with(".so")
        })
    })
}

/// Finds and loads the modules; called once, before `llama_backend_init`.
pub(super) fn load() {
    let mut report = BackendModules::default();
    let dirs = search_dirs();
    report.searched = dirs.iter().map(|d| d.display().to_string()).collect();
    let Some(dir) = dirs.iter().find(|d| has_cpu_module(d)).cloned() else {
        eprintln!(
            "bmoe: no ggml CPU module (libggml-cpu*.so) in {}; set BMOE_BACKEND_DIR",
            report.searched.join(", ")
        );
        let _ = MODULES.set(report);
        return;
    };
    report.dir = Some(dir.display().to_string());
    for name in OTHER_BACKENDS {
        let path = dir.join(format!("libggml-{name}.so"));
        if path.is_file() && load_module(&path) {
            report.loaded.push(file_name(&path));
        }
    }
    load_cpu(&dir, &mut report);
    let _ = MODULES.set(report);
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `ggml_backend_load`: dlopen, score, register. False when ggml refused it.
fn load_module(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().to_string_lossy().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; ggml returns NULL on any failure and logs why.
    !unsafe { sys::ggml_backend_load(c.as_ptr()) }.is_null()
}

fn load_cpu(dir: &Path, report: &mut BackendModules) {
    use super::cpu_select;
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let os = os_state();
    let ranked = cpu_select::rank(&cpu_select::cpuinfo_flags(&cpuinfo), os);
    let forced = std::env::var("BMOE_CPU_VARIANT").ok();
    let probe_on = std::env::var("BMOE_CPU_PROBE").map_or(true, |v| v != "0");
    let faults = std::env::var("BMOE_CPU_PROBE_FAULT").unwrap_or_default();
    // An injected fault is a test of the probe itself: nothing remembered is used or kept.
    let mut memo = if probe_on && faults.is_empty() {
        Memo::open(dir, &cpuinfo, os)
    } else {
        Memo::default()
    };
    report.probe_memo = memo.file().map(|f| f.display().to_string());
    let mut fresh = Vec::new();
    for r in &ranked {
        if let Some(why) = &r.blocked {
            report.skipped.push(format!("{}: {why}", r.name));
            // Said once per machine state too, like a probe's verdict.
            if memo.get(r.name).is_none() {
                memo.put(r.name, Err(why.clone()));
                fresh.push(r.name.to_string());
            }
        }
    }
    for name in cpu_select::candidates(&ranked, forced.as_deref()) {
        let path = dir.join(format!("libggml-cpu-{name}.so"));
        if !path.is_file() {
            report.missing.push(name.to_string());
            continue;
        }
        if probe_on {
            let fault = faults.split(',').any(|f| f.trim() == name);
            if let Err(why) = probe_once(&mut memo, name, &path, fault, &mut fresh) {
                report.skipped.push(format!("{name}: {why}"));
                continue;
            }
        }
        if load_module(&path) {
            report.loaded.push(file_name(&path));
            report.cpu_variant = Some(name.to_string());
            break;
        }
        report
            .skipped
            .push(format!("{name}: ggml_backend_load refused it"));
    }
    memo.save();
    announce(report, &fresh, memo.file());
}

/// The variant's probe verdict: the remembered one, else a probe now (its name then goes to
/// `fresh`, and its verdict into the memo).
fn probe_once(
    memo: &mut Memo,
    name: &str,
    path: &Path,
    fault: bool,
    fresh: &mut Vec<String>,
) -> Result<(), String> {
    if let Some(v) = memo.get(name) {
        return v.clone();
    }
    let v = probe(path, fault);
    memo.put(name, v.clone());
    fresh.push(name.to_string());
    v
}

/// The `bmoe:` lines about variants skipped at start: only for a verdict probed now (once per
/// machine state when the verdicts are remembered), and when no CPU module runs at all.
fn announce(report: &BackendModules, fresh: &[String], memo: Option<&Path>) {
    let using = report.cpu_variant.as_deref().unwrap_or("none");
    let remembered = memo.map_or(String::new(), |f| {
        format!(" (remembered in {}; `bmoe devices` lists it)", f.display())
    });
    for s in &report.skipped {
        if fresh.iter().any(|n| s.starts_with(&format!("{n}: "))) {
            eprintln!("bmoe: CPU variant {s}; using {using}{remembered}");
        }
    }
    if report.cpu_variant.is_none() {
        let dir = report.dir.as_deref().unwrap_or("?");
        eprintln!("bmoe: no runnable CPU module in {dir}");
    }
}

/// XCR0 (when the OS enabled XSAVE) and Linux's answer to the AMX permission request.
fn os_state() -> super::cpu_select::OsState {
    use std::arch::x86_64::__cpuid;
    // SAFETY: cpuid leaf 1 exists on every x86_64 CPU.
    #[allow(unused_unsafe)]
    let osxsave = unsafe { __cpuid(1) }.ecx & (1 << 27) != 0;
    let xcr0 = osxsave.then(|| {
        let (lo, hi): (u32, u32);
        // SAFETY: XGETBV with ECX = 0 is valid whenever CPUID.1:ECX.OSXSAVE is set (checked
        // above); it only reads XCR0 into EAX:EDX.
        unsafe {
            std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
                options(nomem, nostack, preserves_flags));
        }
        (u64::from(hi) << 32) | u64::from(lo)
    });
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only asks the kernel to allow the AMX tile
    // state for this process (what ggml's AMX code asks too); it touches no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    super::cpu_select::OsState {
        xcr0,
        amx_permitted: rc == 0,
    }
}

/// Runs a small quantized matmul through the module in a child process: `Ok` when the child
/// exits 0, else why (the signal that killed it, its exit status, a timeout).
#[cfg(target_arch = "x86_64")]
fn probe(path: &Path, fault: bool) -> Result<(), String> {
    let c = CString::new(path.as_os_str().to_string_lossy().as_bytes())
        .map_err(|_| "path with a NUL".to_string())?;
    // SAFETY: dlopen of a ggml module; ggml itself dlopens every variant to score it, so its
    // load-time code runs on any x86_64. RTLD_LOCAL keeps its symbols out of the global scope.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err("dlopen failed".into());
    }
    // SAFETY: a live handle and a NUL-terminated symbol name; NULL when absent.
    let init = unsafe { libc::dlsym(handle, c"ggml_backend_init".as_ptr()) };
    let result = if init.is_null() {
        Err("no ggml_backend_init export".into())
    } else {
        run_child(init, fault)
    };
    // SAFETY: the handle came from dlopen above; nothing of the module is used after this (the
    // child ran its code, and a later ggml_backend_load opens it afresh).
    unsafe { libc::dlclose(handle) };
    result
}

fn run_child(init: *mut c_void, fault: bool) -> Result<(), String> {
    // SAFETY: fork; the child only calls into the module already loaded above and ggml-base
    // (allocation, no dlopen, no lock another thread could hold but malloc's, which glibc's fork
    // resets), then _exits without running Rust destructors or atexit handlers.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err("fork failed".into());
    }
    if pid == 0 {
        // SAFETY: in the child: default dispositions, so a trap kills it as the parent expects,
        // and no core file (a trap is the expected answer, not a crash to keep).
        unsafe {
            for s in [libc::SIGILL, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE] {
                libc::signal(s, libc::SIG_DFL);
            }
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            if fault {
                libc::raise(libc::SIGILL);
            }
            // SAFETY: `init` is the module's `ggml_backend_init` export, still loaded.
            let code = if child_matmul(init) { 0 } else { 3 };
            libc::_exit(code);
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if r < 0 || std::time::Instant::now() > deadline {
            // SAFETY: our own child's pid.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err("the probe did not finish in 20 s".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let name = match sig {
            libc::SIGILL => "SIGILL (an instruction this CPU does not run)".to_string(),
            libc::SIGSEGV => "SIGSEGV".into(),
            libc::SIGBUS => "SIGBUS".into(),
            s => format!("signal {s}"),
        };
        return Err(format!("its probe matmul died of {name}"));
    }
    match libc::WEXITSTATUS(status) {
        0 => Ok(()),
        c => Err(format!("its probe matmul failed (exit {c})")),
    }
}

/// The child's work: the module's registry, its CPU device and backend, and a Q8_0 x F32 matmul
/// with the weight in each buffer type the device offers (its extra ones: CPU_REPACK, AMX) and in
/// plain host memory. True when every compute returned success.
#[cfg(target_arch = "x86_64")]
unsafe fn child_matmul(init: *mut c_void) -> bool {
    let init: unsafe extern "C" fn() -> sys::ggml_backend_reg_t = std::mem::transmute(init);
    let reg = init();
    if reg.is_null() || sys::ggml_backend_reg_dev_count(reg) == 0 {
        return false;
    }
    let dev = sys::ggml_backend_reg_dev_get(reg, 0);
    let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
    if backend.is_null() {
        return false;
    }
    let mut bufts = Vec::new();
    let f =
        sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_dev_get_extra_bufts".as_ptr());
    if !f.is_null() {
        let get: unsafe extern "C" fn(
            sys::ggml_backend_dev_t,
        ) -> *mut sys::ggml_backend_buffer_type_t = std::mem::transmute(f);
        let mut p = get(dev);
        while !p.is_null() && !(*p).is_null() {
            bufts.push(*p);
            p = p.add(1);
        }
    }
    bufts.push(sys::ggml_backend_dev_buffer_type(dev));
    bufts.iter().all(|b| matmul_on(backend, *b))
}

/// One `mul_mat(W[256 x 64] Q8_0, X[256 x 32] F32)` with W in `buft`.
#[cfg(target_arch = "x86_64")]
unsafe fn matmul_on(backend: sys::ggml_backend_t, buft: sys::ggml_backend_buffer_type_t) -> bool {
    const K: i64 = 256;
    const N: i64 = 64;
    const M: i64 = 32;
    let params = sys::ggml_init_params {
        mem_size: 16 * sys::ggml_tensor_overhead() + sys::ggml_graph_overhead(),
        mem_buffer: std::ptr::null_mut(),
        no_alloc: true,
    };
    let wctx = sys::ggml_init(params);
    let actx = sys::ggml_init(params);
    let w = sys::ggml_new_tensor_2d(wctx, sys::GGML_TYPE_Q8_0, K, N);
    let x = sys::ggml_new_tensor_2d(actx, sys::GGML_TYPE_F32, K, M);
    let y = sys::ggml_mul_mat(actx, w, x);
    let wbuf = sys::ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    let abuf = sys::ggml_backend_alloc_ctx_tensors_from_buft(
        actx,
        sys::ggml_backend_dev_buffer_type(sys::ggml_backend_get_device(backend)),
    );
    if wbuf.is_null() || abuf.is_null() {
        return false;
    }
    sys::ggml_backend_buffer_set_usage(wbuf, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    // An extra buffer type takes only the weights it has kernels for (the model loader asks the
    // same question); one without a Q8_0 kernel here is not this probe's business.
    if !sys::ggml_backend_dev_supports_op(sys::ggml_backend_get_device(backend), y) {
        return true;
    }
    let src: Vec<f32> = (0..K * N).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let mut q = vec![0u8; sys::ggml_row_size(sys::GGML_TYPE_Q8_0, K) * N as usize];
    sys::ggml_quantize_chunk(
        sys::GGML_TYPE_Q8_0,
        src.as_ptr(),
        q.as_mut_ptr().cast(),
        0,
        N,
        K,
        std::ptr::null(),
    );
    sys::ggml_backend_tensor_set(w, q.as_ptr().cast(), 0, q.len());
    let xs: Vec<f32> = (0..K * M).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
    sys::ggml_backend_tensor_set(x, xs.as_ptr().cast(), 0, xs.len() * 4);
    let g = sys::ggml_new_graph(actx);
    sys::ggml_build_forward_expand(g, y);
    sys::ggml_backend_graph_compute(backend, g) == sys::GGML_STATUS_SUCCESS
}

//! The ggml device registry: list devices, find one by name.
use std::ffi::{CStr, CString};

use ggml_sys as sys;

/// What kind of device a registry entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU.
    Cpu,
    /// A discrete accelerator (CUDA, Hexagon NPU, RPC, ...).
    Gpu,
    /// An integrated GPU sharing host memory.
    Igpu,
    /// An accelerator used alongside the CPU (BLAS, AMX).
    Accel,
    /// Meta devices.
    Meta,
}

/// One ggml device as the registry describes it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceInfo {
    /// Registry name (`CPU`, `CUDA0`, `HTP0`, `RPC0`).
    pub name: String,
    /// Human description.
    pub description: String,
    /// Its kind.
    pub kind: DeviceKind,
    /// The backend registry it belongs to.
    pub backend: String,
    /// Free memory in bytes as the device reports it.
    pub memory_free: u64,
    /// Total memory in bytes as the device reports it.
    pub memory_total: u64,
    /// Whether the device offers a host buffer type: host memory it addresses directly (where the
    /// specification puts the KV cache of a prefill device).
    pub host_buffer: bool,
    /// Whether the device's backend computes on its host buffer type (Hexagon, an integrated
    /// GPU), so the KV cache of a prefill run moves there; a discrete GPU only copies from it.
    pub computes_on_host_buffer: bool,
}

/// A device handle from the registry; devices live for the whole process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device(pub(crate) sys::ggml_backend_dev_t);

// SAFETY: registry devices are process-global, immutable after registration, and ggml's device
// API is thread-safe for the read-only queries this wrapper exposes.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated strings owned by the device, valid for the process.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Device {
    /// Looks a device up by name (case-insensitive, as ggml compares); `None` when absent.
    pub fn by_name(name: &str) -> Option<Device> {
        super::backend_init();
        let c = CString::new(name).ok()?;
        // SAFETY: `c` is NUL-terminated and outlives the call; NULL means "not found".
        let d = unsafe { sys::ggml_backend_dev_by_name(c.as_ptr()) };
        (!d.is_null()).then_some(Device(d))
    }

    /// The CPU device.
    pub fn cpu() -> Option<Device> {
        super::backend_init();
        // SAFETY: plain registry query; NULL when no CPU backend is registered.
        let d = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
        (!d.is_null()).then_some(Device(d))
    }

    /// The raw handle, for the other FFI wrappers.
    pub fn raw(&self) -> sys::ggml_backend_dev_t {
        self.0
    }

    /// Describes the device.
    pub fn info(&self) -> DeviceInfo {
        let (mut free, mut total) = (0usize, 0usize);
        // The raw queries, not `buffer::BufferType`: the buffer module builds on this one.
        // SAFETY: `self.0` is a live registry device; NULL means "no host buffer type".
        let host = unsafe { sys::ggml_backend_dev_host_buffer_type(self.0) };
        // SAFETY: a live device and, when non-null, its own live buffer type; a pure query.
        let computes_on_host_buffer =
            !host.is_null() && unsafe { sys::ggml_backend_dev_supports_buft(self.0, host) };
        // SAFETY: `self.0` is a live registry device; the out-pointers are valid locals.
        let (name, description, ty, reg) = unsafe {
            sys::ggml_backend_dev_memory(self.0, &mut free, &mut total);
            (
                cstr(sys::ggml_backend_dev_name(self.0)),
                cstr(sys::ggml_backend_dev_description(self.0)),
                sys::ggml_backend_dev_type(self.0),
                sys::ggml_backend_dev_backend_reg(self.0),
            )
        };
        let backend = if reg.is_null() {
            String::new()
        } else {
            // SAFETY: `reg` is a live registry entry.
            cstr(unsafe { sys::ggml_backend_reg_name(reg) })
        };
        let kind = match ty {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::Igpu,
            sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accel,
            _ => DeviceKind::Meta,
        };
        DeviceInfo {
            name,
            description,
            kind,
            backend,
            memory_free: free as u64,
            memory_total: total as u64,
            host_buffer: !host.is_null(),
            computes_on_host_buffer,
        }
    }
}

/// Every device the registry knows, in registry order.
pub fn devices() -> Vec<DeviceInfo> {
    super::backend_init();
    // SAFETY: plain registry queries with indices below the reported count.
    let n = unsafe { sys::ggml_backend_dev_count() };
    (0..n)
        .filter_map(|i| {
            // SAFETY: `i < count`.
            let d = unsafe { sys::ggml_backend_dev_get(i) };
            (!d.is_null()).then(|| Device(d).info())
        })
        .collect()
}

/// The backend registries compiled in (`CPU`, `RPC`, ...).
pub fn backend_names() -> Vec<String> {
    super::backend_init();
    // SAFETY: plain registry queries with indices below the reported count.
    let n = unsafe { sys::ggml_backend_reg_count() };
    (0..n)
        .map(|i| {
            // SAFETY: `i < count`; the name is owned by the registry.
            cstr(unsafe { sys::ggml_backend_reg_name(sys::ggml_backend_reg_get(i)) })
        })
        .collect()
}

/// llama.cpp's system info: the CPU features this build's kernels use (`AVX2 = 1`, ...), for
/// benchmark headers.
pub fn system_info() -> String {
    super::backend_init();
    // SAFETY: returns a pointer to a static string llama.cpp owns (or NULL).
    cstr(unsafe { sys::llama_print_system_info() })
        .trim()
        .trim_end_matches('|')
        .trim()
        .to_string()
}

impl Device {
    /// True when a backend can be created on the device (then freed at once).
    pub fn opens(&self) -> bool {
        // SAFETY: creating and freeing a backend on a live registry device; NULL means failure.
        unsafe {
            let b = sys::ggml_backend_dev_init(self.0, std::ptr::null());
            if b.is_null() {
                return false;
            }
            sys::ggml_backend_free(b);
            true
        }
    }
}

//! ggml's RPC backend, reached through its registry procs: an in-process server fronting a local
//! device (the loopback test device), and registering a server's devices.
use std::ffi::CString;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ggml_sys as sys;

use super::error::FfiError;
use super::registry::{Device, DeviceInfo};

fn rpc_proc(name: &std::ffi::CStr) -> Result<*mut std::ffi::c_void, FfiError> {
    super::backend_init();
    // SAFETY: registry lookups by NUL-terminated literal names; NULL means absent.
    unsafe {
        let reg = sys::ggml_backend_reg_by_name(c"RPC".as_ptr());
        if reg.is_null() {
            return Err(FfiError::Rpc(
                "this build has no RPC backend (GGML_RPC=OFF)".into(),
            ));
        }
        let p = sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr());
        if p.is_null() {
            return Err(FfiError::Rpc(format!(
                "the RPC backend does not export {name:?}"
            )));
        }
        Ok(p)
    }
}

#[cfg(feature = "test-support")]
/// Starts an RPC server on 127.0.0.1 (a free port) fronting `device` with `threads` threads, on a
/// thread of its own that lives as long as the process (ggml's server cannot be stopped), and
/// waits until it accepts connections. Returns the endpoint.
pub fn start_loopback_server(device: Device, threads: usize) -> Result<String, FfiError> {
    let start = rpc_proc(sys::RPC_PROC_START_SERVER)?;
    // SAFETY: the proc has exactly this signature in RPC protocol 7 (ggml-rpc.h, 5 parameters).
    let start: sys::RpcStartServerFn = unsafe { std::mem::transmute(start) };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| FfiError::Rpc(format!("finding a free port: {e}")))?
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let c_endpoint =
        CString::new(endpoint.clone()).map_err(|e| FfiError::Argument(e.to_string()))?;
    let dev = device.raw() as usize;
    std::thread::Builder::new()
        .name("bmoe-rpc-server".into())
        .spawn(move || {
            let mut devs = [dev as sys::ggml_backend_dev_t];
            // SAFETY: the endpoint string and the device array outlive the call (it never returns);
            // the device is a process-global registry device.
            unsafe {
                start(
                    c_endpoint.as_ptr(),
                    std::ptr::null(),
                    threads,
                    1,
                    devs.as_mut_ptr(),
                )
            };
        })
        .map_err(|e| FfiError::Rpc(format!("starting the RPC server thread: {e}")))?;
    let addr: SocketAddr = endpoint
        .parse()
        .map_err(|e| FfiError::Argument(format!("{e}")))?;
    let t0 = std::time::Instant::now();
    // The server accepts one client at a time: the probe connection is closed at once.
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(FfiError::Rpc(format!(
                "the RPC server on {endpoint} did not start"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(endpoint)
}

/// Connects to an RPC server and registers its devices so they can be found by name. The
/// endpoint is probed first: ggml aborts the process when it cannot connect.
///
/// One user at a time per server and process: ggml shares one connection per server across the
/// process, replays a device's last graph by its id, and the server forgets its graphs whenever a
/// buffer on that connection is freed, so two models or sessions computing on one RPC device from
/// two threads can abort the process (docs/device-prefill.md, "One user per RPC device").
pub fn add_server(endpoint: &str) -> Result<Vec<DeviceInfo>, FfiError> {
    let addr: SocketAddr = endpoint
        .parse()
        .map_err(|e| FfiError::Argument(format!("endpoint {endpoint}: {e}")))?;
    TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| FfiError::Rpc(format!("cannot reach the RPC server at {endpoint}: {e}")))?;
    let add = rpc_proc(sys::RPC_PROC_ADD_SERVER)?;
    // SAFETY: the proc has exactly this signature (ggml-rpc.h).
    let add: sys::RpcAddServerFn = unsafe { std::mem::transmute(add) };
    let c = CString::new(endpoint).map_err(|e| FfiError::Argument(e.to_string()))?;
    // SAFETY: NUL-terminated endpoint; the returned registry is process-global.
    let reg = unsafe { add(c.as_ptr()) };
    if reg.is_null() {
        return Err(FfiError::Rpc(format!(
            "the RPC server at {endpoint} offers no device"
        )));
    }
    // SAFETY: registering a live registry makes its devices visible to lookups by name.
    let n = unsafe {
        sys::ggml_backend_register(reg);
        sys::ggml_backend_reg_dev_count(reg)
    };
    Ok((0..n)
        .filter_map(|i| {
            // SAFETY: `i` below the registry's device count.
            let d = unsafe { sys::ggml_backend_reg_dev_get(reg, i) };
            (!d.is_null()).then(|| Device(d).info())
        })
        .collect())
}

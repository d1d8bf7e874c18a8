//! llama.cpp's and ggml's log, routed through the engine: quiet by default, the recent warnings
//! and errors kept so a failed call can say why.
use std::collections::VecDeque;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use ggml_sys::{
    ggml_log_level, GGML_LOG_LEVEL_CONT, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_ERROR,
    GGML_LOG_LEVEL_WARN,
};

const KEEP: usize = 64;

static VERBOSE: AtomicBool = AtomicBool::new(false);
static RECENT: Mutex<VecDeque<(ggml_log_level, String)>> = Mutex::new(VecDeque::new());
/// Whether the last non-continuation message was kept (so its continuations belong to it).
static LAST_KEPT: AtomicBool = AtomicBool::new(false);

/// Print everything llama.cpp logs to stderr (off by default).
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

/// Forget the kept warnings and errors (call before an operation whose failure you want to explain).
pub fn clear_recent() {
    if let Ok(mut r) = RECENT.lock() {
        r.clear();
    }
}

/// The errors logged since the last `clear_recent`, or the warnings when there were no errors.
pub fn recent_reason() -> Option<String> {
    let r = RECENT.lock().ok()?;
    let pick = |lvl| {
        r.iter()
            .filter(|(l, _)| *l == lvl)
            .map(|(_, m)| m.trim().to_string())
            .filter(|m| !m.is_empty())
            .collect::<Vec<_>>()
    };
    let errors = pick(GGML_LOG_LEVEL_ERROR);
    let lines = if errors.is_empty() {
        pick(GGML_LOG_LEVEL_WARN)
    } else {
        errors
    };
    (!lines.is_empty()).then(|| lines.join("; "))
}

pub(super) fn install() {
    // SAFETY: `log_cb` is a valid `extern "C"` function for the whole process lifetime and ignores
    // its user data; both setters only store the pointers.
    unsafe {
        ggml_sys::llama_log_set(Some(log_cb), std::ptr::null_mut());
        ggml_sys::ggml_log_set(Some(log_cb), std::ptr::null_mut());
    }
}

extern "C" fn log_cb(level: ggml_log_level, text: *const c_char, _ud: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
    let msg = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if VERBOSE.load(Ordering::Relaxed) {
        eprint!("{msg}");
    }
    // Debug lines are never kept; ggml-cpu logs one per repacked expert slice, from every
    // reader thread, which should not queue on the lock below.
    if level == GGML_LOG_LEVEL_DEBUG {
        LAST_KEPT.store(false, Ordering::Relaxed);
        return;
    }
    let Ok(mut r) = RECENT.lock() else { return };
    if level == GGML_LOG_LEVEL_CONT {
        if !LAST_KEPT.load(Ordering::Relaxed) {
            return;
        }
        if let Some(last) = r.back_mut() {
            last.1.push_str(&msg);
        }
        return;
    }
    let keep = level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN;
    LAST_KEPT.store(keep, Ordering::Relaxed);
    if keep {
        if r.len() == KEEP {
            r.pop_front();
        }
        r.push_back((level, msg.into_owned()));
    }
}

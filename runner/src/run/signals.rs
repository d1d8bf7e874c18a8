//! Ctrl-C: the first finishes the row in flight and stops cleanly; a second abandons that row
//! (a generate stops at the next token and is not written, so `--resume` runs it again).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bmoe_engine::CancelToken;

/// Shared stop state.
#[derive(Clone, Default)]
pub struct Stop {
    requested: Arc<AtomicBool>,
    /// Cancels the call in flight.
    pub cancel: CancelToken,
}

impl Stop {
    /// Installs the Ctrl-C handler (once per process); without a handler the state never trips.
    pub fn install() -> Self {
        let s = Stop::default();
        let h = s.clone();
        let res = ctrlc::set_handler(move || {
            if h.requested.swap(true, Ordering::SeqCst) {
                eprintln!("\nbmoe: second interrupt: abandoning the row in flight");
                h.cancel.cancel();
            } else {
                eprintln!("\nbmoe: interrupt: finishing the row in flight, then stopping (Ctrl-C again to abandon it)");
            }
        });
        if let Err(e) = res {
            eprintln!("bmoe: cannot watch for Ctrl-C ({e}); an interrupt will kill the run (rows written stay complete)");
        }
        s
    }

    /// True once an interrupt asked to stop.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }
}

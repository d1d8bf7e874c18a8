//! The model kept between units, loaded under the probe's verdicts and a watchdog.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bmoe_engine::Model;

use super::RunOptions;
use crate::config::paths::display_path;
use crate::ident;
use crate::placement::Placement;

/// The model kept between units, and the probe's verdicts per model.
pub(super) struct Models {
    /// The model of the last unit, kept while the next units load it with the same options
    /// (sweep points and profiles that differ only in session settings): one load per model.
    pub(super) held: Option<(bmoe_engine::LoadOptions, Model)>,
    /// Model -> the probe's error, `None` when it passed.
    pub(super) probed: HashMap<PathBuf, Option<String>>,
}

/// How a unit's model came to be (or not): the load's outcome, its seconds, and whether the held
/// model was reused.
pub(super) struct LoadOutcome {
    pub(super) result: Result<(), String>,
    pub(super) load_s: f64,
    pub(super) reused: bool,
}

impl Models {
    /// The probe's verdict on `model` (run once per model, before its first load here; kept for
    /// the model's other units); `None` when it passed or is not asked for.
    pub(super) fn probe_error(
        &mut self,
        opts: &RunOptions,
        model: &Path,
        limit: std::time::Duration,
    ) -> anyhow::Result<Option<String>> {
        if !opts.probe {
            return Ok(None);
        }
        if !self.probed.contains_key(model) {
            let r = crate::load_probe::probe(model, limit)?;
            self.probed
                .insert(model.to_path_buf(), r.error().map(str::to_string));
        }
        Ok(self.probed.get(model).cloned().flatten())
    }

    /// Keeps the held model when it was loaded with `load_opts` (and may be used); otherwise
    /// releases it, since the previous model goes before the next one loads: two need not fit
    /// together. True when it is kept.
    pub(super) fn release_unless(
        &mut self,
        load_opts: &bmoe_engine::LoadOptions,
        usable: bool,
    ) -> bool {
        let keep = usable && self.held.as_ref().is_some_and(|(o, _)| o == load_opts);
        if !keep {
            self.held = None;
        }
        keep
    }

    /// Loads a unit's model, or keeps the held one when it was loaded with the same options;
    /// the memory peaks (`rss` and the process's) start again before the load.
    pub(super) fn load(
        &mut self,
        rss: &ident::RssPeaks,
        placement: &Placement,
        probe_error: Option<String>,
        model: &Path,
        limit: std::time::Duration,
    ) -> LoadOutcome {
        let load_opts = &placement.load;
        let reused = self.release_unless(load_opts, probe_error.is_none());
        // The point's memory is measured from here: its model load included, the previous
        // point's model (released above unless kept) and peaks not. What the allocator kept of
        // the previous point's session and model would count too (3-4 MiB on the tiny model,
        // scripts/bench-point-memory): it goes back to the kernel first.
        bmoe_engine::trim_free_heap();
        ident::reset_peak_rss();
        rss.reset();
        let t0 = Instant::now();
        let result: Result<(), String> = match probe_error {
            _ if reused => Ok(()),
            Some(why) => Err(why),
            None => load_within(placement, limit, model)
                .map(|m| self.held = Some((load_opts.clone(), m))),
        };
        let load_s = if reused {
            0.0
        } else {
            t0.elapsed().as_secs_f64()
        };
        LoadOutcome {
            result,
            load_s,
            reused,
        }
    }

    /// The held model after a load, or why there is none.
    pub(super) fn loaded(&self, result: Result<(), String>) -> Result<&Model, String> {
        match (result, self.held.as_ref()) {
            (Ok(()), Some((_, m))) => Ok(m),
            (Ok(()), None) => Err("the model is not loaded".to_string()),
            (Err(why), _) => Err(why),
        }
    }
}

/// Runs `f` on a thread named `name` and waits at most `limit` for it: `None` when it is still
/// running then. Work that storage leaves hanging (a read that never returns) cannot be
/// cancelled, so it is abandoned: its thread stays blocked, holding what it allocated, and what
/// it returns later is dropped there (the receiver is gone).
pub(super) fn within<T: Send + 'static>(
    limit: std::time::Duration,
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<Option<T>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = tx.send(f());
        })?;
    Ok(rx.recv_timeout(limit).ok())
}

/// Loads a model on a thread of its own and waits at most `limit` for it. A load still running
/// then (a storage read that never returns, a loop in llama.cpp) is abandoned ([`within`]), and
/// the unit's items fail saying so; the run goes on.
pub(super) fn load_within(
    placement: &Placement,
    limit: std::time::Duration,
    model: &Path,
) -> Result<Model, String> {
    // The load takes the placement's plan: its prefill device is not resolved (opened) again.
    let (opts, plan) = (placement.load.clone(), placement.plan.clone());
    let loaded = within(limit, "bmoe-load", move || {
        Model::load_planned(&opts, &plan)
    })
    .map_err(|e| {
        format!(
            "loading {}: starting the load thread: {e}",
            display_path(model)
        )
    })?;
    match loaded {
        Some(r) => r.map_err(|e| {
            let msg = e.to_string();
            // Most load errors name the file already; the others get it in front.
            if msg.contains(&model.display().to_string()) {
                msg
            } else {
                format!("loading {}: {msg}", display_path(model))
            }
        }),
        None => Err(format!(
            "loading {}: the load did not finish within {} s (load_timeout_s); abandoned",
            display_path(model),
            limit.as_secs()
        )),
    }
}

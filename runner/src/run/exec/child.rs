//! The child side of a limited point (`bmoe __unit`): started by the parent with the run's own
//! arguments, it waits for its order on stdin (sent once the parent has moved it into the point's
//! memory cgroup), runs that one unit's items, and sends each row, then its end, to the parent as
//! JSON lines on stdout. It opens no CSV and takes no lock: the parent writes every row.
use std::collections::{HashMap, HashSet};
use std::io::BufRead;

use anyhow::Context;

use super::context::{build_label, Ctx, Out};
use super::models::Models;
use super::unit::run_unit;
use super::wire::{send, Order, Report};
use super::{RunOptions, Summary};
use crate::ident::{self, Machine};
use crate::run::prepare::Prepared;
use crate::run::progress::Progress;
use crate::run::signals::Stop;
use crate::sink::key::RowKey;

/// Runs the unit the parent orders on stdin over `prep` (prepared from the parent's arguments).
pub fn run_child(prep: &Prepared, stop: &Stop) -> anyhow::Result<()> {
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    stdin
        .read_line(&mut line)
        .context("reading the parent's order")?;
    let order: Order = serde_json::from_str(&line).context("reading the parent's order")?;
    // The parent closes stdin when it is asked to stop: finish the row in flight, then stop.
    let watcher = stop.clone();
    std::thread::spawn(move || {
        let mut rest = std::io::stdin().lock();
        let mut sink = Vec::new();
        let _ = rest.read_until(b'\0', &mut sink);
        watcher.request();
    });
    drop(stdin);
    let unit = prep
        .units
        .get(order.unit)
        .filter(|u| {
            u.profile.name == order.profile
                && u.point == order.point
                && prep.jobs[u.job].job.name == order.job
        })
        .with_context(|| {
            format!(
                "the parent's unit {} ({} on {} [{}]) is not this process's",
                order.unit, order.job, order.profile, order.point
            )
        })?;
    let lj = &prep.jobs[unit.job];
    let keys = order.items.iter().map(|(item, repeat)| RowKey {
        run_id: order.run_id.clone(),
        job: lj.job.name.clone(),
        profile: unit.profile.name.clone(),
        point: unit.point.clone(),
        item: item.clone(),
        repeat: *repeat,
    });
    let opts = RunOptions {
        quiet: true,
        ..RunOptions::default()
    };
    let ctx = Ctx {
        prep,
        opts: &opts,
        stop,
        run_id: order.run_id.clone(),
        done: HashSet::new(),
        // Exactly the parent's pending items: the retry set is what `pending_items` keeps.
        retry: Some(keys.collect()),
        targets: HashMap::new(),
        machine_id: Machine::detect(),
        model_sha: HashMap::from([(lj.model.clone(), order.model_sha.clone())]),
        build: build_label(),
        rss: ident::RssPeaks::start(),
    };
    let mut out = Out {
        summary: Summary::default(),
        progress: Progress::new(1, true),
        sinks: HashMap::new(),
        written: HashMap::new(),
        machine: false,
        to_parent: true,
    };
    let mut models = Models {
        held: None,
        probed: HashMap::new(),
    };
    run_unit(&ctx, &mut out, &mut models, unit)?;
    send(&Report::End {
        interrupted: out.summary.interrupted,
    })
}

//! What a limited point's parent and child say to each other: the parent's order (one JSON line
//! on the child's stdin) and the child's reports (a JSON line per row on its stdout, then its end).
use std::io::Write;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::sink::row::Row;

/// The hidden first argument that makes `bmoe` a limited point's child.
pub const CHILD_ARG: &str = "__unit";

/// What the parent asks of its child: one unit (an index into the prepared units, with its names
/// to check that both prepared alike) and the (item, repeat) pairs it still has to run.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Order {
    /// Index into the prepared units.
    pub(crate) unit: usize,
    /// The unit's job, profile and sweep point, as the parent prepared them.
    pub(crate) job: String,
    pub(crate) profile: String,
    pub(crate) point: String,
    /// The run the rows belong to.
    pub(crate) run_id: String,
    /// The model's hash the parent computed (rows and the prefix cache's key need it).
    pub(crate) model_sha: String,
    /// The (item id, repeat) pairs to run.
    pub(crate) items: Vec<(String, u32)>,
}

/// One line from the child to the parent.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Report {
    /// A finished row.
    Row(Box<Row>),
    /// The unit is done (or was stopped by a signal).
    End {
        /// Stopped before every item ran.
        interrupted: bool,
    },
}

/// Sends one report to the parent; flushed, so a row the kernel kills the child after is the
/// parent's already.
pub(crate) fn send(r: &Report) -> anyhow::Result<()> {
    let line = serde_json::to_string(r).context("encoding a row for the parent")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .context("sending a row to the parent")
}

//! A limited point (`memory_limit`) run in a child process inside a memory cgroup of its own:
//! the group made, the child started and moved into it before it loads anything, its rows written
//! here as they arrive, and an error row for every item it left without one (killed over the
//! limit, or any other death). The refusal of a run whose limits cannot be enforced is here too.
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{anyhow, Context};

use super::context::{Ctx, Out};
use super::models::Models;
use super::row::mib;
use super::start_unit;
use super::summary::count_row;
use super::unit::{refuse_unit, unit_base_row};
use super::wire::{Order, Report, CHILD_ARG};
use crate::config::item::Kind;
use crate::run::cgroup::{Hierarchy, MemoryGroup};
use crate::run::prepare::{Prepared, Unit};
use crate::run::signals::Stop;
use crate::sink::row::Row;

/// The unit's memory limit in MiB (`memory_limit` resolved against its profile's RAM); `None`
/// when it runs unlimited, in this process.
pub fn limit_mib(unit: &Unit) -> Option<u64> {
    unit.resolved.settings.memory_limit.mib(unit.profile.ram_mb)
}

/// Where the run's memory groups are made, checked by making one: `None` when no point is
/// limited. A run with a limit that cannot be enforced is refused here, before anything runs,
/// naming the first limited point; it never runs unlimited.
pub fn check_limits(prep: &Prepared, root: Option<&Path>) -> anyhow::Result<Option<Hierarchy>> {
    let Some((unit, mib)) = prep.units.iter().find_map(|u| limit_mib(u).map(|m| (u, m))) else {
        return Ok(None);
    };
    let found = Hierarchy::find(root).and_then(|h| h.check().map(|()| h));
    found.map(Some).map_err(|e| {
        anyhow!(
            "profile {} [{}]: memory_limit = {} ({mib} MiB) cannot be enforced: {e}\nhelp: a memory limit needs root (or a delegated cgroup) and a memory cgroup controller (v1, or v2 with `memory` in the parent's cgroup.subtree_control); without them set memory_limit = \"none\"",
            unit.profile.name,
            unit.point,
            unit.resolved.settings.memory_limit,
        )
    })
}

/// How the child ended.
struct ChildEnd {
    /// The (item, repeat) pairs it sent a row for.
    sent: HashSet<(String, u32)>,
    /// It said it was stopped by a signal.
    interrupted: bool,
    /// Its exit status.
    status: Option<ExitStatus>,
    /// Why it could not be run in the group (moved into it, or sent its order); it was killed.
    unstarted: Option<String>,
}

/// Runs a limited unit in a child process inside a fresh memory cgroup of `limit` MiB.
pub(super) fn run_isolated(
    ctx: &Ctx,
    out: &mut Out,
    models: &mut Models,
    unit: &Unit,
    limit: u64,
) -> anyhow::Result<()> {
    let Some((lj, write_to, pending)) = start_unit(ctx, out, unit) else {
        return Ok(());
    };
    let probe_error = models.probe_error(ctx.opts, &lj.model, ctx.prep.load_timeout(&lj.model))?;
    // The child loads the model: one this process still holds would keep its pages mapped, out
    // of the cold start's reach and out of the group's account.
    models.held = None;
    let mut base = unit_base_row(ctx, lj, unit, &Err(String::new()), 0.0, false)?;
    base.memory_limit_mib = Some(limit);
    if let Some(why) = probe_error {
        return refuse_unit(out, &write_to, pending, &base, &why);
    }
    let Some(cgroups) = ctx.opts.cgroups.as_ref() else {
        let why = "memory_limit: no memory cgroup hierarchy was found for this run";
        return refuse_unit(out, &write_to, pending, &base, why);
    };
    let name = format!("bmoe-{}-{}", std::process::id(), unit_index(ctx, unit));
    let group = match cgroups.create(&name, limit << 20) {
        Ok(g) => g,
        Err(e) => {
            return refuse_unit(
                out,
                &write_to,
                pending,
                &base,
                &format!("memory_limit: {e}"),
            )
        }
    };
    let order = Order {
        unit: unit_index(ctx, unit),
        job: lj.job.name.clone(),
        profile: unit.profile.name.clone(),
        point: unit.point.clone(),
        run_id: ctx.run_id.clone(),
        model_sha: ctx.model_sha.get(&lj.model).cloned().unwrap_or_default(),
        items: pending.iter().map(|(it, r)| (it.id.clone(), *r)).collect(),
    };
    let forward = Forward {
        write_to: &write_to,
        kind: lj.job.kind,
        group: &group,
        limit,
    };
    let end = supervise(ctx, out, &order, &forward)?;
    base.memory_enforced = end.unstarted.is_none();
    base.memory_peak_mib = group.peak_bytes().map(mib);
    if end.interrupted {
        out.summary.interrupted = true;
        out.progress.end_unit();
        return Ok(());
    }
    let missing: Vec<_> = pending
        .into_iter()
        .filter(|(it, r)| !end.sent.contains(&(it.id.clone(), *r)))
        .collect();
    if missing.is_empty() {
        out.progress.end_unit();
        return Ok(());
    }
    let why = death_text(&group, &end, limit, base.memory_peak_mib);
    refuse_unit(out, &write_to, missing, &base, &why)
}

/// The unit's index in the prepared run (the child prepares the same units).
fn unit_index(ctx: &Ctx, unit: &Unit) -> usize {
    ctx.prep
        .units
        .iter()
        .position(|u| std::ptr::eq(u, unit))
        .unwrap_or(usize::MAX)
}

/// Why the child left items without rows: over the limit (the OOM killer acted in its group)
/// or any other death.
fn death_text(group: &MemoryGroup, end: &ChildEnd, limit: u64, peak: Option<f64>) -> String {
    let peak = peak.map_or(String::new(), |p| format!(" (peak {p:.0} MiB)"));
    if group.oom_killed() {
        return format!(
            "over the memory limit: killed by the kernel's OOM killer at the {limit} MiB memory_limit{peak}"
        );
    }
    if let Some(why) = &end.unstarted {
        return format!("memory_limit: the point could not run in its memory cgroup: {why}");
    }
    match end.status {
        Some(s) => format!(
            "the point's process ended ({s}) before writing this item's row, under the {limit} MiB memory_limit{peak}"
        ),
        None => format!("the point's process could not run under the {limit} MiB memory_limit"),
    }
}

/// Where the child's rows go and what they are marked with.
struct Forward<'a> {
    write_to: &'a Path,
    kind: Kind,
    group: &'a MemoryGroup,
    limit: u64,
}

impl Forward<'_> {
    /// Writes one of the child's rows as an in-process row is written, marked with the limit it
    /// ran under and the group's peak so far.
    fn row(&self, out: &mut Out, mut row: Row) -> anyhow::Result<()> {
        row.memory_limit_mib = Some(self.limit);
        row.memory_enforced = true;
        row.memory_peak_mib = self.group.peak_bytes().map(mib);
        if !row.error.is_empty() {
            out.summary.failed += 1;
        }
        out.emit(self.write_to, &row)?;
        count_row(&mut out.summary, self.kind, &row);
        out.progress
            .item_done(u64::from(row.n_prefilled.unwrap_or(row.n_prompt)));
        Ok(())
    }
}

/// Starts the child, moves it into the group, sends its order and writes its rows until it
/// ends. A child that could not be moved or ordered is killed and said so in `unstarted`; an
/// error is this run's own (its CSV, its executable).
fn supervise(ctx: &Ctx, out: &mut Out, order: &Order, fwd: &Forward) -> anyhow::Result<ChildEnd> {
    let mut cmd = crate::load_probe::self_command()?;
    cmd.arg(CHILD_ARG)
        .args(&ctx.opts.child_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().context("starting the point's process")?;
    let mut end = ChildEnd {
        sent: HashSet::new(),
        interrupted: false,
        status: None,
        unstarted: None,
    };
    // Into the group before it reads its order, so everything it allocates and reads is charged.
    let started = fwd
        .group
        .add(child.id())
        .map_err(anyhow::Error::from)
        .and_then(|()| send_order(&mut child, order));
    let stdin = match started {
        Ok(stdin) => stdin,
        Err(e) => {
            let _ = child.kill();
            end.status = child.wait().ok();
            end.unstarted = Some(format!("{e:#}"));
            return Ok(end);
        }
    };
    let read = read_reports(ctx.stop, &mut child, stdin, out, fwd, &mut end);
    if read.is_err() {
        let _ = child.kill();
    }
    end.status = child.wait().ok();
    read.map(|()| end)
}

/// Sends the child its order (one JSON line); returns its stdin, kept open while it runs.
fn send_order(child: &mut Child, order: &Order) -> anyhow::Result<ChildStdin> {
    let mut stdin = child
        .stdin
        .take()
        .context("the point's process has no stdin")?;
    let line = serde_json::to_string(order).context("encoding the point's order")?;
    writeln!(stdin, "{line}")
        .and_then(|()| stdin.flush())
        .context("sending the point's process its order")?;
    Ok(stdin)
}

/// Writes the child's rows until its stdout closes; its stdin is closed once this run is asked
/// to stop (a signal sent to this process alone), which the child takes as its own stop.
fn read_reports(
    stop: &Stop,
    child: &mut Child,
    stdin: ChildStdin,
    out: &mut Out,
    fwd: &Forward,
    end: &mut ChildEnd,
) -> anyhow::Result<()> {
    let stdout = child
        .stdout
        .take()
        .context("the point's process has no stdout")?;
    std::thread::scope(|s| {
        let (done, watch) = mpsc::channel::<()>();
        s.spawn(move || {
            let mut stdin = Some(stdin);
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                watch.recv_timeout(Duration::from_millis(50))
            {
                if stop.requested() {
                    stdin = None;
                }
            }
            drop(stdin);
        });
        let r = forward_lines(BufReader::new(stdout), out, fwd, end);
        drop(done);
        r
    })
}

/// Each line of the child's stdout: a row written, or its end noted.
fn forward_lines(
    from: impl BufRead,
    out: &mut Out,
    fwd: &Forward,
    end: &mut ChildEnd,
) -> anyhow::Result<()> {
    for line in from.lines() {
        let line = line.context("reading the point's process")?;
        match serde_json::from_str::<Report>(&line) {
            Ok(Report::Row(row)) => {
                end.sent.insert((row.item.clone(), row.repeat));
                fwd.row(out, *row)?;
            }
            Ok(Report::End { interrupted }) => end.interrupted = interrupted,
            // Not a report (something printed to stdout by a library): passed on to stderr.
            Err(_) => out.progress.println(&line),
        }
    }
    Ok(())
}

//! Progress on stderr: bars (units of work, items, prefill tokens, ETA) on a terminal; off a
//! terminal (CI logs, `kubectl logs`, Slurm output files) a plain line every 100 items or 60 s, so a
//! long run is never silent for hours.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bars of one `bmoe run`.
pub struct Progress {
    mp: MultiProgress,
    units: ProgressBar,
    items: ProgressBar,
    prefill_tokens: u64,
    /// Plain lines instead of bars (stderr is not a terminal and not quiet).
    plain: Option<Plain>,
}

/// State of the plain progress lines.
struct Plain {
    label: String,
    done: u64,
    total: u64,
    since_line: u64,
    last_line: Instant,
    unit_start: Instant,
}

/// A plain line after this many items...
const PLAIN_EVERY_ITEMS: u64 = 100;
/// ... or this much time, whichever comes first.
const PLAIN_EVERY: Duration = Duration::from_secs(60);

fn style(template: &str) -> ProgressStyle {
    // The templates are constants; fall back to the default style rather than fail a run.
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// Whether a plain progress line is due: every [`PLAIN_EVERY_ITEMS`] items, every
/// [`PLAIN_EVERY`], and at a unit's last item.
fn line_due(items_since: u64, since: Duration, unit_done: bool) -> bool {
    items_since >= PLAIN_EVERY_ITEMS || since >= PLAIN_EVERY || unit_done
}

impl Progress {
    /// Bars for `n_units` units; hidden unless stderr is a terminal and `quiet` is off.
    pub fn new(n_units: u64, quiet: bool) -> Self {
        let tty = std::io::stderr().is_terminal();
        let target = if !quiet && tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let mp = MultiProgress::with_draw_target(target);
        let units = mp.add(ProgressBar::new(n_units));
        units.set_style(style("{prefix:>8} [{bar:20}] {pos}/{len} {msg}"));
        units.set_prefix("jobs");
        let items = mp.add(ProgressBar::new(0));
        items.set_style(style(
            "{prefix:>8} [{bar:20}] {pos}/{len} {msg} ({per_sec}, ETA {eta})",
        ));
        items.set_prefix("items");
        Self {
            mp,
            units,
            items,
            prefill_tokens: 0,
            plain: (!quiet && !tty).then(|| Plain {
                label: String::new(),
                done: 0,
                total: 0,
                since_line: 0,
                last_line: Instant::now(),
                unit_start: Instant::now(),
            }),
        }
    }

    /// A unit starts: `label` names it, `n_items` are left to run.
    pub fn start_unit(&mut self, label: &str, n_items: u64) {
        self.units.set_message(label.to_string());
        self.items.reset();
        self.items.set_length(n_items);
        self.items.set_position(0);
        self.prefill_tokens = 0;
        self.items.set_message("0 prefill tokens");
        if let Some(p) = &mut self.plain {
            p.label = label.to_string();
            p.done = 0;
            p.total = n_items;
            p.since_line = 0;
            p.last_line = Instant::now();
            p.unit_start = Instant::now();
        }
    }

    /// One item finished after prefilling `n_prompt` tokens.
    pub fn item_done(&mut self, n_prompt: u64) {
        self.prefill_tokens += n_prompt;
        self.items
            .set_message(format!("{} prefill tokens", self.prefill_tokens));
        self.items.inc(1);
        let tokens = self.prefill_tokens;
        if let Some(p) = &mut self.plain {
            p.done += 1;
            p.since_line += 1;
            if line_due(p.since_line, p.last_line.elapsed(), p.done == p.total) {
                let secs = p.unit_start.elapsed().as_secs_f64();
                eprintln!(
                    "bmoe: progress: {} {}/{} items, {tokens} prefill tokens, {:.2} items/s",
                    p.label,
                    p.done,
                    p.total,
                    if secs > 0.0 {
                        p.done as f64 / secs
                    } else {
                        0.0
                    }
                );
                p.since_line = 0;
                p.last_line = Instant::now();
            }
        }
    }

    /// The unit finished.
    pub fn end_unit(&self) {
        self.units.inc(1);
    }

    /// Prints a line above the bars (or plainly when they are hidden).
    pub fn println(&self, line: &str) {
        if self.mp.is_hidden() {
            eprintln!("{line}");
        } else {
            let _ = self.mp.println(line);
        }
    }

    /// Removes the bars.
    pub fn finish(&self) {
        self.items.finish_and_clear();
        self.units.finish_and_clear();
        let _ = self.mp.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_every_100_items_or_60_s() {
        let s = Duration::from_secs(1);
        assert!(!line_due(99, s, false));
        assert!(line_due(100, s, false));
        assert!(line_due(1, Duration::from_secs(60), false));
        assert!(!line_due(1, Duration::from_secs(59), false));
        assert!(line_due(1, s, true));
    }
}

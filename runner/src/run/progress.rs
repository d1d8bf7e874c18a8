//! Progress bars on stderr (units of work, items, prefill tokens, ETA); drawn only on a terminal.
use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bars of one `bmoe run`.
pub struct Progress {
    mp: MultiProgress,
    units: ProgressBar,
    items: ProgressBar,
    prefill_tokens: u64,
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants; fall back to the default style rather than fail a run.
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

impl Progress {
    /// Bars for `n_units` units; hidden unless stderr is a terminal and `quiet` is off.
    pub fn new(n_units: u64, quiet: bool) -> Self {
        let target = if !quiet && std::io::stderr().is_terminal() {
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
    }

    /// One item finished after prefilling `n_prompt` tokens.
    pub fn item_done(&mut self, n_prompt: u64) {
        self.prefill_tokens += n_prompt;
        self.items
            .set_message(format!("{} prefill tokens", self.prefill_tokens));
        self.items.inc(1);
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

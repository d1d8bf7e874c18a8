//! A row's identity, defined once: the run, job, profile, sweep point, item and repeat it
//! measured. The writer's resume, `--retry-errors`, `merge`, `compare` and `report` all key rows
//! by this type, so none of them can forget a part (merge once dropped repeats as duplicates).
use std::fmt;

use super::row::Row;

/// What a row measured. Two rows with equal keys are the same measurement (a duplicate, or a
/// retry superseding a failed row); rows that differ in any part are different measurements.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKey {
    /// Run id.
    pub run_id: String,
    /// Job name.
    pub job: String,
    /// Profile name.
    pub profile: String,
    /// Sweep point (`base` when nothing is swept).
    pub point: String,
    /// Item id.
    pub item: String,
    /// Repeat index (0 without repeats, and in files written before the column).
    pub repeat: u32,
}

impl RowKey {
    /// The key of a row.
    pub fn of(r: &Row) -> Self {
        Self {
            run_id: r.run_id.clone(),
            job: r.job.clone(),
            profile: r.profile.clone(),
            point: r.point.clone(),
            item: r.item.clone(),
            repeat: r.repeat,
        }
    }

    /// The key with the run left out: how two runs' rows of the same measurement pair up.
    pub fn within_run(mut self) -> Self {
        self.run_id.clear();
        self
    }

    /// The key with the profile left out too: how two runs on one profile each pair up when
    /// the profiles differ (the profile is then one of the things that changed).
    pub fn without_profile(mut self) -> Self {
        self.profile.clear();
        self
    }

    /// `job/point/item`, `#n` added for repeat n > 0 (so runs without repeats keep the short key).
    pub fn full(&self) -> String {
        self.named(true, true)
    }

    /// The key without the parts every compared row shares (one job, one point): `mail-1`; the
    /// profile is named when it is part of the key.
    pub fn named(&self, job: bool, point: bool) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if job {
            parts.push(&self.job);
        }
        if !self.profile.is_empty() {
            parts.push(&self.profile);
        }
        if point {
            parts.push(&self.point);
        }
        parts.push(&self.item);
        match self.repeat {
            0 => parts.join("/"),
            n => format!("{}#{n}", parts.join("/")),
        }
    }
}

impl fmt::Display for RowKey {
    /// Every part named, as messages about one row say it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run {}, job {}, profile {}, point {}, item {}, repeat {}",
            self.run_id, self.job, self.profile, self.point, self.item, self.repeat
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(repeat: u32, profile: &str) -> Row {
        Row {
            run_id: "r".into(),
            job: "j".into(),
            profile: profile.into(),
            point: "base".into(),
            item: "a".into(),
            repeat,
            ..Row::default()
        }
    }

    #[test]
    fn repeats_and_profiles_are_different_measurements() {
        assert_ne!(RowKey::of(&row(0, "p")), RowKey::of(&row(1, "p")));
        assert_ne!(RowKey::of(&row(0, "p")), RowKey::of(&row(0, "q")));
        assert_eq!(RowKey::of(&row(2, "p")), RowKey::of(&row(2, "p")));
    }

    #[test]
    fn within_run_pairs_two_runs() {
        let mut other = row(1, "p");
        other.run_id = "s".into();
        assert_eq!(
            RowKey::of(&row(1, "p")).within_run(),
            RowKey::of(&other).within_run()
        );
        assert_eq!(RowKey::of(&other).within_run().full(), "j/p/base/a#1");
        assert_eq!(
            RowKey::of(&other).within_run().without_profile().full(),
            "j/base/a#1"
        );
    }
}

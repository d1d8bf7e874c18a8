//! Everything that can stop a report, in a file of its own: every part of `report/` returns it.

/// Everything that can stop a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file could not be read.
    // The cause is shown here and not chained as a `source`, so `{:#}` prints it once.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        cause: std::io::Error,
    },
    /// Zero bytes (or only blanks).
    #[error("{path}: empty file, expected a bmoe telemetry CSV (a header line, then rows)")]
    Empty {
        /// The file.
        path: String,
    },
    /// A CSV without the identity columns: another tool's.
    #[error("{path}: not a bmoe telemetry CSV: {detail}")]
    NotTelemetry {
        /// The file.
        path: String,
        /// What is missing.
        detail: String,
    },
    /// A row the CSV parser refuses.
    #[error("{path} line {line}: row does not parse: {reason}")]
    BadRow {
        /// The file.
        path: String,
        /// 1-based line.
        line: u64,
        /// Why.
        reason: String,
    },
    /// A cell of a numeric column that is not a number: the file's numbers cannot be trusted.
    #[error("{path} line {line}, column {column}: {value:?} is not a number; fix or remove the row (the file is left out)")]
    BadCell {
        /// The file.
        path: String,
        /// 1-based line.
        line: u64,
        /// The column's name.
        column: String,
        /// The cell.
        value: String,
    },
    /// No input could be read.
    #[error("nothing to report: {problems}")]
    NothingToReport {
        /// Each input's problem.
        problems: String,
    },
    /// Inputs read, but no row is left.
    #[error("nothing to report: {what}")]
    NoRows {
        /// Why.
        what: String,
    },
    /// `--reference` names a point the data lacks.
    #[error("--reference {point}: job {job} on profile {profile} has no such point (its points: {points})")]
    NoReference {
        /// The label asked for.
        point: String,
        /// Job.
        job: String,
        /// Profile.
        profile: String,
        /// The labels present.
        points: String,
    },
    /// A `--require` that does not parse.
    #[error("--require {arg:?}: {detail}")]
    BadRequire {
        /// The text.
        arg: String,
        /// Why.
        detail: String,
    },
    /// `--objective` or `--require` names nothing the inputs have.
    #[error("{flag} {name}: no such metric or column in these CSVs; {known}")]
    UnknownName {
        /// The flag.
        flag: &'static str,
        /// The name given.
        name: String,
        /// What would have been accepted.
        known: String,
    },
    /// No row of a (job, profile) measures the objective: no point could win.
    #[error("--objective {objective}: no row of job {job} on profile {profile} {why}; try {try_instead}")]
    ObjectiveUnmeasured {
        /// The objective.
        objective: String,
        /// Job.
        job: String,
        /// Profile.
        profile: String,
        /// What the rows lack (`decodes (a decide job)`).
        why: String,
        /// What the rows do measure.
        try_instead: String,
    },
    /// No point meets every requirement.
    #[error("job {job} on profile {profile}: no point meets {requires}; the closest is {closest}")]
    NoPointMeets {
        /// Job.
        job: String,
        /// Profile.
        profile: String,
        /// The requirements.
        requires: String,
        /// The closest point and what it misses.
        closest: String,
    },
    /// The winner has no swept values to write.
    #[error("--write-overrides: the best point is `{point}`: nothing was swept, so there are no values to write")]
    NothingSwept {
        /// The label.
        point: String,
    },
    /// `--write-overrides` with several (job, profile) pairs.
    #[error("--write-overrides: the rows hold several (job, profile) pairs ({pairs}); pick one with --job and --profile")]
    SeveralPairs {
        /// The pairs.
        pairs: String,
    },
    /// The overlay could not be written as TOML.
    #[error("--write-overrides: {0}")]
    Overlay(String),
    /// plotters failed (a bug, or an absurd value range).
    #[error("drawing a plot: {0}")]
    Plot(String),
}

//! Running jobs: preparation (check, layer, place), execution, progress, interrupts, machine lines,
//! the memory cgroups of limited points.
pub mod cgroup;
pub mod choices;
pub mod exec;
pub mod machine;
pub mod no_effect;
pub mod prepare;
pub mod progress;
pub mod select;
pub mod signals;

//! Configuration: profiles and jobs read from TOML, checked against their schemas with positioned
//! errors, then layered into the values a run uses.
#[cfg(test)]
mod agreement;
pub mod cpus;
pub mod declare;
pub mod diag;
pub mod inert;
pub mod item;
pub mod job;
pub mod json_schema;
pub mod jsonl;
pub mod layers;
pub mod load;
pub mod memory_limit;
pub mod paths;
pub mod profile;
pub mod settings;
pub mod spanned;
pub mod suggest;
pub mod validate;
pub mod values;

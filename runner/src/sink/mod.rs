//! Where records go: CSV rows (the stable, append-only telemetry schema), and the one reader of
//! them.
pub mod csv;
pub mod lock;
pub mod read;
pub mod row;
pub mod schema;

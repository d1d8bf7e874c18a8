//! Where records go: CSV rows (the stable, append-only telemetry schema).
pub mod csv;
pub mod lock;
pub mod row;
pub mod schema;

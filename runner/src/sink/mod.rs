//! Where records go: CSV rows (the stable, append-only telemetry schema), and the one reader of
//! them.
pub mod csv;
pub mod key;
pub mod lock;
pub mod output;
pub mod read;
pub mod row;
#[cfg(test)]
mod telemetry_docs;
pub mod telemetry_schema;

/// A temporary file for an atomic write (written, then renamed into place), opened with mode 0666
/// so the kernel narrows it by the umask like any other file the user creates (tempfile's own
/// default is a private 0600).
#[cfg(unix)]
pub fn temp_builder() -> tempfile::Builder<'static, 'static> {
    use std::os::unix::fs::PermissionsExt;
    let mut b = tempfile::Builder::new();
    b.permissions(std::fs::Permissions::from_mode(0o666));
    b
}

/// A temporary file for an atomic write.
#[cfg(not(unix))]
pub fn temp_builder() -> tempfile::Builder<'static, 'static> {
    tempfile::Builder::new()
}

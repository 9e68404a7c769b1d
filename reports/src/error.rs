//! What can go wrong building a report. Every error names the file or the value at fault
//! and says what to do about it.

use std::path::{Path, PathBuf};

/// An error of the reports crate.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: not found; {what}", path.display())]
    Missing { path: PathBuf, what: &'static str },
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{}: malformed JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{}: malformed CSV: {message}", path.display())]
    Csv { path: PathBuf, message: String },
    /// Well-formed input whose values do not make sense (a negative time, a duplicate name).
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("cannot draw plot {name}: {message}")]
    Plot { name: String, message: String },
}

impl ReportError {
    pub(crate) fn read(path: &Path, source: std::io::Error) -> ReportError {
        ReportError::Read { path: path.to_path_buf(), source }
    }

    pub(crate) fn write(path: &Path, source: std::io::Error) -> ReportError {
        ReportError::Write { path: path.to_path_buf(), source }
    }

    pub(crate) fn invalid(origin: impl Into<String>, message: impl Into<String>) -> ReportError {
        ReportError::Invalid { origin: origin.into(), message: message.into() }
    }
}

/// Writes a file, creating its folder, naming the path on failure.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| ReportError::write(dir, e))?;
    }
    std::fs::write(path, bytes).map_err(|e| ReportError::write(path, e))
}

//! [`ConfigError`]: a configuration that cannot be read, parsed or validated, with the JSON
//! path of the offending field.

use std::path::PathBuf;

/// A configuration that cannot be read, parsed or validated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The text is not JSON.
    #[error("invalid JSON at line {line}, column {column}: {message}")]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A field is unknown, missing, of the wrong type or has an invalid value.
    #[error("{path}: {message}")]
    Invalid {
        /// The JSON path of the field, e.g. `UserConfig.Namespaces[0].Queues[2].Properties.LockDuration`.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl ConfigError {
    /// The JSON path of the offending field, when the error is about one.
    pub fn path(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { path, .. } => Some(path),
            _ => None,
        }
    }
}

pub(super) fn invalid<T>(
    path: impl Into<String>,
    message: impl Into<String>,
) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        path: path.into(),
        message: message.into(),
    })
}

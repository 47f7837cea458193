//! [`ConfigErrors`]: every problem one read of the configuration found.

use std::fmt;

/// One problem in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file key (and its environment variable).
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

/// Every problem found, so one run reports them all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// One problem with `field`.
    pub(super) fn single(field: &str, problem: String) -> Self {
        ConfigErrors(vec![ConfigError {
            field: field.to_owned(),
            problem,
        }])
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid worker configuration ({} problem(s)):",
            self.0.len()
        )?;
        for error in &self.0 {
            write!(f, "\n  - {}: {}", error.field, error.problem)?;
        }
        Ok(())
    }
}

//! [`Reader`]: reads each value from its environment variable or the file, checks it, and
//! collects every problem so one run reports them all.

use std::ops::RangeInclusive;

use super::error::ConfigError;
use super::keys::DEFAULT_ENV_PREFIX;
use super::keys::{Key, Moved};

/// Reads values key by key, collecting problems instead of stopping at the first.
pub(super) struct Reader<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    // The prefix the variables are read under: problems name those variables, not the
    // documented `SB_INBOX_` ones, since setting one of those would change nothing.
    prefix: &'a str,
    errors: Vec<ConfigError>,
    // Problems whose text names variables that are not the caller's (another program's).
    verbatim: Vec<ConfigError>,
}

impl<'a> Reader<'a> {
    /// Reads `SB_INBOX_*` names through `env`, which maps them to `prefix`'s.
    pub(super) fn new(env: &'a dyn Fn(&str) -> Option<String>, prefix: &'a str) -> Self {
        Reader {
            env,
            prefix,
            errors: Vec::new(),
            verbatim: Vec::new(),
        }
    }

    /// A variable that is not a key's override (`AZURE_CLIENT_ID`); empty counts as unset.
    pub(super) fn var(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.is_empty())
    }

    /// Records a problem with `key`.
    pub(super) fn fail(&mut self, key: Key, problem: impl Into<String>) {
        self.fail_at(key.to_string(), problem);
    }

    /// Records a problem with a field that has no variable (a `[[consumers]]` entry's).
    pub(super) fn fail_at(&mut self, field: String, problem: impl Into<String>) {
        self.errors.push(ConfigError {
            field,
            problem: problem.into(),
        });
    }

    /// Records a problem whose text is kept as written under any prefix: it names a variable
    /// of another program, which reads it under `SB_INBOX_` whatever the caller's prefix.
    pub(super) fn fail_verbatim(&mut self, field: String, problem: impl Into<String>) {
        self.verbatim.push(ConfigError {
            field,
            problem: problem.into(),
        });
    }

    /// Records, for each key set, that it means nothing without `without`.
    pub(super) fn refuse_orphans(&mut self, keys: &[(Key, bool)], without: &str) {
        for &(key, set) in keys {
            if set {
                self.fail(key, format!("has no effect without {without}"));
            }
        }
    }

    /// The problems so far, ending the read, with every variable named as it was read: under
    /// the caller's prefix.
    pub(super) fn into_errors(self) -> Vec<ConfigError> {
        let prefix = self.prefix;
        if prefix == DEFAULT_ENV_PREFIX {
            return self.errors.into_iter().chain(self.verbatim).collect();
        }
        // Every `SB_INBOX_` in a field or problem is one of the keys' variables (the fields'
        // `file.key (VARIABLE)`, hints such as "raise SB_INBOX_RETENTION_SECS").
        let rename = |text: String| text.replace(DEFAULT_ENV_PREFIX, prefix);
        self.errors
            .into_iter()
            .map(|e| ConfigError {
                field: rename(e.field),
                problem: rename(e.problem),
            })
            .chain(self.verbatim)
            .collect()
    }

    pub(super) fn has_errors(&self) -> bool {
        !self.errors.is_empty() || !self.verbatim.is_empty()
    }

    /// The variable wins over the file.
    pub(super) fn text(&mut self, key: Key, file: Option<String>) -> Option<String> {
        self.var(key.env).or(file)
    }

    /// `true`/`1`/`yes` or `false`/`0`/`no` from the variable, else the file's.
    pub(super) fn flag(&mut self, key: Key, file: Option<bool>) -> Option<bool> {
        let Some(text) = self.var(key.env) else {
            return file;
        };
        match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Some(true),
            "false" | "0" | "no" => Some(false),
            _ => {
                self.fail(key, format!("{text:?} is not true or false"));
                None
            }
        }
    }

    /// A whole number in `range`, from the variable or the file.
    pub(super) fn number(
        &mut self,
        key: Key,
        file: Option<u64>,
        range: RangeInclusive<u64>,
    ) -> Option<u64> {
        let value = match self.var(key.env) {
            Some(text) => match text.trim().parse::<u64>() {
                Ok(n) => n,
                Err(_) => {
                    self.fail(key, format!("{text:?} is not a whole number"));
                    return None;
                }
            },
            None => file?,
        };
        self.in_range(key.to_string(), value, range)
    }

    /// A whole number in `range` from the file only (a `[[consumers]]` entry's).
    pub(super) fn file_number(
        &mut self,
        field: String,
        file: Option<u64>,
        range: RangeInclusive<u64>,
    ) -> Option<u64> {
        self.in_range(field, file?, range)
    }

    /// The value of a key that moved, from its new place or else its old one (with a warning).
    pub(super) fn moved(
        &mut self,
        moved: Moved,
        new: Option<u64>,
        old: Option<u64>,
    ) -> Option<u64> {
        let Some(value) = old else {
            return new;
        };
        if new.is_some() {
            self.fail(
                moved.new,
                format!(
                    "also set as {}, its old place: keep only {}",
                    moved.old, moved.new.file
                ),
            );
            return new;
        }
        tracing::warn!(
            old = moved.old,
            new = moved.new.file,
            "A configuration key is read from its old place; move it to the new key."
        );
        Some(value)
    }

    fn in_range(&mut self, field: String, value: u64, range: RangeInclusive<u64>) -> Option<u64> {
        if range.contains(&value) {
            return Some(value);
        }
        let (min, max) = (range.start(), range.end());
        self.fail_at(field, format!("{value} is outside {min}..={max}"));
        None
    }
}

/// `n` as a `usize`, saturating (only reachable for bounds above `usize::MAX`).
pub(super) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

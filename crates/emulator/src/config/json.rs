//! Reading JSON objects with their paths, so every error names the field it is about.

use std::time::Duration;

use serde_json::{Map, Value};

use super::error::{ConfigError, invalid};
use crate::duration::parse_iso8601_duration;

/// A JSON object with its path, for path-aware errors.
pub(super) struct Obj<'a> {
    pub(super) map: &'a Map<String, Value>,
    pub(super) path: String,
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Obj<'a> {
    pub(super) fn new(v: &'a Value, path: String) -> Result<Obj<'a>, ConfigError> {
        match v {
            Value::Object(map) => Ok(Obj { map, path }),
            other => invalid(
                if path.is_empty() {
                    "$".to_owned()
                } else {
                    path
                },
                format!("expected an object, found {}", kind(other)),
            ),
        }
    }

    pub(super) fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    pub(super) fn allow(&self, keys: &[&str]) -> Result<(), ConfigError> {
        for key in self.map.keys() {
            if !keys.contains(&key.as_str()) {
                return invalid(
                    self.child(key),
                    format!("unknown field (expected one of: {})", keys.join(", ")),
                );
            }
        }
        Ok(())
    }

    pub(super) fn required<T>(&self, v: Option<T>, key: &str) -> Result<T, ConfigError> {
        match v {
            Some(v) => Ok(v),
            None => invalid(self.child(key), "missing required field"),
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        // JSON null counts as absent, so optional fields may be written as null.
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn string(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => invalid(
                self.child(key),
                format!("expected a string, found {}", kind(other)),
            ),
        }
    }

    pub(super) fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => invalid(
                self.child(key),
                format!("expected a boolean, found {}", kind(other)),
            ),
        }
    }

    pub(super) fn count(&self, key: &str) -> Result<Option<u32>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => invalid(
                    self.child(key),
                    format!("expected a non-negative integer, found {n}"),
                ),
            },
            Some(other) => invalid(
                self.child(key),
                format!("expected an integer, found {}", kind(other)),
            ),
        }
    }

    pub(super) fn duration(&self, key: &str) -> Result<Option<Duration>, ConfigError> {
        match self.string(key)? {
            None => Ok(None),
            Some(text) => match parse_iso8601_duration(text) {
                Some(d) => Ok(Some(d)),
                None => invalid(
                    self.child(key),
                    format!("invalid ISO-8601 duration {text:?}"),
                ),
            },
        }
    }

    pub(super) fn object(&self, key: &str) -> Result<Option<Obj<'a>>, ConfigError> {
        self.get(key)
            .map(|v| Obj::new(v, self.child(key)))
            .transpose()
    }

    pub(super) fn array(&self, key: &str) -> Result<Option<Vec<(&'a Value, String)>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (v, format!("{}[{i}]", self.child(key))))
                    .collect(),
            )),
            Some(other) => invalid(
                self.child(key),
                format!("expected an array, found {}", kind(other)),
            ),
        }
    }

    /// Parses each object of the optional array `key` with `parse` (none when it is absent).
    pub(super) fn each<T>(
        &self,
        key: &str,
        parse: impl Fn(Obj<'a>) -> Result<T, ConfigError>,
    ) -> Result<Vec<T>, ConfigError> {
        let mut out = Vec::new();
        for (v, path) in self.array(key)?.unwrap_or_default() {
            out.push(parse(Obj::new(v, path)?)?);
        }
        Ok(out)
    }

    pub(super) fn name(&self) -> Result<String, ConfigError> {
        Ok(self.required(self.string("Name")?, "Name")?.to_owned())
    }

    pub(super) fn target(&self, key: &str) -> Result<Option<String>, ConfigError> {
        // Microsoft's samples write "" for "no forwarding".
        Ok(self
            .string(key)?
            .filter(|s| !s.is_empty())
            .map(str::to_owned))
    }

    pub(super) fn max_message_size(&self) -> Result<Option<usize>, ConfigError> {
        Ok(self
            .count("MaxMessageSizeInKilobytes")?
            .map(|kb| kb as usize * 1024))
    }
}

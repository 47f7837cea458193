//! Microsoft's Service Bus emulator `Config.json`, parsed and validated.
//!
//! The file has the shape
//! `{"UserConfig":{"Namespaces":[{"Name","Queues":[…],"Topics":[…]}],"Logging":{"Type"}}}`
//! (schema: `ServiceBus-Emulator/Schema/Config-schema.json` in
//! `Azure/azure-service-bus-emulator-installer`). Objects are closed: an unknown field is an
//! error naming its JSON path, e.g.
//! `UserConfig.Namespaces[0].Queues[2].Properties.LockDuration: invalid ISO-8601 duration "1 minute"`.
//!
//! Defaults follow Microsoft's emulator schema (`LockDuration` `PT1M`, `MaxDeliveryCount` 3,
//! `DefaultMessageTimeToLive` `PT1H`, `DuplicateDetectionHistoryTimeWindow` `PT20S`). Minimums
//! and maximums are relaxed so tests can use a 1 s lock, but zero durations, a zero max delivery
//! count, duplicate names and unknown forwarding targets are rejected. Two extensions beyond
//! Microsoft's schema: `MaxMessageSizeInKilobytes` on queue and topic properties, and
//! `SharedAccessPolicies` (`[{"Name","Key","Rights":["Listen"|"Send"|"Manage"]}]`) on the
//! namespace.
//!
//! # Layout
//! - this file: [`Config`], reading it from a file or a JSON text.
//! - `entities`: the configured entities and their properties, defaults and builders.
//! - `parse`: the `Config.json` document into a [`Config`].
//! - `json`: JSON objects with their paths, for path-aware errors.
//! - `validate`: names, values and forwarding targets.
//! - `error`: [`ConfigError`].

mod entities;
mod error;
mod json;
mod parse;
mod validate;

use std::path::Path;

use serde_json::Value;

pub use entities::{
    DEFAULT_DUPLICATE_DETECTION_WINDOW, DEFAULT_LOCK_DURATION, DEFAULT_MAX_DELIVERY_COUNT,
    DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_MESSAGE_TIME_TO_LIVE, EntityProperties, NamespaceConfig,
    QueueConfig, SERVICE_DUPLICATE_DETECTION_WINDOW, SERVICE_MAX_DELIVERY_COUNT,
    SERVICE_MESSAGE_TIME_TO_LIVE, SubscriptionConfig, TopicConfig, TopicProperties,
};
pub use error::ConfigError;

/// The whole configuration: one namespace.
#[derive(Debug, Clone)]
pub struct Config {
    /// The namespace (Microsoft's emulator accepts exactly one).
    pub namespace: NamespaceConfig,
    /// `Logging.Type` (`File`, `Console`, …), kept for reference.
    pub logging: Option<String>,
}

impl Config {
    /// An empty namespace.
    pub fn new(namespace: impl Into<String>) -> Self {
        Config {
            namespace: NamespaceConfig {
                name: namespace.into(),
                queues: Vec::new(),
                topics: Vec::new(),
                shared_access_policies: Vec::new(),
            },
            logging: None,
        }
    }

    /// Adds a queue.
    pub fn with_queue(mut self, queue: QueueConfig) -> Self {
        self.namespace.queues.push(queue);
        self
    }

    /// Adds a topic.
    pub fn with_topic(mut self, topic: TopicConfig) -> Self {
        self.namespace.topics.push(topic);
        self
    }

    /// Reads and validates a `Config.json` file.
    ///
    /// # Errors
    /// [`ConfigError::Io`] when the file cannot be read, else as [`Config::from_json`].
    pub fn from_path(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Config::from_json(&text)
    }

    /// Parses and validates the text of a `Config.json`.
    ///
    /// # Errors
    /// [`ConfigError::Json`] for malformed JSON; [`ConfigError::Invalid`] naming the JSON path
    /// of an unknown, missing, mistyped or invalid field.
    ///
    /// # Examples
    /// ```
    /// let config = sb_emulator::Config::from_json(r#"{"UserConfig":{"Namespaces":[{"Name":"sbemulatorns",
    ///   "Queues":[{"Name":"q1","Properties":{"LockDuration":"PT1S","MaxDeliveryCount":2}}],
    ///   "Topics":[]}],"Logging":{"Type":"File"}}}"#)?;
    /// assert_eq!(config.namespace.queues[0].properties.lock_duration.as_secs(), 1);
    ///
    /// let err = sb_emulator::Config::from_json(r#"{"UserConfig":{"Namespaces":[{"Name":"ns",
    ///   "Queues":[{"Name":"q1","Properties":{"LockDuration":"1 minute"}}],"Topics":[]}]}}"#)
    ///   .unwrap_err();
    /// assert_eq!(err.to_string(),
    ///   r#"UserConfig.Namespaces[0].Queues[0].Properties.LockDuration: invalid ISO-8601 duration "1 minute""#);
    /// # Ok::<(), sb_emulator::ConfigError>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        let config = parse::config(&value)?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests;

//! Validation of a [`Config`]: names, values and forwarding targets, each error naming the
//! JSON path the field has (or would have) in a `Config.json`.

use std::collections::HashSet;
use std::time::Duration;

use super::error::{ConfigError, invalid};
use super::{Config, EntityProperties, NamespaceConfig, QueueConfig, TopicConfig};

/// Where the one namespace sits in a `Config.json`.
const NS_PATH: &str = "UserConfig.Namespaces[0]";

impl Config {
    /// Checks names, values and forwarding targets (also run by [`Config::from_json`] and by
    /// the broker on configurations built in code).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the JSON path the field has (or would have) in a
    /// `Config.json`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ns = &self.namespace;
        check_name(&ns.name, &format!("{NS_PATH}.Name"))?;
        let names = entity_names(ns)?;
        for (i, q) in ns.queues.iter().enumerate() {
            check_queue(q, i, &names)?;
        }
        for (i, t) in ns.topics.iter().enumerate() {
            check_topic(t, i, &names)?;
        }
        Ok(())
    }
}

/// The lower-case names of every queue and topic, each checked and unique.
fn entity_names(ns: &NamespaceConfig) -> Result<HashSet<String>, ConfigError> {
    let mut names = HashSet::new();
    let entities = ns
        .queues
        .iter()
        .enumerate()
        .map(|(i, q)| (format!("{NS_PATH}.Queues[{i}]"), &q.name))
        .chain(
            ns.topics
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("{NS_PATH}.Topics[{i}]"), &t.name)),
        );
    for (path, name) in entities {
        check_name(name, &format!("{path}.Name"))?;
        if !names.insert(name.to_ascii_lowercase()) {
            return invalid(
                format!("{path}.Name"),
                format!(
                    "duplicate entity name {name:?} (queue and topic names share one namespace, case-insensitively)"
                ),
            );
        }
    }
    Ok(names)
}

/// A forwarding target must name another queue or topic of the namespace (`own` is the
/// entity that would loop).
fn check_target(
    names: &HashSet<String>,
    target: &Option<String>,
    path: String,
    own: &str,
) -> Result<(), ConfigError> {
    match target {
        None => Ok(()),
        Some(t) if !names.contains(&t.to_ascii_lowercase()) => invalid(
            path,
            format!(
                "unknown forwarding target {t:?} (expected a queue or topic of this namespace)"
            ),
        ),
        Some(t) if t.eq_ignore_ascii_case(own) => {
            invalid(path, format!("an entity cannot forward to itself ({t:?})"))
        }
        Some(_) => Ok(()),
    }
}

fn check_queue(q: &QueueConfig, i: usize, names: &HashSet<String>) -> Result<(), ConfigError> {
    let path = format!("{NS_PATH}.Queues[{i}].Properties");
    check_entity_properties(&q.properties, &path)?;
    check_target(
        names,
        &q.properties.forward_to,
        format!("{path}.ForwardTo"),
        &q.name,
    )?;
    check_target(
        names,
        &q.properties.forward_dead_lettered_messages_to,
        format!("{path}.ForwardDeadLetteredMessagesTo"),
        &q.name,
    )
}

fn check_topic(t: &TopicConfig, i: usize, names: &HashSet<String>) -> Result<(), ConfigError> {
    let path = format!("{NS_PATH}.Topics[{i}]");
    let p = &t.properties;
    positive(
        p.default_message_time_to_live,
        &format!("{path}.Properties.DefaultMessageTimeToLive"),
    )?;
    positive(
        p.duplicate_detection_history_time_window,
        &format!("{path}.Properties.DuplicateDetectionHistoryTimeWindow"),
    )?;
    if p.max_message_size == 0 {
        return invalid(
            format!("{path}.Properties.MaxMessageSizeInKilobytes"),
            "must be greater than zero",
        );
    }
    let mut subs = HashSet::new();
    for (j, s) in t.subscriptions.iter().enumerate() {
        let sub_path = format!("{path}.Subscriptions[{j}]");
        check_name(&s.name, &format!("{sub_path}.Name"))?;
        if !subs.insert(s.name.to_ascii_lowercase()) {
            return invalid(
                format!("{sub_path}.Name"),
                format!("duplicate subscription name {:?}", s.name),
            );
        }
        let props = format!("{sub_path}.Properties");
        check_entity_properties(&s.properties, &props)?;
        // A subscription forwarding to its own topic would loop.
        check_target(
            names,
            &s.properties.forward_to,
            format!("{props}.ForwardTo"),
            &t.name,
        )?;
        check_target(
            names,
            &s.properties.forward_dead_lettered_messages_to,
            format!("{props}.ForwardDeadLetteredMessagesTo"),
            "",
        )?;
        check_rule_names(s, &sub_path)?;
    }
    Ok(())
}

fn check_rule_names(s: &super::SubscriptionConfig, sub_path: &str) -> Result<(), ConfigError> {
    let mut rules = HashSet::new();
    for (k, r) in s.rules.iter().enumerate() {
        let rule_path = format!("{sub_path}.Rules[{k}].Name");
        if r.name != "$Default" {
            check_name(&r.name, &rule_path)?;
        }
        if !rules.insert(r.name.to_ascii_lowercase()) {
            return invalid(rule_path, format!("duplicate rule name {:?}", r.name));
        }
    }
    Ok(())
}

fn positive(d: Duration, path: &str) -> Result<(), ConfigError> {
    if d.is_zero() {
        return invalid(path, "must be greater than zero");
    }
    Ok(())
}

fn check_entity_properties(p: &EntityProperties, path: &str) -> Result<(), ConfigError> {
    positive(p.lock_duration, &format!("{path}.LockDuration"))?;
    positive(
        p.default_message_time_to_live,
        &format!("{path}.DefaultMessageTimeToLive"),
    )?;
    positive(
        p.duplicate_detection_history_time_window,
        &format!("{path}.DuplicateDetectionHistoryTimeWindow"),
    )?;
    if p.max_delivery_count == 0 {
        return invalid(format!("{path}.MaxDeliveryCount"), "must be at least 1");
    }
    if p.max_message_size == 0 {
        return invalid(
            format!("{path}.MaxMessageSizeInKilobytes"),
            "must be greater than zero",
        );
    }
    Ok(())
}

/// Microsoft's name pattern: `^[A-Za-z0-9]$|^[A-Za-z0-9][\w-\.\/]*[A-Za-z0-9]$`.
fn check_name(name: &str, path: &str) -> Result<(), ConfigError> {
    let bytes = name.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    let inner_ok = bytes.len() < 2
        || bytes[1..bytes.len() - 1]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'));
    if !(edge_ok(bytes.first()) && edge_ok(bytes.last()) && inner_ok) {
        return invalid(
            path,
            format!(
                "invalid name {name:?} (letters, digits, '_', '-', '.', '/'; starting and ending with a letter or digit)"
            ),
        );
    }
    Ok(())
}

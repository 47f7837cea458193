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

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::duration::parse_iso8601_duration;
use crate::filter::{CorrelationFilter, Filter, Rule};
use crate::message::PropertyValue;
use crate::rights::{Right, Rights, SharedAccessPolicy};
use crate::sql_filter::SqlFilter;

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

fn invalid<T>(path: impl Into<String>, message: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        path: path.into(),
        message: message.into(),
    })
}

/// Default `LockDuration` (Microsoft emulator schema).
pub const DEFAULT_LOCK_DURATION: Duration = Duration::from_secs(60);
/// Default `MaxDeliveryCount` (Microsoft emulator schema; the cloud service uses 10).
pub const DEFAULT_MAX_DELIVERY_COUNT: u32 = 3;
/// Default `DefaultMessageTimeToLive` (Microsoft emulator schema).
pub const DEFAULT_MESSAGE_TIME_TO_LIVE: Duration = Duration::from_secs(3_600);
/// Default `DuplicateDetectionHistoryTimeWindow` (Microsoft emulator schema).
pub const DEFAULT_DUPLICATE_DETECTION_WINDOW: Duration = Duration::from_secs(20);
/// Default maximum message size: 256 KiB, as on the Standard tier.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 256 * 1024;

/// The whole configuration: one namespace.
#[derive(Debug, Clone)]
pub struct Config {
    /// The namespace (Microsoft's emulator accepts exactly one).
    pub namespace: NamespaceConfig,
    /// `Logging.Type` (`File`, `Console`, …), kept for reference.
    pub logging: Option<String>,
}

/// A namespace: queues and topics.
#[derive(Debug, Clone)]
pub struct NamespaceConfig {
    /// The namespace name (`sbemulatorns` in Microsoft's emulator).
    pub name: String,
    /// Queues.
    pub queues: Vec<QueueConfig>,
    /// Topics.
    pub topics: Vec<TopicConfig>,
    /// Extra shared access policies (`SharedAccessPolicies`, our extension) beside the root key.
    pub shared_access_policies: Vec<SharedAccessPolicy>,
}

/// A queue.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// The queue name.
    pub name: String,
    /// Its properties.
    pub properties: EntityProperties,
}

/// Properties of a queue or subscription (the entities messages are received from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityProperties {
    /// `DeadLetteringOnMessageExpiration`: dead-letter expired messages instead of dropping them.
    pub dead_lettering_on_message_expiration: bool,
    /// `DefaultMessageTimeToLive`: caps each message's TTL.
    pub default_message_time_to_live: Duration,
    /// `DuplicateDetectionHistoryTimeWindow` (queues only).
    pub duplicate_detection_history_time_window: Duration,
    /// `ForwardDeadLetteredMessagesTo`: a queue or topic receiving dead-lettered messages.
    pub forward_dead_lettered_messages_to: Option<String>,
    /// `ForwardTo`: a queue or topic receiving every message instead of this entity.
    pub forward_to: Option<String>,
    /// `LockDuration`.
    pub lock_duration: Duration,
    /// `MaxDeliveryCount`: failed deliveries before dead-lettering.
    pub max_delivery_count: u32,
    /// `RequiresDuplicateDetection` (queues only).
    pub requires_duplicate_detection: bool,
    /// `RequiresSession`: receive through session receivers only (message sessions).
    pub requires_session: bool,
    /// Maximum message size in bytes (extension `MaxMessageSizeInKilobytes`; queues only).
    pub max_message_size: usize,
}

impl Default for EntityProperties {
    fn default() -> Self {
        EntityProperties {
            dead_lettering_on_message_expiration: false,
            default_message_time_to_live: DEFAULT_MESSAGE_TIME_TO_LIVE,
            duplicate_detection_history_time_window: DEFAULT_DUPLICATE_DETECTION_WINDOW,
            forward_dead_lettered_messages_to: None,
            forward_to: None,
            lock_duration: DEFAULT_LOCK_DURATION,
            max_delivery_count: DEFAULT_MAX_DELIVERY_COUNT,
            requires_duplicate_detection: false,
            requires_session: false,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        }
    }
}

/// A topic and its subscriptions.
#[derive(Debug, Clone)]
pub struct TopicConfig {
    /// The topic name.
    pub name: String,
    /// Its properties.
    pub properties: TopicProperties,
    /// Its subscriptions.
    pub subscriptions: Vec<SubscriptionConfig>,
}

/// Properties of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicProperties {
    /// `DefaultMessageTimeToLive`: caps each message's TTL (with the subscription's).
    pub default_message_time_to_live: Duration,
    /// `DuplicateDetectionHistoryTimeWindow`.
    pub duplicate_detection_history_time_window: Duration,
    /// `RequiresDuplicateDetection`.
    pub requires_duplicate_detection: bool,
    /// Maximum message size in bytes (extension `MaxMessageSizeInKilobytes`).
    pub max_message_size: usize,
}

impl Default for TopicProperties {
    fn default() -> Self {
        TopicProperties {
            default_message_time_to_live: DEFAULT_MESSAGE_TIME_TO_LIVE,
            duplicate_detection_history_time_window: DEFAULT_DUPLICATE_DETECTION_WINDOW,
            requires_duplicate_detection: false,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        }
    }
}

/// A subscription of a topic.
#[derive(Debug, Clone)]
pub struct SubscriptionConfig {
    /// The subscription name.
    pub name: String,
    /// Its properties (duplicate detection and message size come from the topic).
    pub properties: EntityProperties,
    /// Its rules; none means the `$Default` rule (`1=1`).
    pub rules: Vec<Rule>,
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
        let root = Obj::new(&value, String::new())?;
        root.allow(&["UserConfig"])?;
        let user = root.required(root.object("UserConfig")?, "UserConfig")?;
        user.allow(&["Namespaces", "Logging"])?;
        let namespaces = user.required(user.array("Namespaces")?, "Namespaces")?;
        if namespaces.len() != 1 {
            return invalid(
                user.child("Namespaces"),
                format!("expected exactly one namespace, found {}", namespaces.len()),
            );
        }
        let (ns_value, ns_path) = &namespaces[0];
        let namespace = parse_namespace(Obj::new(ns_value, ns_path.clone())?)?;
        let logging = match user.object("Logging")? {
            None => None,
            Some(logging) => {
                logging.allow(&["Type"])?;
                let kind = logging.required(logging.string("Type")?, "Type")?;
                if !["File", "Console", "File,Console", "Console,File"].contains(&kind) {
                    return invalid(
                        logging.child("Type"),
                        format!(
                            "invalid logging type {kind:?} (expected File, Console, File,Console or Console,File)"
                        ),
                    );
                }
                Some(kind.to_owned())
            }
        };
        let config = Config { namespace, logging };
        config.validate()?;
        Ok(config)
    }

    /// Checks names, values and forwarding targets (also run by [`Config::from_json`] and by
    /// the broker on configurations built in code).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the JSON path the field has (or would have) in a
    /// `Config.json`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ns = &self.namespace;
        let ns_path = "UserConfig.Namespaces[0]";
        check_name(&ns.name, &format!("{ns_path}.Name"))?;
        let mut names = HashSet::new();
        let entities = ns
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| (format!("{ns_path}.Queues[{i}]"), &q.name))
            .chain(
                ns.topics
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (format!("{ns_path}.Topics[{i}]"), &t.name)),
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
        let check_target = |target: &Option<String>, path: String, own: &str| match target {
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
        };
        for (i, q) in ns.queues.iter().enumerate() {
            let path = format!("{ns_path}.Queues[{i}].Properties");
            check_entity_properties(&q.properties, &path)?;
            check_target(
                &q.properties.forward_to,
                format!("{path}.ForwardTo"),
                &q.name,
            )?;
            check_target(
                &q.properties.forward_dead_lettered_messages_to,
                format!("{path}.ForwardDeadLetteredMessagesTo"),
                &q.name,
            )?;
        }
        for (i, t) in ns.topics.iter().enumerate() {
            let path = format!("{ns_path}.Topics[{i}]");
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
                    &s.properties.forward_to,
                    format!("{props}.ForwardTo"),
                    &t.name,
                )?;
                check_target(
                    &s.properties.forward_dead_lettered_messages_to,
                    format!("{props}.ForwardDeadLetteredMessagesTo"),
                    "",
                )?;
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
            }
        }
        Ok(())
    }
}

impl QueueConfig {
    /// A queue with default properties.
    pub fn new(name: impl Into<String>) -> Self {
        QueueConfig {
            name: name.into(),
            properties: EntityProperties::default(),
        }
    }

    /// Replaces the properties.
    pub fn with_properties(mut self, properties: EntityProperties) -> Self {
        self.properties = properties;
        self
    }
}

impl TopicConfig {
    /// A topic with default properties and no subscriptions.
    pub fn new(name: impl Into<String>) -> Self {
        TopicConfig {
            name: name.into(),
            properties: TopicProperties::default(),
            subscriptions: Vec::new(),
        }
    }

    /// Replaces the properties.
    pub fn with_properties(mut self, properties: TopicProperties) -> Self {
        self.properties = properties;
        self
    }

    /// Adds a subscription.
    pub fn with_subscription(mut self, subscription: SubscriptionConfig) -> Self {
        self.subscriptions.push(subscription);
        self
    }
}

impl SubscriptionConfig {
    /// A subscription with default properties and the `$Default` rule.
    pub fn new(name: impl Into<String>) -> Self {
        SubscriptionConfig {
            name: name.into(),
            properties: EntityProperties::default(),
            rules: Vec::new(),
        }
    }

    /// Replaces the properties.
    pub fn with_properties(mut self, properties: EntityProperties) -> Self {
        self.properties = properties;
        self
    }

    /// Adds a rule.
    pub fn with_rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }
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

/// A JSON object with its path, for path-aware errors.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

fn kind(v: &Value) -> &'static str {
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
    fn new(v: &'a Value, path: String) -> Result<Obj<'a>, ConfigError> {
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

    fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn allow(&self, keys: &[&str]) -> Result<(), ConfigError> {
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

    fn required<T>(&self, v: Option<T>, key: &str) -> Result<T, ConfigError> {
        match v {
            Some(v) => Ok(v),
            None => invalid(self.child(key), "missing required field"),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        // JSON null counts as absent, so optional fields may be written as null.
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => invalid(
                self.child(key),
                format!("expected a string, found {}", kind(other)),
            ),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => invalid(
                self.child(key),
                format!("expected a boolean, found {}", kind(other)),
            ),
        }
    }

    fn count(&self, key: &str) -> Result<Option<u32>, ConfigError> {
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

    fn duration(&self, key: &str) -> Result<Option<Duration>, ConfigError> {
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

    fn object(&self, key: &str) -> Result<Option<Obj<'a>>, ConfigError> {
        self.get(key)
            .map(|v| Obj::new(v, self.child(key)))
            .transpose()
    }

    fn array(&self, key: &str) -> Result<Option<Vec<(&'a Value, String)>>, ConfigError> {
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

    fn name(&self) -> Result<String, ConfigError> {
        Ok(self.required(self.string("Name")?, "Name")?.to_owned())
    }

    fn target(&self, key: &str) -> Result<Option<String>, ConfigError> {
        // Microsoft's samples write "" for "no forwarding".
        Ok(self
            .string(key)?
            .filter(|s| !s.is_empty())
            .map(str::to_owned))
    }

    fn max_message_size(&self) -> Result<Option<usize>, ConfigError> {
        Ok(self
            .count("MaxMessageSizeInKilobytes")?
            .map(|kb| kb as usize * 1024))
    }
}

fn parse_policy(p: Obj<'_>) -> Result<SharedAccessPolicy, ConfigError> {
    p.allow(&["Name", "Key", "Rights"])?;
    let name = p.name()?;
    let key = p.required(p.string("Key")?, "Key")?.to_owned();
    if key.is_empty() {
        return invalid(p.child("Key"), "must not be empty");
    }
    let mut rights = Rights::default();
    for (v, path) in p.required(p.array("Rights")?, "Rights")? {
        rights = match v.as_str() {
            Some("Listen") => rights.with(Right::Listen),
            Some("Send") => rights.with(Right::Send),
            Some("Manage") => rights.with(Right::Manage),
            _ => {
                return invalid(
                    path,
                    format!("expected \"Listen\", \"Send\" or \"Manage\", found {v}"),
                );
            }
        };
    }
    if rights == Rights::default() {
        return invalid(
            p.child("Rights"),
            "needs at least one of Listen, Send, Manage",
        );
    }
    if rights.manage && !(rights.listen && rights.send) {
        // Azure refuses it too: "Assigning 'Manage' to rights requires 'Listen' and 'Send'".
        return invalid(p.child("Rights"), "Manage requires Listen and Send");
    }
    Ok(SharedAccessPolicy { name, key, rights })
}

fn parse_namespace(ns: Obj<'_>) -> Result<NamespaceConfig, ConfigError> {
    ns.allow(&["Name", "Queues", "Topics", "SharedAccessPolicies"])?;
    let name = ns.name()?;
    let mut shared_access_policies = Vec::new();
    for (v, path) in ns.array("SharedAccessPolicies")?.unwrap_or_default() {
        shared_access_policies.push(parse_policy(Obj::new(v, path)?)?);
    }
    let mut queues = Vec::new();
    for (v, path) in ns.array("Queues")?.unwrap_or_default() {
        let q = Obj::new(v, path)?;
        q.allow(&["Name", "Properties"])?;
        let name = q.name()?;
        let mut properties = EntityProperties::default();
        if let Some(p) = q.object("Properties")? {
            p.allow(&[
                "DeadLetteringOnMessageExpiration",
                "DefaultMessageTimeToLive",
                "DuplicateDetectionHistoryTimeWindow",
                "ForwardDeadLetteredMessagesTo",
                "ForwardTo",
                "LockDuration",
                "MaxDeliveryCount",
                "RequiresDuplicateDetection",
                "RequiresSession",
                "MaxMessageSizeInKilobytes",
            ])?;
            read_receiver_properties(&p, &mut properties)?;
            if let Some(v) = p.duration("DuplicateDetectionHistoryTimeWindow")? {
                properties.duplicate_detection_history_time_window = v;
            }
            if let Some(v) = p.boolean("RequiresDuplicateDetection")? {
                properties.requires_duplicate_detection = v;
            }
            if let Some(v) = p.max_message_size()? {
                properties.max_message_size = v;
            }
        }
        queues.push(QueueConfig { name, properties });
    }
    let mut topics = Vec::new();
    for (v, path) in ns.array("Topics")?.unwrap_or_default() {
        let t = Obj::new(v, path)?;
        t.allow(&["Name", "Properties", "Subscriptions"])?;
        let name = t.name()?;
        let mut properties = TopicProperties::default();
        if let Some(p) = t.object("Properties")? {
            p.allow(&[
                "DefaultMessageTimeToLive",
                "DuplicateDetectionHistoryTimeWindow",
                "RequiresDuplicateDetection",
                "MaxMessageSizeInKilobytes",
            ])?;
            if let Some(v) = p.duration("DefaultMessageTimeToLive")? {
                properties.default_message_time_to_live = v;
            }
            if let Some(v) = p.duration("DuplicateDetectionHistoryTimeWindow")? {
                properties.duplicate_detection_history_time_window = v;
            }
            if let Some(v) = p.boolean("RequiresDuplicateDetection")? {
                properties.requires_duplicate_detection = v;
            }
            if let Some(v) = p.max_message_size()? {
                properties.max_message_size = v;
            }
        }
        let mut subscriptions = Vec::new();
        for (v, path) in t.array("Subscriptions")?.unwrap_or_default() {
            subscriptions.push(parse_subscription(Obj::new(v, path)?)?);
        }
        topics.push(TopicConfig {
            name,
            properties,
            subscriptions,
        });
    }
    Ok(NamespaceConfig {
        name,
        queues,
        topics,
        shared_access_policies,
    })
}

fn read_receiver_properties(p: &Obj<'_>, props: &mut EntityProperties) -> Result<(), ConfigError> {
    if let Some(v) = p.boolean("DeadLetteringOnMessageExpiration")? {
        props.dead_lettering_on_message_expiration = v;
    }
    if let Some(v) = p.duration("DefaultMessageTimeToLive")? {
        props.default_message_time_to_live = v;
    }
    props.forward_dead_lettered_messages_to = p.target("ForwardDeadLetteredMessagesTo")?;
    props.forward_to = p.target("ForwardTo")?;
    if let Some(v) = p.duration("LockDuration")? {
        props.lock_duration = v;
    }
    if let Some(v) = p.count("MaxDeliveryCount")? {
        props.max_delivery_count = v;
    }
    if let Some(v) = p.boolean("RequiresSession")? {
        props.requires_session = v;
    }
    Ok(())
}

fn parse_subscription(s: Obj<'_>) -> Result<SubscriptionConfig, ConfigError> {
    s.allow(&["Name", "Properties", "Rules"])?;
    let name = s.name()?;
    let mut properties = EntityProperties::default();
    if let Some(p) = s.object("Properties")? {
        p.allow(&[
            "DeadLetteringOnMessageExpiration",
            "DefaultMessageTimeToLive",
            "ForwardDeadLetteredMessagesTo",
            "ForwardTo",
            "LockDuration",
            "MaxDeliveryCount",
            "RequiresSession",
        ])?;
        read_receiver_properties(&p, &mut properties)?;
    }
    let mut rules = Vec::new();
    for (v, path) in s.array("Rules")?.unwrap_or_default() {
        rules.push(parse_rule(Obj::new(v, path)?)?);
    }
    Ok(SubscriptionConfig {
        name,
        properties,
        rules,
    })
}

fn parse_rule(r: Obj<'_>) -> Result<Rule, ConfigError> {
    r.allow(&["Name", "Properties"])?;
    let name = r.name()?;
    let p = r.required(r.object("Properties")?, "Properties")?;
    p.allow(&["FilterType", "CorrelationFilter", "SqlFilter", "Action"])?;
    let filter_type = p.required(p.string("FilterType")?, "FilterType")?;
    let filter = match filter_type {
        "Correlation" => {
            if p.get("SqlFilter").is_some() {
                return invalid(
                    p.child("SqlFilter"),
                    "not allowed when FilterType is Correlation",
                );
            }
            let c = p.required(p.object("CorrelationFilter")?, "CorrelationFilter")?;
            Filter::Correlation(parse_correlation(&c)?)
        }
        "Sql" => {
            if p.get("CorrelationFilter").is_some() {
                return invalid(
                    p.child("CorrelationFilter"),
                    "not allowed when FilterType is Sql",
                );
            }
            let s = p.required(p.object("SqlFilter")?, "SqlFilter")?;
            s.allow(&["SqlExpression"])?;
            let text = s.required(s.string("SqlExpression")?, "SqlExpression")?;
            match SqlFilter::parse(text) {
                Ok(f) => Filter::Sql(f),
                Err(e) => {
                    return invalid(
                        s.child("SqlExpression"),
                        format!("invalid SQL filter {text:?}: {e}"),
                    );
                }
            }
        }
        other => {
            return invalid(
                p.child("FilterType"),
                format!("invalid filter type {other:?} (expected Correlation or Sql)"),
            );
        }
    };
    let action = match p.object("Action")? {
        None => None,
        Some(a) => {
            a.allow(&["SqlExpression"])?;
            let text = a.string("SqlExpression")?.map(str::to_owned);
            if let Some(text) = &text {
                tracing::warn!(rule = %name, action = %text, "Rule actions are not applied by this emulator.");
            }
            text
        }
    };
    Ok(Rule {
        name,
        filter,
        action,
    })
}

fn parse_correlation(c: &Obj<'_>) -> Result<CorrelationFilter, ConfigError> {
    c.allow(&[
        "ContentType",
        "CorrelationId",
        "Label",
        "MessageId",
        "ReplyTo",
        "ReplyToSessionId",
        "SessionId",
        "To",
        "Properties",
    ])?;
    let s = |key| Ok::<_, ConfigError>(c.string(key)?.map(str::to_owned));
    let mut filter = CorrelationFilter {
        content_type: s("ContentType")?,
        correlation_id: s("CorrelationId")?,
        label: s("Label")?,
        message_id: s("MessageId")?,
        reply_to: s("ReplyTo")?,
        reply_to_session_id: s("ReplyToSessionId")?,
        session_id: s("SessionId")?,
        to: s("To")?,
        properties: Default::default(),
    };
    if let Some(props) = c.object("Properties")? {
        for (key, value) in props.map {
            let v = match value {
                Value::String(s) => PropertyValue::String(s.clone()),
                Value::Bool(b) => PropertyValue::Bool(*b),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => PropertyValue::Long(i),
                    None => PropertyValue::Double(n.as_f64().unwrap_or(f64::NAN)),
                },
                other => {
                    return invalid(
                        props.child(key),
                        format!(
                            "expected a string, number or boolean, found {}",
                            kind(other)
                        ),
                    );
                }
            };
            filter.properties.insert(key.clone(), v);
        }
    }
    let empty = filter.content_type.is_none()
        && filter.correlation_id.is_none()
        && filter.label.is_none()
        && filter.message_id.is_none()
        && filter.reply_to.is_none()
        && filter.reply_to_session_id.is_none()
        && filter.session_id.is_none()
        && filter.to.is_none()
        && filter.properties.is_empty();
    if empty {
        return invalid(
            c.path.clone(),
            "a correlation filter needs at least one field",
        );
    }
    Ok(filter)
}

#[cfg(test)]
mod tests;

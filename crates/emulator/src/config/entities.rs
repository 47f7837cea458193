//! The configured entities: namespace, queues, topics and subscriptions with their
//! properties, their defaults (Microsoft's emulator schema) and builders.

use std::time::Duration;

use crate::filter::Rule;
use crate::rights::SharedAccessPolicy;

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

/// What the service gives an entity created through the management API without the setting,
/// unlike Microsoft's emulator schema (the constants above, what `Config.json` leaves out):
/// Microsoft Learn's entity properties ("Azure Service Bus queues, topics, and subscriptions",
/// the `QueueProperties` / `SubscriptionProperties` reference: `MaxDeliveryCount` default 10,
/// `DefaultMessageTimeToLive` default `TimeSpan.MaxValue`, `DuplicateDetectionHistoryTimeWindow`
/// default 10 minutes) and the .NET SDK's `CreateQueueOptions` / `CreateSubscriptionOptions`
/// defaults, which its live tests assert (`ServiceBusManagementClientLiveTests`:
/// `MaxDeliveryCount = 10`, `DefaultMessageTimeToLive = TimeSpan.MaxValue`,
/// `DeadLetteringOnFilterEvaluationExceptions = true` for a subscription).
pub const SERVICE_MAX_DELIVERY_COUNT: u32 = 10;
/// `DefaultMessageTimeToLive` of an entity created without it: .NET's `TimeSpan.MaxValue`
/// (`P10675199DT2H48M5.4775807S`), i.e. never; see [`SERVICE_MAX_DELIVERY_COUNT`].
pub const SERVICE_MESSAGE_TIME_TO_LIVE: Duration =
    Duration::new(10_675_199 * 86_400 + 2 * 3_600 + 48 * 60 + 5, 477_580_700);
/// `DuplicateDetectionHistoryTimeWindow` of an entity created without it: 10 minutes; see
/// [`SERVICE_MAX_DELIVERY_COUNT`].
pub const SERVICE_DUPLICATE_DETECTION_WINDOW: Duration = Duration::from_secs(600);

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
    /// `DeadLetteringOnFilterEvaluationExceptions` (subscriptions): reported by the management
    /// API as set; the emulator's filters raise no evaluation exceptions to act on.
    pub dead_lettering_on_filter_evaluation_exceptions: bool,
}

impl EntityProperties {
    /// What the service gives a queue or subscription created through the management API
    /// without options (see [`SERVICE_MAX_DELIVERY_COUNT`]); `Default` is Microsoft's emulator
    /// schema, what `Config.json` leaves out.
    pub fn service_defaults() -> Self {
        EntityProperties {
            default_message_time_to_live: SERVICE_MESSAGE_TIME_TO_LIVE,
            duplicate_detection_history_time_window: SERVICE_DUPLICATE_DETECTION_WINDOW,
            max_delivery_count: SERVICE_MAX_DELIVERY_COUNT,
            dead_lettering_on_filter_evaluation_exceptions: true,
            ..EntityProperties::default()
        }
    }
}

impl TopicProperties {
    /// What the service gives a topic created through the management API without options
    /// (see [`SERVICE_MAX_DELIVERY_COUNT`]).
    pub fn service_defaults() -> Self {
        TopicProperties {
            default_message_time_to_live: SERVICE_MESSAGE_TIME_TO_LIVE,
            duplicate_detection_history_time_window: SERVICE_DUPLICATE_DETECTION_WINDOW,
            ..TopicProperties::default()
        }
    }
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
            dead_lettering_on_filter_evaluation_exceptions: false,
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

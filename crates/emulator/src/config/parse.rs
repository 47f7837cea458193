//! Parsing a `Config.json` document into a [`Config`]: closed objects, typed fields and
//! path-aware errors (validation across entities is `validate`'s).

use std::time::Duration;

use serde_json::Value;

use super::error::{ConfigError, invalid};
use super::json::{Obj, kind};
use super::{
    Config, EntityProperties, NamespaceConfig, QueueConfig, SubscriptionConfig, TopicConfig,
    TopicProperties,
};
use crate::filter::{CorrelationFilter, Filter, Rule};
use crate::message::PropertyValue;
use crate::rights::{Right, Rights, SharedAccessPolicy};
use crate::sql_filter::{SqlFilter, SqlRuleAction};

/// The configuration a `Config.json` document describes (not validated yet).
pub(super) fn config(value: &Value) -> Result<Config, ConfigError> {
    let root = Obj::new(value, String::new())?;
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
        Some(logging) => Some(parse_logging(&logging)?),
    };
    Ok(Config { namespace, logging })
}

fn parse_logging(logging: &Obj<'_>) -> Result<String, ConfigError> {
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
    Ok(kind.to_owned())
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
    let shared_access_policies = ns.each("SharedAccessPolicies", parse_policy)?;
    let queues = ns.each("Queues", parse_queue)?;
    let topics = ns.each("Topics", parse_topic)?;
    Ok(NamespaceConfig {
        name,
        queues,
        topics,
        shared_access_policies,
    })
}

fn parse_queue(q: Obj<'_>) -> Result<QueueConfig, ConfigError> {
    q.allow(&["Name", "Properties"])?;
    let name = q.name()?;
    let mut properties = EntityProperties::default();
    if let Some(p) = q.object("Properties")? {
        p.allow(&property_keys(
            &[RECEIVER_KEYS, DUPLICATE_DETECTION_KEYS],
            true,
        ))?;
        read_receiver_properties(&p, &mut properties)?;
        read_sender_properties(&p, properties.sending_side())?;
    }
    Ok(QueueConfig { name, properties })
}

fn parse_topic(t: Obj<'_>) -> Result<TopicConfig, ConfigError> {
    t.allow(&["Name", "Properties", "Subscriptions"])?;
    let name = t.name()?;
    let mut properties = TopicProperties::default();
    if let Some(p) = t.object("Properties")? {
        p.allow(&property_keys(
            &[&[TIME_TO_LIVE], DUPLICATE_DETECTION_KEYS],
            true,
        ))?;
        if let Some(v) = p.duration(TIME_TO_LIVE)? {
            properties.default_message_time_to_live = v;
        }
        read_sender_properties(&p, properties.sending_side())?;
    }
    let subscriptions = t.each("Subscriptions", parse_subscription)?;
    Ok(TopicConfig {
        name,
        properties,
        subscriptions,
    })
}

const TIME_TO_LIVE: &str = "DefaultMessageTimeToLive";

/// The `Properties` keys [`read_receiver_properties`] reads.
const RECEIVER_KEYS: &[&str] = &[
    "DeadLetteringOnMessageExpiration",
    TIME_TO_LIVE,
    "ForwardDeadLetteredMessagesTo",
    "ForwardTo",
    "LockDuration",
    "MaxDeliveryCount",
    "RequiresSession",
];

/// The duplicate detection keys [`read_sender_properties`] reads (besides the size limit).
const DUPLICATE_DETECTION_KEYS: &[&str] = &[
    "DuplicateDetectionHistoryTimeWindow",
    "RequiresDuplicateDetection",
];

/// The `Properties` keys an entity allows, from `groups` (and the size limit when
/// `max_size`), in the order an unknown-field error lists them: sorted, the size limit last.
fn property_keys(groups: &[&[&'static str]], max_size: bool) -> Vec<&'static str> {
    let mut keys = groups.concat();
    keys.sort_unstable();
    if max_size {
        keys.push("MaxMessageSizeInKilobytes");
    }
    keys
}

/// The properties queues and topics share, on the sending side: the duplicate detection
/// window, whether duplicates are detected, and the maximum message size.
type SendingSide<'a> = (&'a mut Duration, &'a mut bool, &'a mut usize);

/// The entities messages are sent to (queues, topics), for [`read_sender_properties`].
trait SendingEntity {
    fn sending_side(&mut self) -> SendingSide<'_>;
}

impl SendingEntity for EntityProperties {
    fn sending_side(&mut self) -> SendingSide<'_> {
        let window = &mut self.duplicate_detection_history_time_window;
        (
            window,
            &mut self.requires_duplicate_detection,
            &mut self.max_message_size,
        )
    }
}

impl SendingEntity for TopicProperties {
    fn sending_side(&mut self) -> SendingSide<'_> {
        let window = &mut self.duplicate_detection_history_time_window;
        (
            window,
            &mut self.requires_duplicate_detection,
            &mut self.max_message_size,
        )
    }
}

/// Reads the [`SendingSide`] properties (each left as it is when absent).
fn read_sender_properties(p: &Obj<'_>, side: SendingSide<'_>) -> Result<(), ConfigError> {
    let (duplicate_detection_window, requires_duplicate_detection, max_message_size) = side;
    if let Some(v) = p.duration("DuplicateDetectionHistoryTimeWindow")? {
        *duplicate_detection_window = v;
    }
    if let Some(v) = p.boolean("RequiresDuplicateDetection")? {
        *requires_duplicate_detection = v;
    }
    if let Some(v) = p.max_message_size()? {
        *max_message_size = v;
    }
    Ok(())
}

/// The properties of the entities messages are received from (queues, subscriptions).
fn read_receiver_properties(p: &Obj<'_>, props: &mut EntityProperties) -> Result<(), ConfigError> {
    if let Some(v) = p.boolean("DeadLetteringOnMessageExpiration")? {
        props.dead_lettering_on_message_expiration = v;
    }
    if let Some(v) = p.duration(TIME_TO_LIVE)? {
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
        p.allow(&property_keys(&[RECEIVER_KEYS], false))?;
        read_receiver_properties(&p, &mut properties)?;
    }
    let rules = s.each("Rules", parse_rule)?;
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
            match a.string("SqlExpression")? {
                None => None,
                Some(text) => match SqlRuleAction::parse(text) {
                    Ok(action) => Some(action),
                    Err(e) => {
                        return invalid(
                            a.child("SqlExpression"),
                            format!("invalid SQL rule action {text:?}: {e}"),
                        );
                    }
                },
            }
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

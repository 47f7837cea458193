//! Atom entries and feeds of the management API: descriptions rendered from the broker, and the
//! descriptions clients send read back into entity properties and rules.
//!
//! The element names, their XML namespaces and the `i:type` of filters, actions and key-value
//! pairs follow what the official clients read and write: Python
//! `azure/servicebus/management/_generated/models/_models.py` (`QueueDescription`,
//! `MessageCountDetails` in the `2011/06/servicebus` namespace, `KeyValue` as
//! `KeyValueOfstringanyType`) and `_utils.py` (`deserialize_value`: `int`, `long`, `boolean`,
//! `double`, `dateTime` types); JavaScript `@azure/service-bus` `src/util/atomXmlHelper.ts`
//! (`setName` takes entity names from the entry's `id` path, `/Subscriptions/` and `/Rules/`
//! capitalised; an empty feed means "not found") and `src/serializers/ruleResourceSerializer.ts`
//! (`getKeyValuePairsOrUndefined` reads the `i:type` attribute of `Value` after a five-character
//! prefix such as `d6p1:`).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::broker::{DescribedProperties, EntityDescription};
use crate::config::{EntityProperties, TopicProperties};
use crate::duration::{format_iso8601_duration, parse_iso8601_duration};
use crate::filter::{CorrelationFilter, Filter, Rule};
use crate::message::{Properties, PropertyValue};
use crate::sql_filter::{SqlFilter, SqlRuleAction};

use super::xml::{Element, escape};

const ATOM_NS: &str = "http://www.w3.org/2005/Atom";
const SB_NS: &str = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect";
const COUNTS_NS: &str = "http://schemas.microsoft.com/netservices/2011/06/servicebus";
const XSI_NS: &str = "http://www.w3.org/2001/XMLSchema-instance";
const XSD_NS: &str = "http://www.w3.org/2001/XMLSchema";
/// .NET's `TimeSpan.MaxValue`, what the service reports for "never" (`AutoDeleteOnIdle`).
const TIMESPAN_MAX: &str = "P10675199DT2H48M5.4775807S";

/// RFC 3339 UTC time with milliseconds (`2026-12-04T17:03:09.123Z`).
pub(crate) fn format_time(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's days-from-civil inverse.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// One Atom `entry`; `id` is the entity's URL (clients take names from its path).
pub(crate) fn entry(
    id: &str,
    title: &str,
    times: (SystemTime, SystemTime),
    content: &str,
) -> String {
    format!(
        r#"<entry xmlns="{ATOM_NS}"><id>{id}</id><title type="text">{title}</title><published>{published}</published><updated>{updated}</updated><link rel="self" href="{id}"/><content type="application/xml">{content}</content></entry>"#,
        id = escape(id),
        title = escape(title),
        published = format_time(times.0),
        updated = format_time(times.1),
    )
}

/// An Atom `feed` of entries (each from [`entry`], without its XML declaration); `next` is
/// the link to the following page, when there is one.
pub(crate) fn feed(
    id: &str,
    title: &str,
    now: SystemTime,
    entries: &[String],
    next: Option<&str>,
) -> String {
    let mut out = format!(
        r#"<feed xmlns="{ATOM_NS}"><title type="text">{title}</title><id>{id}</id><updated>{updated}</updated><link rel="self" href="{id}"/>"#,
        id = escape(id),
        title = escape(title),
        updated = format_time(now)
    );
    if let Some(next) = next {
        let _ = write!(out, r#"<link rel="next" href="{}"/>"#, escape(next));
    }
    for e in entries {
        out.push_str(e);
    }
    out.push_str("</feed>");
    out
}

/// The error body the service sends with a 4xx/5xx answer.
pub(crate) fn error(code: u16, detail: &str) -> String {
    format!(
        "<Error><Code>{code}</Code><Detail>{}</Detail></Error>",
        escape(detail)
    )
}

fn counts_xml(description: &EntityDescription) -> String {
    let c = &description.counts;
    format!(
        r#"<CountDetails xmlns:d2p1="{COUNTS_NS}"><d2p1:ActiveMessageCount>{}</d2p1:ActiveMessageCount><d2p1:DeadLetterMessageCount>{}</d2p1:DeadLetterMessageCount><d2p1:ScheduledMessageCount>{}</d2p1:ScheduledMessageCount><d2p1:TransferMessageCount>0</d2p1:TransferMessageCount><d2p1:TransferDeadLetterMessageCount>0</d2p1:TransferDeadLetterMessageCount></CountDetails>"#,
        c.active + c.locked + c.deferred,
        c.dead_lettered,
        c.scheduled
    )
}

fn message_count(description: &EntityDescription) -> usize {
    let c = &description.counts;
    c.active + c.locked + c.deferred + c.scheduled + c.dead_lettered
}

fn duration(d: Duration) -> String {
    format_iso8601_duration(d)
}

fn optional(name: &str, value: Option<&str>) -> String {
    value.map_or_else(String::new, |v| format!("<{name}>{}</{name}>", escape(v)))
}

/// The `QueueDescription`, `TopicDescription` or `SubscriptionDescription` element.
pub(crate) fn description(d: &EntityDescription) -> String {
    let times = format!(
        "<CreatedAt>{}</CreatedAt><UpdatedAt>{}</UpdatedAt><AccessedAt>{}</AccessedAt>",
        format_time(d.created),
        format_time(d.updated),
        format_time(d.updated)
    );
    match &d.properties {
        DescribedProperties::Queue(p) => format!(
            r#"<QueueDescription xmlns="{SB_NS}" xmlns:i="{XSI_NS}"><LockDuration>{}</LockDuration><MaxSizeInMegabytes>1024</MaxSizeInMegabytes><RequiresDuplicateDetection>{}</RequiresDuplicateDetection><RequiresSession>{}</RequiresSession><DefaultMessageTimeToLive>{}</DefaultMessageTimeToLive><DeadLetteringOnMessageExpiration>{}</DeadLetteringOnMessageExpiration><DuplicateDetectionHistoryTimeWindow>{}</DuplicateDetectionHistoryTimeWindow><MaxDeliveryCount>{}</MaxDeliveryCount><EnableBatchedOperations>true</EnableBatchedOperations><SizeInBytes>0</SizeInBytes><MessageCount>{}</MessageCount><IsAnonymousAccessible>false</IsAnonymousAccessible><AuthorizationRules/><Status>Active</Status>{}{}{times}<SupportOrdering>true</SupportOrdering>{}<AutoDeleteOnIdle>{TIMESPAN_MAX}</AutoDeleteOnIdle><EnablePartitioning>false</EnablePartitioning><EntityAvailabilityStatus>Available</EntityAvailabilityStatus><EnableExpress>false</EnableExpress><MaxMessageSizeInKilobytes>{}</MaxMessageSizeInKilobytes></QueueDescription>"#,
            duration(p.lock_duration),
            p.requires_duplicate_detection,
            p.requires_session,
            duration(p.default_message_time_to_live),
            p.dead_lettering_on_message_expiration,
            duration(p.duplicate_detection_history_time_window),
            p.max_delivery_count,
            message_count(d),
            optional("ForwardTo", p.forward_to.as_deref()),
            optional(
                "ForwardDeadLetteredMessagesTo",
                p.forward_dead_lettered_messages_to.as_deref()
            ),
            counts_xml(d),
            p.max_message_size / 1024,
        ),
        DescribedProperties::Topic(p) => format!(
            r#"<TopicDescription xmlns="{SB_NS}" xmlns:i="{XSI_NS}"><DefaultMessageTimeToLive>{}</DefaultMessageTimeToLive><MaxSizeInMegabytes>1024</MaxSizeInMegabytes><RequiresDuplicateDetection>{}</RequiresDuplicateDetection><DuplicateDetectionHistoryTimeWindow>{}</DuplicateDetectionHistoryTimeWindow><EnableBatchedOperations>true</EnableBatchedOperations><SizeInBytes>0</SizeInBytes><FilteringMessagesBeforePublishing>false</FilteringMessagesBeforePublishing><IsAnonymousAccessible>false</IsAnonymousAccessible><AuthorizationRules/><Status>Active</Status>{times}<SupportOrdering>true</SupportOrdering>{}<SubscriptionCount>{}</SubscriptionCount><AutoDeleteOnIdle>{TIMESPAN_MAX}</AutoDeleteOnIdle><EnablePartitioning>false</EnablePartitioning><EntityAvailabilityStatus>Available</EntityAvailabilityStatus><EnableSubscriptionPartitioning>false</EnableSubscriptionPartitioning><EnableExpress>false</EnableExpress><MaxMessageSizeInKilobytes>{}</MaxMessageSizeInKilobytes></TopicDescription>"#,
            duration(p.default_message_time_to_live),
            p.requires_duplicate_detection,
            duration(p.duplicate_detection_history_time_window),
            counts_xml(d),
            d.subscription_count,
            p.max_message_size / 1024,
        ),
        DescribedProperties::Subscription(p) => format!(
            r#"<SubscriptionDescription xmlns="{SB_NS}" xmlns:i="{XSI_NS}"><LockDuration>{}</LockDuration><RequiresSession>{}</RequiresSession><DefaultMessageTimeToLive>{}</DefaultMessageTimeToLive><DeadLetteringOnMessageExpiration>{}</DeadLetteringOnMessageExpiration><DeadLetteringOnFilterEvaluationExceptions>{}</DeadLetteringOnFilterEvaluationExceptions><MessageCount>{}</MessageCount><MaxDeliveryCount>{}</MaxDeliveryCount><EnableBatchedOperations>true</EnableBatchedOperations><Status>Active</Status>{}{times}{}{}<AutoDeleteOnIdle>{TIMESPAN_MAX}</AutoDeleteOnIdle><EntityAvailabilityStatus>Available</EntityAvailabilityStatus></SubscriptionDescription>"#,
            duration(p.lock_duration),
            p.requires_session,
            duration(p.default_message_time_to_live),
            p.dead_lettering_on_message_expiration,
            p.dead_lettering_on_filter_evaluation_exceptions,
            message_count(d),
            p.max_delivery_count,
            optional("ForwardTo", p.forward_to.as_deref()),
            counts_xml(d),
            optional(
                "ForwardDeadLetteredMessagesTo",
                p.forward_dead_lettered_messages_to.as_deref()
            ),
        ),
    }
}

fn key_values(properties: &Properties) -> String {
    let mut out = String::from("<Properties>");
    for (key, value) in properties {
        let (kind, text) = match value {
            PropertyValue::Bool(b) => ("boolean", b.to_string()),
            PropertyValue::Long(n) if i32::try_from(*n).is_ok() => ("int", n.to_string()),
            PropertyValue::Long(n) => ("long", n.to_string()),
            PropertyValue::Double(f) => ("double", f.to_string()),
            PropertyValue::Timestamp(t) => ("dateTime", format_time(*t)),
            PropertyValue::String(s) => ("string", s.clone()),
            PropertyValue::Uuid(u) => ("string", u.to_string()),
            PropertyValue::Null | PropertyValue::Binary(_) => continue,
        };
        let _ = write!(
            out,
            r#"<KeyValueOfstringanyType><Key>{}</Key><Value i:type="d6p1:{kind}" xmlns:d6p1="{XSD_NS}">{}</Value></KeyValueOfstringanyType>"#,
            escape(key),
            escape(&text)
        );
    }
    out.push_str("</Properties>");
    out
}

/// The `RuleDescription` element.
pub(crate) fn rule(rule: &Rule, created: SystemTime) -> String {
    let filter = match &rule.filter {
        Filter::True => r#"<Filter i:type="TrueFilter"><SqlExpression>1=1</SqlExpression><CompatibilityLevel>20</CompatibilityLevel></Filter>"#.to_owned(),
        Filter::False => r#"<Filter i:type="FalseFilter"><SqlExpression>1=0</SqlExpression><CompatibilityLevel>20</CompatibilityLevel></Filter>"#.to_owned(),
        Filter::Sql(sql) => format!(
            r#"<Filter i:type="SqlFilter"><SqlExpression>{}</SqlExpression><CompatibilityLevel>20</CompatibilityLevel></Filter>"#,
            escape(sql.expression())
        ),
        Filter::Correlation(c) => format!(
            r#"<Filter i:type="CorrelationFilter">{}{}{}{}{}{}{}{}{}</Filter>"#,
            optional("CorrelationId", c.correlation_id.as_deref()),
            optional("MessageId", c.message_id.as_deref()),
            optional("To", c.to.as_deref()),
            optional("ReplyTo", c.reply_to.as_deref()),
            optional("Label", c.label.as_deref()),
            optional("SessionId", c.session_id.as_deref()),
            optional("ReplyToSessionId", c.reply_to_session_id.as_deref()),
            optional("ContentType", c.content_type.as_deref()),
            key_values(&c.properties),
        ),
    };
    let action = match &rule.action {
        Some(sql) => format!(
            r#"<Action i:type="SqlRuleAction"><SqlExpression>{}</SqlExpression><CompatibilityLevel>20</CompatibilityLevel></Action>"#,
            escape(sql.expression())
        ),
        None => r#"<Action i:type="EmptyRuleAction"/>"#.to_owned(),
    };
    format!(
        r#"<RuleDescription xmlns="{SB_NS}" xmlns:i="{XSI_NS}">{filter}{action}<CreatedAt>{}</CreatedAt><Name>{}</Name></RuleDescription>"#,
        format_time(created),
        escape(&rule.name)
    )
}

/// Why a description in a request body was refused (400).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadDescription(pub(crate) String);

fn bad(what: impl Into<String>) -> BadDescription {
    BadDescription(what.into())
}

fn get_duration(el: &Element, name: &str, default: Duration) -> Result<Duration, BadDescription> {
    match el.text_of(name) {
        None => Ok(default),
        Some(text) => parse_iso8601_duration(text)
            .ok_or_else(|| bad(format!("{name}: {text:?} is not an ISO 8601 duration"))),
    }
}

fn get_bool(el: &Element, name: &str, default: bool) -> Result<bool, BadDescription> {
    match el.text_of(name) {
        None => Ok(default),
        Some(t) if t.eq_ignore_ascii_case("true") => Ok(true),
        Some(t) if t.eq_ignore_ascii_case("false") => Ok(false),
        Some(t) => Err(bad(format!("{name}: {t:?} is not a boolean"))),
    }
}

fn get_number<T: std::str::FromStr>(
    el: &Element,
    name: &str,
    default: T,
) -> Result<T, BadDescription> {
    match el.text_of(name) {
        None => Ok(default),
        Some(t) => t
            .parse()
            .map_err(|_| bad(format!("{name}: {t:?} is not a number"))),
    }
}

/// A forwarding target as clients send it: a name, or the entity's URL (the .NET client
/// sends `https://<namespace>/<entity>`); the name either way.
fn forward_target(el: &Element, name: &str) -> Option<String> {
    el.text_of(name).map(|t| match t.split_once("://") {
        Some((_, rest)) => rest
            .split_once('/')
            .map_or(rest, |(_, path)| path)
            .trim_matches('/')
            .to_owned(),
        None => t.to_owned(),
    })
}

/// The description element (`name`) inside an Atom entry body.
#[cfg(test)]
pub(crate) fn content<'a>(entry: &'a Element, name: &str) -> Result<&'a Element, BadDescription> {
    entry
        .find(name)
        .ok_or_else(|| bad(format!("the request body has no {name}")))
}

/// Queue or subscription properties from a `QueueDescription` / `SubscriptionDescription`;
/// what is missing takes the service's default ([`EntityProperties::service_defaults`]), not
/// `Config.json`'s.
pub(crate) fn entity_properties(el: &Element) -> Result<EntityProperties, BadDescription> {
    let d = EntityProperties::service_defaults();
    let max_size_kb: usize =
        get_number(el, "MaxMessageSizeInKilobytes", d.max_message_size / 1024)?;
    let max_delivery_count = get_number(el, "MaxDeliveryCount", d.max_delivery_count)?;
    if max_delivery_count == 0 {
        return Err(bad("MaxDeliveryCount must be at least 1"));
    }
    Ok(EntityProperties {
        dead_lettering_on_message_expiration: get_bool(
            el,
            "DeadLetteringOnMessageExpiration",
            d.dead_lettering_on_message_expiration,
        )?,
        default_message_time_to_live: get_duration(
            el,
            "DefaultMessageTimeToLive",
            d.default_message_time_to_live,
        )?,
        duplicate_detection_history_time_window: get_duration(
            el,
            "DuplicateDetectionHistoryTimeWindow",
            d.duplicate_detection_history_time_window,
        )?,
        forward_dead_lettered_messages_to: forward_target(el, "ForwardDeadLetteredMessagesTo"),
        forward_to: forward_target(el, "ForwardTo"),
        lock_duration: get_duration(el, "LockDuration", d.lock_duration)?,
        max_delivery_count,
        requires_duplicate_detection: get_bool(
            el,
            "RequiresDuplicateDetection",
            d.requires_duplicate_detection,
        )?,
        requires_session: get_bool(el, "RequiresSession", d.requires_session)?,
        max_message_size: max_size_kb.saturating_mul(1024),
        // A subscription's setting only (queues have no filters).
        dead_lettering_on_filter_evaluation_exceptions: el
            .name
            .ends_with("SubscriptionDescription")
            && get_bool(
                el,
                "DeadLetteringOnFilterEvaluationExceptions",
                d.dead_lettering_on_filter_evaluation_exceptions,
            )?,
    })
}

/// Topic properties from a `TopicDescription`.
pub(crate) fn topic_properties(el: &Element) -> Result<TopicProperties, BadDescription> {
    let d = TopicProperties::service_defaults();
    let max_size_kb: usize =
        get_number(el, "MaxMessageSizeInKilobytes", d.max_message_size / 1024)?;
    Ok(TopicProperties {
        default_message_time_to_live: get_duration(
            el,
            "DefaultMessageTimeToLive",
            d.default_message_time_to_live,
        )?,
        duplicate_detection_history_time_window: get_duration(
            el,
            "DuplicateDetectionHistoryTimeWindow",
            d.duplicate_detection_history_time_window,
        )?,
        requires_duplicate_detection: get_bool(
            el,
            "RequiresDuplicateDetection",
            d.requires_duplicate_detection,
        )?,
        max_message_size: max_size_kb.saturating_mul(1024),
    })
}

fn property_value(value: &Element) -> PropertyValue {
    let text = value.text.clone();
    match value.xsi_type.as_deref() {
        Some("int" | "long" | "short" | "byte") => text
            .trim()
            .parse()
            .map_or(PropertyValue::String(text), PropertyValue::Long),
        Some("double" | "float" | "decimal") => text
            .trim()
            .parse()
            .map_or(PropertyValue::String(text), PropertyValue::Double),
        Some("boolean") => PropertyValue::Bool(text.trim().eq_ignore_ascii_case("true")),
        _ => PropertyValue::String(text),
    }
}

/// `expression` with its `@name` parameters (`Parameters` of a `SqlFilter`, as Python's
/// `SqlRuleFilter(…, parameters={"@p": 1})` sends them) replaced by literals, longest names
/// first, since the emulator's SQL subset has no parameters. A parameter name inside a
/// string literal is replaced too (no real expression does that).
fn with_parameters(expression: &str, parameters: Option<&Element>) -> String {
    let mut pairs: Vec<(String, String)> = parameters
        .map(|p| {
            p.children
                .iter()
                .filter(|c| c.name == "KeyValueOfstringanyType")
                .filter_map(|kv| {
                    let key = kv.text_of("Key")?.to_owned();
                    let literal = match property_value(kv.child("Value")?) {
                        PropertyValue::Long(n) => n.to_string(),
                        PropertyValue::Double(f) => f.to_string(),
                        PropertyValue::Bool(b) => if b { "TRUE" } else { "FALSE" }.to_owned(),
                        PropertyValue::String(s) => format!("'{}'", s.replace('\'', "''")),
                        _ => return None,
                    };
                    Some((key, literal))
                })
                .collect()
        })
        .unwrap_or_default();
    pairs.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    let mut out = expression.to_owned();
    for (key, literal) in pairs {
        out = out.replace(&key, &literal);
    }
    unbound_to_null(&out)
}

/// Parameters the client did not send become `NULL`, so the rule is stored and matches as
/// an unknown value would: Python's `update_rule(…, filter=SqlRuleFilter(expr, parameters))`
/// sends the expression with an empty `Parameters` (its keyword path drops them), and the
/// service accepts that request (the SDK's `mgmt_rule.py` sample makes it).
fn unbound_to_null(expression: &str) -> String {
    let mut out = String::with_capacity(expression.len());
    let mut chars = expression.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == '@' && !quoted {
            while chars
                .peek()
                .is_some_and(|n| n.is_ascii_alphanumeric() || *n == '_')
            {
                chars.next();
            }
            out.push_str("NULL");
        } else {
            out.push(c);
        }
    }
    out
}

/// A rule from a `RuleDescription` (named `name`, the URL's last segment).
pub(crate) fn rule_from(el: &Element, name: &str) -> Result<Rule, BadDescription> {
    let filter = match el.child("Filter") {
        None => Filter::True,
        Some(f) => match f.xsi_type.as_deref() {
            Some("CorrelationFilter") => {
                let mut properties = Properties::new();
                if let Some(props) = f.child("Properties") {
                    for kv in props
                        .children
                        .iter()
                        .filter(|c| c.name == "KeyValueOfstringanyType")
                    {
                        let key = kv.text_of("Key").unwrap_or_default().to_owned();
                        let value = kv
                            .child("Value")
                            .map_or(PropertyValue::Null, property_value);
                        properties.insert(key, value);
                    }
                }
                let text = |n: &str| f.text_of(n).map(str::to_owned);
                Filter::Correlation(CorrelationFilter {
                    content_type: text("ContentType"),
                    correlation_id: text("CorrelationId"),
                    label: text("Label"),
                    message_id: text("MessageId"),
                    reply_to: text("ReplyTo"),
                    reply_to_session_id: text("ReplyToSessionId"),
                    session_id: text("SessionId"),
                    to: text("To"),
                    properties,
                })
            }
            Some("TrueFilter") => Filter::True,
            Some("FalseFilter") => Filter::False,
            _ => {
                let expression = with_parameters(
                    f.text_of("SqlExpression").unwrap_or("1=1"),
                    f.child("Parameters"),
                );
                let expression = expression.as_str();
                match expression.replace(' ', "").as_str() {
                    "1=1" => Filter::True,
                    "1=0" => Filter::False,
                    _ => Filter::Sql(
                        SqlFilter::parse(expression)
                            .map_err(|e| bad(format!("SqlExpression {expression:?}: {e}")))?,
                    ),
                }
            }
        },
    };
    // A bad action is refused with the rule, as the service answers 400 for it.
    let action = el
        .child("Action")
        .and_then(|a| a.text_of("SqlExpression"))
        .map(|text| {
            SqlRuleAction::parse(text).map_err(|e| bad(format!("SqlRuleAction {text:?}: {e}")))
        })
        .transpose()?;
    Ok(Rule {
        name: name.to_owned(),
        filter,
        action,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::xml::parse;

    #[test]
    fn times_are_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::from_millis(1_780_000_000_123);
        assert_eq!(format_time(t), "2026-05-28T20:26:40.123Z");
        assert_eq!(format_time(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn a_queue_description_round_trips() {
        let props = EntityProperties {
            lock_duration: Duration::from_secs(45),
            max_delivery_count: 7,
            requires_session: true,
            forward_to: Some("elsewhere".into()),
            ..EntityProperties::default()
        };
        let d = EntityDescription {
            name: "q".into(),
            properties: DescribedProperties::Queue(props.clone()),
            counts: Default::default(),
            created: UNIX_EPOCH,
            updated: UNIX_EPOCH,
            subscription_count: 0,
        };
        let body = entry(
            "https://localhost/q?api-version=2021-05",
            "q",
            (UNIX_EPOCH, UNIX_EPOCH),
            &description(&d),
        );
        let doc = parse(body.as_bytes()).unwrap();
        let back = entity_properties(content(&doc, "QueueDescription").unwrap()).unwrap();
        assert_eq!(back, props);
    }

    /// An entity created over the management API without options gets the service's defaults,
    /// not `Config.json`'s (protocol3 emulator fidelity): MaxDeliveryCount 10,
    /// DefaultMessageTimeToLive never (`TimeSpan.MaxValue`), duplicate detection 10 min.
    #[test]
    fn an_entity_created_without_options_gets_the_services_defaults() {
        let body = br#"<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"/></content></entry>"#;
        let doc = parse(body).unwrap();
        let queue = entity_properties(content(&doc, "QueueDescription").unwrap()).unwrap();
        assert_eq!(queue.max_delivery_count, 10);
        assert_eq!(
            format_iso8601_duration(queue.default_message_time_to_live),
            TIMESPAN_MAX
        );
        assert_eq!(
            queue.duplicate_detection_history_time_window,
            Duration::from_secs(600)
        );
        assert_eq!(queue.lock_duration, Duration::from_secs(60));
        let body = br#"<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><SubscriptionDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"/></content></entry>"#;
        let doc = parse(body).unwrap();
        let sub = entity_properties(content(&doc, "SubscriptionDescription").unwrap()).unwrap();
        assert_eq!(sub.max_delivery_count, 10);
        assert_eq!(
            sub.default_message_time_to_live,
            queue.default_message_time_to_live
        );
        assert!(sub.dead_lettering_on_filter_evaluation_exceptions);
        let body = br#"<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><TopicDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"/></content></entry>"#;
        let doc = parse(body).unwrap();
        let topic = topic_properties(content(&doc, "TopicDescription").unwrap()).unwrap();
        assert_eq!(
            topic.default_message_time_to_live,
            queue.default_message_time_to_live
        );
        assert_eq!(
            topic.duplicate_detection_history_time_window,
            Duration::from_secs(600)
        );
    }

    #[test]
    fn rules_read_what_the_sdks_send() {
        // As JS `buildInternalRuleResource` + core-xml write a correlation rule.
        let body = br#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><RuleDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect" xmlns:p4="http://www.w3.org/2001/XMLSchema-instance"><Filter p4:type="CorrelationFilter"><CorrelationId>c</CorrelationId><Label>red</Label><Properties><KeyValueOfstringanyType><Key>n</Key><Value p4:type="l28:int" xmlns:l28="http://www.w3.org/2001/XMLSchema">5</Value></KeyValueOfstringanyType></Properties></Filter><Action p4:type="SqlRuleAction"><SqlExpression>SET x = 1</SqlExpression></Action><Name>r</Name></RuleDescription></content></entry>"#;
        let doc = parse(body).unwrap();
        let rule = rule_from(content(&doc, "RuleDescription").unwrap(), "r").unwrap();
        let Filter::Correlation(c) = &rule.filter else {
            panic!("{rule:?}")
        };
        assert_eq!(c.correlation_id.as_deref(), Some("c"));
        assert_eq!(c.label.as_deref(), Some("red"));
        assert!(matches!(
            c.properties.get("n"),
            Some(PropertyValue::Long(5))
        ));
        assert_eq!(
            rule.action.as_ref().map(SqlRuleAction::expression),
            Some("SET x = 1")
        );
        // And renders back with the value's type after a five-character prefix.
        let xml = super::rule(&rule, UNIX_EPOCH);
        assert!(xml.contains(r#"<Value i:type="d6p1:int""#), "{xml}");
        let sql = parse(br#"<RuleDescription><Filter i:type="SqlFilter"><SqlExpression>color = 'blue'</SqlExpression></Filter></RuleDescription>"#).unwrap();
        assert!(matches!(
            rule_from(&sql, "s").unwrap().filter,
            Filter::Sql(_)
        ));
        let with_params = parse(br#"<RuleDescription><Filter i:type="SqlFilter"><SqlExpression>p1 = @param1 AND p2 = @param2</SqlExpression><Parameters><KeyValueOfstringanyType><Key>@param1</Key><Value i:type="d6p1:string">it's</Value></KeyValueOfstringanyType><KeyValueOfstringanyType><Key>@param2</Key><Value i:type="d6p1:int">2</Value></KeyValueOfstringanyType></Parameters></Filter></RuleDescription>"#).unwrap();
        let Filter::Sql(sql) = rule_from(&with_params, "p").unwrap().filter else {
            panic!("a SQL filter")
        };
        assert_eq!(sql.expression(), "p1 = 'it''s' AND p2 = 2");
        assert_eq!(
            unbound_to_null("a = @p1 AND b = '@x'"),
            "a = NULL AND b = '@x'"
        );
        let unbound = parse(br#"<RuleDescription><Filter i:type="SqlFilter"><SqlExpression>property1 = @param1 AND property2 = @param2</SqlExpression><Parameters/></Filter></RuleDescription>"#).unwrap();
        assert!(matches!(
            rule_from(&unbound, "u").unwrap().filter,
            Filter::Sql(_)
        ));
        let broken = parse(br#"<RuleDescription><Filter i:type="SqlFilter"><SqlExpression>color = </SqlExpression></Filter></RuleDescription>"#).unwrap();
        assert!(rule_from(&broken, "s").is_err());
        let bad_action = parse(br#"<RuleDescription><Filter i:type="TrueFilter"><SqlExpression>1=1</SqlExpression></Filter><Action i:type="SqlRuleAction"><SqlExpression>SET a = 1 + 1</SqlExpression></Action></RuleDescription>"#).unwrap();
        assert!(
            rule_from(&bad_action, "a").is_err(),
            "a bad action is a 400"
        );
    }
}

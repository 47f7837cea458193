//! Reading entity descriptions from Atom entries, and writing the description a create or
//! update sends.
//!
//! Element names and namespaces as the official clients read and write them: Python
//! `azure/servicebus/management/_generated/models/_models.py` (`QueueDescription`,
//! `SubscriptionDescription`, `MessageCountDetails` in the `2011/06/servicebus` namespace),
//! JavaScript `@azure/service-bus` `src/serializers/queueResourceSerializer.ts`
//! (`buildQueueOptions`: the element order the service's data contract expects on a `PUT`),
//! .NET `QueuePropertiesExtensions.Serialize`. A `GET` of a missing entity answers an empty
//! `feed` (JS `getResource`, Python `_management_client.py`).

use std::time::Duration;

use quick_xml::Reader;
use quick_xml::events::Event;

use super::{AdminError, EntityCounts, EntityProperties, NamespaceProperties};

const SB_NS: &str = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect";
const XSI_NS: &str = "http://www.w3.org/2001/XMLSchema-instance";

/// Parses an ISO 8601 duration as the service writes them (`PT1M`, `P14D`,
/// `P10675199DT2H48M5.4775807S`); `None` for anything else.
pub(super) fn parse_duration(text: &str) -> Option<Duration> {
    let rest = text.trim().strip_prefix('P')?;
    let (date, time) = rest.split_once('T').unwrap_or((rest, ""));
    let mut total = 0f64;
    let mut read = |part: &str, units: &[(char, f64)]| -> Option<()> {
        let mut number = String::new();
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' {
                number.push(c);
            } else {
                let unit = units.iter().find(|(u, _)| *u == c)?.1;
                total += number.parse::<f64>().ok()? * unit;
                number.clear();
            }
        }
        number.is_empty().then_some(())
    };
    read(date, &[('D', 86_400.0), ('W', 604_800.0)])?;
    read(time, &[('H', 3_600.0), ('M', 60.0), ('S', 1.0)])?;
    Duration::try_from_secs_f64(total).ok()
}

/// Formats a duration as ISO 8601 seconds (`PT90S`, `PT0.5S`), which the service accepts.
pub(super) fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("PT{}S", d.as_secs())
    } else {
        format!("PT{}S", d.as_secs_f64())
    }
}

/// The texts of an entry's description elements by local name (the first of each), and
/// whether it had a description at all.
#[derive(Debug, Default)]
struct Fields {
    found: Option<String>,
    values: Vec<(String, String)>,
}

impl Fields {
    fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn local(name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    name.rsplit(':').next().unwrap_or_default().to_owned()
}

fn read_fields(xml: &str) -> Result<Fields, AdminError> {
    const DESCRIPTIONS: [&str; 4] = [
        "QueueDescription",
        "SubscriptionDescription",
        "TopicDescription",
        "NamespaceInfo",
    ];
    let mut reader = Reader::from_str(xml);
    let mut fields = Fields::default();
    let mut path: Vec<String> = Vec::new();
    loop {
        match reader
            .read_event()
            .map_err(|e| AdminError::Malformed(e.to_string()))?
        {
            Event::Start(e) => {
                let name = local(e.name().as_ref());
                if DESCRIPTIONS.contains(&name.as_str()) && fields.found.is_none() {
                    fields.found = Some(name.clone());
                }
                path.push(name);
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Text(t) if fields.found.is_some() => {
                let text = t
                    .decode()
                    .map_err(|e| AdminError::Malformed(e.to_string()))?;
                let text = quick_xml::escape::unescape(&text)
                    .map_err(|e| AdminError::Malformed(e.to_string()))?;
                if let Some(name) = path.last()
                    && fields.get(name).is_none()
                {
                    fields.values.push((name.clone(), text.trim().to_owned()));
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    Ok(fields)
}

/// The properties and counts of the entity an entry describes; `None` for an empty feed (no
/// such entity).
pub(super) fn read_entity(
    xml: &str,
) -> Result<Option<(EntityProperties, EntityCounts)>, AdminError> {
    let fields = read_fields(xml)?;
    if fields.found.is_none() {
        return Ok(None);
    }
    let duration = |name: &str| -> Result<Option<Duration>, AdminError> {
        fields
            .get(name)
            .map(|t| {
                parse_duration(t).ok_or_else(|| {
                    AdminError::Malformed(format!("{name}: {t:?} is not a duration"))
                })
            })
            .transpose()
    };
    let number = |name: &str| fields.get(name).and_then(|t| t.parse::<u64>().ok());
    let flag = |name: &str| {
        fields
            .get(name)
            .is_some_and(|t| t.eq_ignore_ascii_case("true"))
    };
    let text = |name: &str| {
        fields
            .get(name)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
    };
    let properties = EntityProperties {
        lock_duration: duration("LockDuration")?,
        default_message_time_to_live: duration("DefaultMessageTimeToLive")?,
        max_delivery_count: number("MaxDeliveryCount").and_then(|n| u32::try_from(n).ok()),
        requires_session: flag("RequiresSession"),
        dead_lettering_on_message_expiration: flag("DeadLetteringOnMessageExpiration"),
        forward_to: text("ForwardTo"),
        forward_dead_lettered_messages_to: text("ForwardDeadLetteredMessagesTo"),
    };
    let counts = EntityCounts {
        total: number("MessageCount").unwrap_or(0),
        active: number("ActiveMessageCount").unwrap_or(0),
        dead_letter: number("DeadLetterMessageCount").unwrap_or(0),
        scheduled: number("ScheduledMessageCount").unwrap_or(0),
        transfer: number("TransferMessageCount").unwrap_or(0),
        transfer_dead_letter: number("TransferDeadLetterMessageCount").unwrap_or(0),
    };
    Ok(Some((properties, counts)))
}

/// The namespace an `$namespaceinfo` entry describes; `None` when the entry has no
/// `NamespaceInfo` (.NET `NamespacePropertiesExtensions.ParseFromEntryElement` reads the same
/// elements: `Name`, `MessagingSKU`, `MessagingUnits`, `NamespaceType`, `CreatedTime`).
pub(super) fn read_namespace(xml: &str) -> Result<Option<NamespaceProperties>, AdminError> {
    let fields = read_fields(xml)?;
    if fields.found.as_deref() != Some("NamespaceInfo") {
        return Ok(None);
    }
    let text = |name: &str| {
        fields
            .get(name)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
    };
    Ok(Some(NamespaceProperties {
        name: text("Name"),
        messaging_sku: text("MessagingSKU"),
        messaging_units: fields
            .get("MessagingUnits")
            .and_then(|t| t.parse::<u32>().ok()),
        namespace_type: text("NamespaceType"),
        created: text("CreatedTime"),
    }))
}

/// The `Detail` of an error body, or the body itself.
pub(super) fn error_detail(xml: &str) -> String {
    let detail = xml
        .split_once("<Detail>")
        .and_then(|(_, rest)| rest.split_once("</Detail>"))
        .map(|(d, _)| d.to_owned());
    let text = detail.unwrap_or_else(|| xml.to_owned());
    quick_xml::escape::unescape(&text)
        .map(|t| t.into_owned())
        .unwrap_or(text)
}

fn escape(text: &str) -> String {
    quick_xml::escape::escape(text).into_owned()
}

/// The entry a create or update of a queue (`subscription == false`) or subscription sends,
/// in the element order of the service's data contract.
pub(super) fn description_entry(properties: &EntityProperties, subscription: bool) -> String {
    let mut inner = String::new();
    let mut element = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            inner.push_str(&format!("<{name}>{}</{name}>", escape(&v)));
        }
    };
    element(
        "LockDuration",
        properties.lock_duration.map(format_duration),
    );
    element(
        "RequiresSession",
        Some(properties.requires_session.to_string()),
    );
    element(
        "DefaultMessageTimeToLive",
        properties.default_message_time_to_live.map(format_duration),
    );
    element(
        "DeadLetteringOnMessageExpiration",
        Some(properties.dead_lettering_on_message_expiration.to_string()),
    );
    element(
        "MaxDeliveryCount",
        properties.max_delivery_count.map(|n| n.to_string()),
    );
    element("ForwardTo", properties.forward_to.clone());
    element(
        "ForwardDeadLetteredMessagesTo",
        properties.forward_dead_lettered_messages_to.clone(),
    );
    let kind = if subscription {
        "SubscriptionDescription"
    } else {
        "QueueDescription"
    };
    format!(
        r#"<?xml version="1.0" encoding="utf-8"?><entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><{kind} xmlns="{SB_NS}" xmlns:i="{XSI_NS}">{inner}</{kind}></content></entry>"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_the_service_writes_them() {
        assert_eq!(parse_duration("PT1M"), Some(Duration::from_secs(60)));
        assert_eq!(
            parse_duration("P14D"),
            Some(Duration::from_secs(14 * 86_400))
        );
        assert_eq!(
            parse_duration("PT1M30.5S"),
            Some(Duration::from_millis(90_500))
        );
        assert!(parse_duration("P10675199DT2H48M5.4775807S").is_some());
        assert_eq!(parse_duration("1 minute"), None);
        assert_eq!(parse_duration("PT5X"), None);
        assert_eq!(format_duration(Duration::from_secs(45)), "PT45S");
    }

    #[test]
    fn reads_a_namespace_info_entry_and_not_a_queue_as_one() {
        // As the emulator and the service answer `GET /$namespaceinfo`.
        let entry = r#"<entry xmlns="http://www.w3.org/2005/Atom"><title>ns</title><content type="application/xml"><NamespaceInfo xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"><CreatedTime>2026-01-01T00:00:00Z</CreatedTime><MessagingSKU>Premium</MessagingSKU><MessagingUnits>2</MessagingUnits><Name>ns</Name><NamespaceType>Messaging</NamespaceType></NamespaceInfo></content></entry>"#;
        let info = read_namespace(entry).unwrap().unwrap();
        assert_eq!(info.messaging_sku.as_deref(), Some("Premium"));
        assert_eq!(info.messaging_units, Some(2));
        assert_eq!(info.name.as_deref(), Some("ns"));
        assert_eq!(info.namespace_type.as_deref(), Some("Messaging"));
        assert_eq!(info.created.as_deref(), Some("2026-01-01T00:00:00Z"));
        let queue = r#"<entry xmlns="http://www.w3.org/2005/Atom"><content><QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"><LockDuration>PT5S</LockDuration></QueueDescription></content></entry>"#;
        assert!(read_namespace(queue).unwrap().is_none());
    }

    #[test]
    fn reads_a_queue_entry_and_knows_an_empty_feed() {
        let entry = r#"<entry xmlns="http://www.w3.org/2005/Atom"><title>q</title><content type="application/xml"><QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"><LockDuration>PT45S</LockDuration><RequiresSession>true</RequiresSession><DefaultMessageTimeToLive>P1D</DefaultMessageTimeToLive><MaxDeliveryCount>7</MaxDeliveryCount><MessageCount>4</MessageCount><ForwardTo>elsewhere</ForwardTo><CountDetails xmlns:d2p1="http://schemas.microsoft.com/netservices/2011/06/servicebus"><d2p1:ActiveMessageCount>3</d2p1:ActiveMessageCount><d2p1:DeadLetterMessageCount>1</d2p1:DeadLetterMessageCount></CountDetails></QueueDescription></content></entry>"#;
        let (p, c) = read_entity(entry).unwrap().unwrap();
        assert_eq!(p.lock_duration, Some(Duration::from_secs(45)));
        assert_eq!(
            p.default_message_time_to_live,
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(p.max_delivery_count, Some(7));
        assert!(p.requires_session);
        assert_eq!(p.forward_to.as_deref(), Some("elsewhere"));
        assert_eq!((c.total, c.active, c.dead_letter), (4, 3, 1));
        let empty =
            r#"<feed xmlns="http://www.w3.org/2005/Atom"><title type="text">nope</title></feed>"#;
        assert!(read_entity(empty).unwrap().is_none());
        assert_eq!(
            error_detail("<Error><Code>401</Code><Detail>no &amp; way</Detail></Error>"),
            "no & way"
        );
        let body = description_entry(&p, false);
        let (back, _) = read_entity(&body).unwrap().unwrap();
        assert_eq!(back, p);
    }
}

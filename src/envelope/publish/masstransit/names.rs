//! What MassTransit accepts as a message type (`urn:message:…`), an id (a `Guid`) and a
//! header name, checked before anything is written.

use uuid::Uuid;

use crate::envelope::publish::{MAX_NAME_LEN, PublishError, shown};
use crate::ports::INBOX_PROPERTY_PREFIX;

/// The scheme and namespace prefix of a MassTransit message type.
const URN_PREFIX: &str = "urn:message:";

/// `id` parsed as a UUID, or [`PublishError::NotUuid`] naming `what`.
pub(super) fn uuid(what: &'static str, id: &str) -> Result<Uuid, PublishError> {
    Uuid::parse_str(id).map_err(|source| PublishError::NotUuid {
        what,
        value: shown(id),
        source,
    })
}

/// A UUID derived from `text` alone (SHA-256, version 8 and the RFC 4122 variant set), for
/// an id that must be the same on every delivery of one message.
pub(super) fn derived_uuid(text: &str) -> Uuid {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest.as_ref()[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// `urn:message:Namespace:TypeName` (nested types with `+`, generic arguments in `[[…]]`),
/// checked; anything else is [`PublishError::InvalidMessageType`].
pub(super) fn message_urn(urn: &str) -> Result<String, PublishError> {
    let invalid = || PublishError::InvalidMessageType(shown(urn));
    if urn.len() > MAX_NAME_LEN {
        return Err(invalid());
    }
    let rest = urn.strip_prefix(URN_PREFIX).ok_or_else(invalid)?;
    // The type name follows the namespace's last ':' outside generic brackets; a type in the
    // global namespace has none (`urn:message:TypeName`).
    let head = rest.split('[').next().unwrap_or(rest);
    let (namespace, name) = head.rsplit_once(':').unwrap_or(("", head));
    let allowed = |c: char| c.is_alphanumeric() || matches!(c, '.' | '_' | '+' | '`');
    let brackets = &rest[head.len()..];
    if name.is_empty()
        || !name.chars().all(allowed)
        || namespace
            .split('.')
            .any(|part| !namespace.is_empty() && part.is_empty())
        || !namespace.chars().all(|c| allowed(c) && c != '+')
        || !brackets
            .chars()
            .all(|c| allowed(c) || matches!(c, '[' | ']' | ',' | ':'))
    {
        return Err(invalid());
    }
    Ok(urn.to_owned())
}

/// A header name MassTransit and the relay both carry: 1 to 256 bytes, no control characters,
/// none of the inbox's own (`sb-inbox-…`, dropped by the relay) or MassTransit's (`MT-…`).
/// Anything else is [`PublishError::InvalidName`].
pub(super) fn header_name(name: &str) -> Result<(), PublishError> {
    let why = if name.is_empty() || name.len() > MAX_NAME_LEN {
        Some("1 to 256 bytes")
    } else if name.chars().any(char::is_control) {
        Some("no control characters")
    } else if name.starts_with(INBOX_PROPERTY_PREFIX) {
        Some("sb-inbox- properties belong to the inbox's own hop; the relay drops them")
    } else if name.len() >= 3 && name[..3].eq_ignore_ascii_case("MT-") {
        Some("MT- headers are MassTransit's own")
    } else {
        None
    };
    if let Some(why) = why {
        return Err(PublishError::InvalidName {
            what: "header",
            name: shown(name),
            why,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_urns_follow_masstransits_format() {
        for good in [
            "urn:message:Shop.Contracts:OrderConfirmed",
            "urn:message:MyProject.Messages.Events:AccountUpdated",
            "urn:message:MyProject.AccountService:MyService+AccountUpdatedEvent",
            "urn:message:Ns:Wrapper[[Ns.Inner:Payload]]",
            "urn:message:TypeInGlobalNamespace",
        ] {
            assert!(message_urn(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Shop.Contracts:OrderConfirmed",
            "urn:message:",
            "urn:message:Shop.Contracts:",
            "urn:message:Shop..Contracts:Order",
            "urn:message:Shop Contracts:Order",
            "urn:message:Shop:Order\n",
            "urn:messages:Shop:Order",
            &format!("urn:message:Ns:{}", "T".repeat(300)),
        ] {
            assert!(
                matches!(message_urn(bad), Err(PublishError::InvalidMessageType(_))),
                "{bad:?}"
            );
        }
    }
}

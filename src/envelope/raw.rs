//! [`Raw`]: an envelope described by configuration, for producers that follow no framework:
//! the contract (or its name and version) and the id each read from a named application
//! property or a JSON pointer into the body, or a fixed contract for an entity that carries one
//! type. The body is handed to the handler whole.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use super::reader::{EnvelopeReader, Opened};
use super::type_map::{TypeMap, TypeMapError};
use super::{Contract, DeadLetterReason, Rejection};
use crate::ports::{Message, PropertyValue};

/// Where a [`Raw`] envelope finds a value: `property:NAME` (an application property) or
/// `pointer:/a/b` (an RFC 6901 JSON pointer into the body).
///
/// # Examples
/// ```
/// use sb_inbox::envelope::Field;
/// assert_eq!("property:event-type".parse(), Ok(Field::Property("event-type".into())));
/// assert_eq!("pointer:/meta/id".parse(), Ok(Field::Pointer("/meta/id".into())));
/// assert!("header:x".parse::<Field>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// An application property.
    Property(String),
    /// A JSON pointer into the body.
    Pointer(String),
}

/// A field that is neither `property:NAME` nor `pointer:/PATH`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not property:NAME or pointer:/PATH")]
pub struct FieldParseError(String);

impl FromStr for Field {
    type Err = FieldParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || FieldParseError(super::truncate(text, 256));
        if let Some(name) = text.strip_prefix("property:") {
            return if name.is_empty() {
                Err(invalid())
            } else {
                Ok(Field::Property(name.to_owned()))
            };
        }
        match text.strip_prefix("pointer:") {
            Some(pointer) if pointer.starts_with('/') => Ok(Field::Pointer(pointer.to_owned())),
            _ => Err(invalid()),
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Property(name) => write!(f, "property:{name}"),
            Field::Pointer(pointer) => write!(f, "pointer:{pointer}"),
        }
    }
}

/// Where a [`Raw`] envelope's contract comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ContractFrom {
    Fixed(Contract),
    Field(Field),
}

/// An envelope described by configuration.
///
/// - The contract is fixed ([`Raw::fixed`]) or read from a field ([`Raw::typed`]). A field's
///   value resolves through the [`TypeMap`] (an entry, else the value when it is `name.vN`);
///   with a version field ([`Raw::with_version`]) the value is the contract *name* (or a type
///   the table maps to one) and the version field gives the number (`2`, `"2"` or `"v2"`).
/// - The id is read from a field ([`Raw::with_id`]; a string, or an integer as its decimal
///   text), else the broker message id is the envelope's.
/// - The body is handed over whole; the headers are the application properties.
///
/// # Examples
/// ```
/// use sb_inbox::envelope::{EnvelopeReader, Raw};
/// use sb_inbox::{Contract, Message};
/// let reader = Raw::typed("property:event-type".parse()?)
///     .with_version("property:event-version".parse()?)?
///     .with_id("pointer:/eventId".parse()?);
/// let message = Message::new("broker-id", "", r#"{"eventId":"e-1","orderId":"o-1"}"#)
///     .with_property("event-type", "orders.order-placed")
///     .with_property("event-version", 1_i64);
/// let opened = reader.open(&message)?;
/// assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
/// assert_eq!(opened.id.as_deref(), Some("e-1"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    contract: ContractFrom,
    version: Option<Field>,
    id: Option<Field>,
    types: TypeMap,
}

impl Raw {
    /// Every message is `contract` (an entity that carries one type).
    pub fn fixed(contract: Contract) -> Self {
        Raw {
            contract: ContractFrom::Fixed(contract),
            version: None,
            id: None,
            types: TypeMap::new(),
        }
    }

    /// The contract is read from `field`.
    pub fn typed(field: Field) -> Self {
        Raw {
            contract: ContractFrom::Field(field),
            version: None,
            id: None,
            types: TypeMap::new(),
        }
    }

    /// The version is read from `field`; the contract field then gives the name.
    ///
    /// # Errors
    /// [`RawConfigError::VersionOfFixed`] for a fixed contract, which has its version.
    pub fn with_version(mut self, field: Field) -> Result<Self, RawConfigError> {
        if matches!(self.contract, ContractFrom::Fixed(_)) {
            return Err(RawConfigError::VersionOfFixed);
        }
        self.version = Some(field);
        Ok(self)
    }

    /// The envelope's id is read from `field`.
    #[must_use]
    pub fn with_id(mut self, field: Field) -> Self {
        self.id = Some(field);
        self
    }

    /// The contract field's values resolve through `types`.
    ///
    /// # Errors
    /// [`RawConfigError::FixedWithTypes`] for a fixed contract, and
    /// [`RawConfigError::TypeMap`] for an entry without a version when there is no version
    /// field.
    pub fn with_types(mut self, types: TypeMap) -> Result<Self, RawConfigError> {
        if matches!(self.contract, ContractFrom::Fixed(_)) && !types.is_empty() {
            return Err(RawConfigError::FixedWithTypes);
        }
        if self.version.is_none() {
            types.require_versions("raw")?;
        }
        self.types = types;
        Ok(self)
    }

    /// The value at `field`: the application property, or the body's JSON at the pointer.
    fn value<'m>(
        field: &Field,
        message: &'m Message,
        body: &'m Option<serde_json::Value>,
    ) -> Result<Option<Value<'m>>, Rejection> {
        Ok(match field {
            Field::Property(name) => match message.application_properties.get(name) {
                None => None,
                Some(PropertyValue::String(s)) => Some(Value::Text(Cow::Borrowed(s))),
                Some(PropertyValue::Long(n)) => Some(Value::Number(*n)),
                Some(_) => Some(Value::Other),
            },
            Field::Pointer(pointer) => {
                let Some(body) = body else {
                    return Err(Rejection::new(
                        DeadLetterReason::InvalidPayload,
                        "the body is not JSON",
                    ));
                };
                match body.pointer(pointer) {
                    None | Some(serde_json::Value::Null) => None,
                    Some(serde_json::Value::String(s)) => Some(Value::Text(Cow::Borrowed(s))),
                    Some(serde_json::Value::Number(n)) => {
                        n.as_i64().map(Value::Number).or(Some(Value::Other))
                    }
                    Some(_) => Some(Value::Other),
                }
            }
        })
    }

    fn contract(
        &self,
        message: &Message,
        body: &Option<serde_json::Value>,
    ) -> Result<Contract, Rejection> {
        let field = match &self.contract {
            ContractFrom::Fixed(contract) => return Ok(contract.clone()),
            ContractFrom::Field(field) => field,
        };
        let kind = match Self::value(field, message, body)? {
            None => {
                return Err(Rejection::new(
                    DeadLetterReason::MissingContract,
                    format!("the message has no contract at {field}"),
                ));
            }
            Some(Value::Text(text)) if !text.is_empty() => text,
            Some(_) => {
                return Err(Rejection::new(
                    DeadLetterReason::MissingContract,
                    format!("the contract at {field} is not a non-empty string"),
                ));
            }
        };
        let Some(version_field) = &self.version else {
            return self
                .types
                .resolve_first([(kind.as_ref(), None)], "the message");
        };
        let version = match Self::value(version_field, message, body)? {
            None => {
                return Err(Rejection::new(
                    DeadLetterReason::MissingContract,
                    format!("the message has no contract version at {version_field}"),
                ));
            }
            Some(Value::Number(n)) => u32::try_from(n).ok(),
            Some(Value::Text(text)) => {
                let digits = text.strip_prefix('v').unwrap_or(&text);
                digits.parse().ok().filter(|_| !digits.starts_with('+'))
            }
            Some(Value::Other) => None,
        };
        let Some(version) = version else {
            return Err(Rejection::new(
                DeadLetterReason::UnsupportedContractVersion,
                format!("the contract version at {version_field} is not a whole number"),
            ));
        };
        Ok(self
            .types
            .resolve(&kind, Some(version))
            .unwrap_or_else(|| Contract::new(kind.into_owned(), version)))
    }
}

/// A value read from a field.
enum Value<'m> {
    Text(Cow<'m, str>),
    Number(i64),
    Other,
}

/// A [`Raw`] envelope that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RawConfigError {
    /// A version field beside a fixed contract.
    #[error("a fixed contract has its version; drop the version field")]
    VersionOfFixed,
    /// A type map beside a fixed contract.
    #[error("a fixed contract needs no type map")]
    FixedWithTypes,
    /// A type map entry the raw envelope cannot use.
    #[error(transparent)]
    TypeMap(#[from] TypeMapError),
}

impl EnvelopeReader for Raw {
    fn kind(&self) -> &'static str {
        "raw"
    }

    fn open<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        let pointers = [
            match &self.contract {
                ContractFrom::Field(field) => Some(field),
                ContractFrom::Fixed(_) => None,
            },
            self.version.as_ref(),
            self.id.as_ref(),
        ];
        // The body is parsed only when a pointer reads it; the handler decodes it again, into
        // its own type, which a generic value cannot spare it.
        let body = if pointers
            .iter()
            .any(|field| matches!(field, Some(Field::Pointer(_))))
        {
            Some(
                serde_json::from_slice::<serde_json::Value>(&message.body)
                    .map_err(|e| super::json_body::not_json("the body", &e))?,
            )
        } else {
            None
        };
        let contract = self.contract(message, &body)?;
        let id = match &self.id {
            None => None,
            Some(field) => match Self::value(field, message, &body)? {
                None => None,
                Some(Value::Text(text)) => Some(text.into_owned()),
                Some(Value::Number(n)) => Some(n.to_string()),
                Some(Value::Other) => {
                    return Err(Rejection::new(
                        DeadLetterReason::InvalidMessageId,
                        format!("the message id at {field} is not a string or an integer"),
                    ));
                }
            },
        };
        let opened = Opened::new(
            contract,
            Cow::Borrowed(&message.body[..]),
            Cow::Borrowed(&message.application_properties),
        );
        Ok(match id {
            Some(id) => opened.with_id(id),
            None => opened,
        })
    }

    fn type_map(&self) -> Option<&TypeMap> {
        // Without types the field carries contract names, which nothing here can check.
        (!self.types.is_empty()).then_some(&self.types)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn field(text: &str) -> Field {
        text.parse().unwrap()
    }

    #[test]
    fn fields_parse_and_print() {
        for text in ["property:a", "pointer:/a/0/b"] {
            assert_eq!(field(text).to_string(), text);
        }
        for bad in ["property:", "pointer:a", "pointer:", "a", ""] {
            assert!(bad.parse::<Field>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_fixed_contract_and_the_broker_id() {
        let reader = Raw::fixed(Contract::new("orders.order-placed", 1));
        let message = Message::new("m-1", "", "not even json");
        let opened = reader.open(&message).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
        assert_eq!(opened.id, None);
        assert_eq!(&opened.body[..], b"not even json");
        assert_eq!(
            Raw::fixed(Contract::new("a", 1)).with_version(field("property:v")),
            Err(RawConfigError::VersionOfFixed)
        );
    }

    #[test]
    fn contract_and_id_from_pointers_through_the_type_map() {
        let types = TypeMap::new()
            .with("OrderPlaced", "orders.order-placed.v1")
            .unwrap();
        let reader = Raw::typed(field("pointer:/meta/type"))
            .with_types(types)
            .unwrap()
            .with_id(field("pointer:/meta/seq"));
        let message = Message::new("m-1", "", r#"{"meta":{"type":"OrderPlaced","seq":42}}"#);
        let opened = reader.open(&message).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
        assert_eq!(opened.id.as_deref(), Some("42"));
        let named = Message::new("m-1", "", r#"{"meta":{"type":"orders.order-placed.v3"}}"#);
        let opened = reader.open(&named).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-placed", 3));
        assert_eq!(opened.id, None);
    }

    #[test]
    fn a_version_field_gives_the_number() {
        let reader = Raw::typed(field("property:type"))
            .with_version(field("property:version"))
            .unwrap()
            .with_types(
                TypeMap::new()
                    .with("Placed", "orders.order-placed")
                    .unwrap(),
            )
            .unwrap();
        for version in [PropertyValue::Long(2), "2".into(), "v2".into()] {
            let message = Message::new("m", "", "{}")
                .with_property("type", "Placed")
                .with_property("version", version);
            assert_eq!(
                reader.open(&message).unwrap().contract,
                Contract::new("orders.order-placed", 2)
            );
        }
        let unmapped = Message::new("m", "", "{}")
            .with_property("type", "billing.charged")
            .with_property("version", 4_i64);
        assert_eq!(
            reader.open(&unmapped).unwrap().contract,
            Contract::new("billing.charged", 4)
        );
    }

    #[test]
    fn an_unversioned_entry_needs_a_version_field() {
        let types = TypeMap::new()
            .with("Placed", "orders.order-placed")
            .unwrap();
        assert!(matches!(
            Raw::typed(field("property:type")).with_types(types),
            Err(RawConfigError::TypeMap(TypeMapError::Unversioned { .. }))
        ));
    }

    #[test]
    fn every_missing_or_malformed_field_is_rejected_with_its_reason() {
        use DeadLetterReason::*;
        let reader = Raw::typed(field("property:type"))
            .with_version(field("pointer:/v"))
            .unwrap()
            .with_id(field("pointer:/id"));
        let typed = |body: &str| Message::new("m", "", body.to_owned()).with_property("type", "a");
        let cases = [
            (Message::new("m", "", "{}"), MissingContract),
            (typed("{}").with_property("type", ""), MissingContract),
            (
                typed("{}").with_property("type", PropertyValue::Bool(true)),
                MissingContract,
            ),
            (typed("{nope s3cr3t"), InvalidPayload),
            (typed(r#"{"id":"x"}"#), MissingContract),
            (typed(r#"{"v":"two"}"#), UnsupportedContractVersion),
            (typed(r#"{"v":-1}"#), UnsupportedContractVersion),
            (typed(r#"{"v":"+1"}"#), UnsupportedContractVersion),
            (typed(r#"{"v":1,"id":{"s3cr3t":1}}"#), InvalidMessageId),
        ];
        for (message, reason) in cases {
            let rejection = reader.open(&message).unwrap_err();
            assert_eq!(rejection.reason, reason, "{message:?}: {rejection}");
            assert!(!rejection.description.contains("s3cr3t"), "{rejection}");
        }
    }
}

//! [`TypeMap`]: a consumer's table from the type names other frameworks write (MassTransit
//! URNs, .NET type names, CloudEvents types) to our contracts.

use std::collections::BTreeMap;
use std::fmt;

use super::{Contract, DeadLetterReason, Rejection, truncate};

/// The most type names one envelope may list; more is refused before any lookup, so a
/// hostile envelope cannot make the reader walk a long list.
pub const MAX_ENVELOPE_TYPES: usize = 32;

/// A consumer's type → contract table.
///
/// A type resolves, in this order, to:
/// 1. its entry in the table;
/// 2. itself, when it is already a contract (`name.vN`: a producer that writes our names);
/// 3. nothing: the delivery is dead-lettered `UnsupportedContract`, its description naming
///    the type (bounded). An unmapped type is never guessed into a contract, so a new event
///    type on a shared topic cannot reach a handler under a name nobody chose.
///
/// An entry's contract may leave its version to the envelope: `"Shop.Contracts.OrderPlaced" =
/// "orders.order-placed"` (no `.vN`) takes the version the envelope carries, which only the
/// NServiceBus reader has (the assembly version's major number). Readers without an envelope
/// version refuse such entries when they are built ([`TypeMap::unversioned`]).
///
/// # Examples
/// ```
/// use sb_inbox::envelope::TypeMap;
/// use sb_inbox::Contract;
/// let types = TypeMap::new()
///     .with("urn:message:Shop.Contracts:OrderPlaced", "orders.order-placed.v1")?;
/// assert_eq!(
///     types.resolve("urn:message:Shop.Contracts:OrderPlaced", None),
///     Some(Contract::new("orders.order-placed", 1))
/// );
/// assert_eq!(
///     types.resolve("orders.order-placed.v2", None),
///     Some(Contract::new("orders.order-placed", 2))
/// );
/// assert_eq!(types.resolve("urn:message:Shop.Contracts:OrderShipped", None), None);
/// # Ok::<(), sb_inbox::envelope::TypeMapError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeMap {
    entries: BTreeMap<String, Target>,
}

/// What a type maps to: a contract name, with its version or without (taken from the envelope).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    name: String,
    version: Option<u32>,
}

/// A type map entry that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TypeMapError {
    /// The type name is empty.
    #[error("a type map entry has an empty type name")]
    EmptyType,
    /// The contract is empty or has whitespace or control characters.
    #[error("type {type_name:?} maps to {contract:?}, which is not a contract (<name>.v<N>)")]
    InvalidContract {
        /// The type.
        type_name: String,
        /// The contract as written.
        contract: String,
    },
    /// The entry leaves the version to the envelope, and this envelope carries none.
    #[error(
        "type {type_name:?} maps to a contract without a version (<name>.v<N>), and the {kind} envelope carries none"
    )]
    Unversioned {
        /// The envelope's kind.
        kind: &'static str,
        /// The type.
        type_name: String,
    },
}

impl TypeMap {
    /// An empty table: only types that are contracts themselves resolve.
    pub fn new() -> Self {
        TypeMap::default()
    }

    /// The table with `type_name` mapped to `contract` (`name.vN`, or `name` to take the
    /// version from the envelope).
    ///
    /// # Errors
    /// [`TypeMapError`] for an empty type or a contract that is not a name.
    pub fn with(mut self, type_name: &str, contract: &str) -> Result<Self, TypeMapError> {
        self.insert(type_name, contract)?;
        Ok(self)
    }

    /// Maps `type_name` to `contract`, as [`TypeMap::with`].
    ///
    /// # Errors
    /// As [`TypeMap::with`].
    pub fn insert(&mut self, type_name: &str, contract: &str) -> Result<(), TypeMapError> {
        if type_name.is_empty() {
            return Err(TypeMapError::EmptyType);
        }
        let invalid = || TypeMapError::InvalidContract {
            type_name: truncate(type_name, 256),
            contract: truncate(contract, 256),
        };
        if contract.is_empty()
            || contract
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid());
        }
        let target = match contract.parse::<Contract>() {
            Ok(parsed) => Target {
                name: parsed.name().to_owned(),
                version: Some(parsed.version()),
            },
            Err(_) => Target {
                name: contract.to_owned(),
                version: None,
            },
        };
        self.entries.insert(type_name.to_owned(), target);
        Ok(())
    }

    /// The types whose entry leaves the version to the envelope.
    pub fn unversioned(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .filter(|(_, target)| target.version.is_none())
            .map(|(type_name, _)| type_name.as_str())
    }

    /// Refuses entries that leave the version to an envelope of `kind`, which carries none.
    ///
    /// # Errors
    /// [`TypeMapError::Unversioned`] naming the first such entry.
    pub(crate) fn require_versions(&self, kind: &'static str) -> Result<(), TypeMapError> {
        match self.unversioned().next() {
            None => Ok(()),
            Some(type_name) => Err(TypeMapError::Unversioned {
                kind,
                type_name: truncate(type_name, 256),
            }),
        }
    }

    /// Each entry: the type, the contract name it maps to, and the contract's version (`None`:
    /// taken from the envelope), in type order. What a start-time check compares with the
    /// handler's contracts.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str, Option<u32>)> {
        self.entries
            .iter()
            .map(|(type_name, target)| (type_name.as_str(), target.name.as_str(), target.version))
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The contract of `type_name` (see the resolution order above); `envelope_version` is the
    /// version the envelope carries, if it carries one.
    pub fn resolve(&self, type_name: &str, envelope_version: Option<u32>) -> Option<Contract> {
        match self.entries.get(type_name) {
            Some(target) => target
                .version
                .or(envelope_version)
                .map(|version| Contract::new(target.name.clone(), version)),
            None => type_name.parse().ok(),
        }
    }

    /// The first of `types` that resolves, else the rejection naming the first type: the
    /// most specific comes first in both MassTransit's `messageType` and NServiceBus's
    /// `EnclosedMessageTypes`, and a consumer may map a less specific one (an interface).
    pub(crate) fn resolve_first<'t>(
        &self,
        types: impl IntoIterator<Item = (&'t str, Option<u32>)>,
        what: &str,
    ) -> Result<Contract, Rejection> {
        let mut first = None;
        for (count, (type_name, version)) in types.into_iter().enumerate() {
            if count >= MAX_ENVELOPE_TYPES {
                return Err(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    format!("{what} lists more than {MAX_ENVELOPE_TYPES} types"),
                ));
            }
            if let Some(contract) = self.resolve(type_name, version) {
                return Ok(contract);
            }
            first.get_or_insert(type_name);
        }
        match first {
            None => Err(Rejection::new(
                DeadLetterReason::MissingContract,
                format!("{what} names no type"),
            )),
            Some(type_name) => Err(Rejection::new(
                DeadLetterReason::UnsupportedContract,
                format!(
                    "{what} type {} is not in the consumer's type map",
                    Quoted(type_name)
                ),
            )),
        }
    }
}

/// A type name from a message, quoted and bounded for a dead-letter description: type names
/// are metadata, not payload, but they are still untrusted text.
pub(crate) struct Quoted<'a>(pub(crate) &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", truncate(self.0, 200))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn map() -> TypeMap {
        TypeMap::new()
            .with("urn:message:Shop:OrderPlaced", "orders.order-placed.v1")
            .unwrap()
            .with("Shop.OrderPlaced", "orders.order-placed")
            .unwrap()
    }

    #[test]
    fn a_mapped_type_then_a_contract_name_then_nothing() {
        let map = map();
        let v1 = Contract::new("orders.order-placed", 1);
        assert_eq!(
            map.resolve("urn:message:Shop:OrderPlaced", None),
            Some(v1.clone())
        );
        assert_eq!(
            map.resolve("urn:message:Shop:OrderPlaced", Some(7)),
            Some(v1)
        );
        assert_eq!(
            map.resolve("billing.charged.v3", None),
            Some(Contract::new("billing.charged", 3))
        );
        assert_eq!(map.resolve("urn:message:Shop:Other", None), None);
    }

    #[test]
    fn an_unversioned_entry_takes_the_envelopes_version_or_nothing() {
        let map = map();
        assert_eq!(
            map.resolve("Shop.OrderPlaced", Some(2)),
            Some(Contract::new("orders.order-placed", 2))
        );
        assert_eq!(map.resolve("Shop.OrderPlaced", None), None);
        assert_eq!(map.unversioned().collect::<Vec<_>>(), ["Shop.OrderPlaced"]);
    }

    #[test]
    fn bad_entries_are_refused() {
        assert_eq!(
            TypeMap::new().with("", "a.v1"),
            Err(TypeMapError::EmptyType)
        );
        for contract in ["", "a b.v1", "a\n"] {
            assert!(matches!(
                TypeMap::new().with("t", contract),
                Err(TypeMapError::InvalidContract { .. })
            ));
        }
    }

    #[test]
    fn the_first_type_that_resolves_wins_and_the_rejections_are_bounded() {
        let map = map();
        let contract = map
            .resolve_first(
                [
                    ("urn:message:Shop:Specific", None),
                    ("urn:message:Shop:OrderPlaced", None),
                ],
                "messageType",
            )
            .unwrap();
        assert_eq!(contract, Contract::new("orders.order-placed", 1));

        let unknown = "u".repeat(5000);
        let rejection = map
            .resolve_first([(unknown.as_str(), None)], "messageType")
            .unwrap_err();
        assert_eq!(rejection.reason, DeadLetterReason::UnsupportedContract);
        assert!(
            rejection.description.len() < 300,
            "{}",
            rejection.description
        );

        let rejection = map.resolve_first([], "messageType").unwrap_err();
        assert_eq!(rejection.reason, DeadLetterReason::MissingContract);

        let many = vec![("x", None); MAX_ENVELOPE_TYPES + 1];
        let rejection = map.resolve_first(many, "messageType").unwrap_err();
        assert_eq!(rejection.reason, DeadLetterReason::InvalidPayload);
    }
}

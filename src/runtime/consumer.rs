//! [`ConsumerName`], the checked consumer half of the inbox key.

use std::fmt;

/// The longest consumer name, in bytes (the inbox column is `varchar(128)`).
pub const MAX_CONSUMER_NAME_LEN: usize = 128;

/// Why a consumer name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerNameError {
    /// The name is empty.
    #[error("consumer name is empty")]
    Empty,
    /// The name is longer than [`MAX_CONSUMER_NAME_LEN`] bytes.
    #[error("consumer name is {0} bytes long; the limit is {MAX_CONSUMER_NAME_LEN}")]
    TooLong(usize),
    /// The name has a character outside `[a-z0-9._-]`, or does not start with a letter or digit.
    #[error(
        "consumer name {0:?} must start with a letter or digit and use only a-z, 0-9, '.', '_' and '-'"
    )]
    InvalidCharacter(String),
}

/// The stable name of one consumer: half of the inbox key `(consumer, message_id)`.
///
/// Two consumers sharing a database each process every message once. Renaming a consumer
/// without migrating its inbox rows replays retained messages, so names are plain lowercase
/// identifiers that never depend on a host, a replica or a version of the binary.
///
/// # Examples
/// ```
/// use sb_inbox::ConsumerName;
/// let name = ConsumerName::new("inventory.order-placed.v1")?;
/// assert_eq!(name.as_str(), "inventory.order-placed.v1");
/// assert!(ConsumerName::new("Inventory").is_err());
/// # Ok::<(), sb_inbox::ConsumerNameError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConsumerName(String);

impl ConsumerName {
    /// Validates a consumer name.
    ///
    /// # Errors
    /// [`ConsumerNameError`] when the name is empty, too long or uses other characters.
    pub fn new(name: impl Into<String>) -> Result<Self, ConsumerNameError> {
        let name = name.into();
        if name.is_empty() {
            return Err(ConsumerNameError::Empty);
        }
        if name.len() > MAX_CONSUMER_NAME_LEN {
            return Err(ConsumerNameError::TooLong(name.len()));
        }
        let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c);
        let starts_well = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !starts_well || !name.chars().all(allowed) {
            return Err(ConsumerNameError::InvalidCharacter(name));
        }
        Ok(ConsumerName(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_stable_identifiers() {
        for name in ["a", "inventory.order-placed.v1", "billing_2", "9lives"] {
            assert!(ConsumerName::new(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn refuses_bad_names() {
        assert_eq!(ConsumerName::new(""), Err(ConsumerNameError::Empty));
        assert_eq!(
            ConsumerName::new("x".repeat(129)),
            Err(ConsumerNameError::TooLong(129))
        );
        assert!(ConsumerName::new("x".repeat(128)).is_ok());
        for name in ["Inventory", "-a", ".a", "a b", "a/b", "é"] {
            assert!(
                matches!(
                    ConsumerName::new(name),
                    Err(ConsumerNameError::InvalidCharacter(_))
                ),
                "{name}"
            );
        }
    }
}

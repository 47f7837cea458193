//! Keys for downstream APIs that deduplicate by an idempotency key.
//!
//! The inbox makes the database effect happen once, but an HTTP call made inside the handler is
//! not part of the transaction: a rollback, a lost lock or a crash after the call and before the
//! commit delivers the message again, and the handler calls again. An API that deduplicates by
//! a key (an `Idempotency-Key` header, Stripe's and Adyen's `Idempotency-Key`, PayPal's
//! `PayPal-Request-Id`, Square's `idempotency_key`) turns those repeated calls into one effect,
//! but only if every attempt sends the same key. [`IdempotencyKey`] is that key: a pure function
//! of values that are the same on every delivery of one logical message, so nothing needs to be
//! stored before the call.
//!
//! # Derivation
//! SHA-256 over a fixed domain tag, the key's kind (`message` or `business`) and the
//! length-prefixed fields, its first 16 bytes written as an RFC 9562 version-8 UUID: 36
//! characters, which fits every key limit we know of (Square's 45 is the smallest), and is
//! accepted by APIs that insist on a UUID. The derivation is part of the public contract: a
//! change would make retries after an upgrade call the API under a new key, so a test pins it.

use std::fmt;

use super::ConsumerName;

/// A stable key for a downstream API's idempotency header; see [`Context::idempotency_key`](crate::Context::idempotency_key).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

/// Separates our keys from any other SHA-256 use of the same strings, and versions the scheme.
const DOMAIN: &[u8] = b"sb-inbox/idempotency-key/v1";

impl IdempotencyKey {
    /// The key for `scope` of one logical message of `consumer`.
    ///
    /// [`crate::Context::idempotency_key`] calls this with the context's consumer and logical
    /// id; it is public so that a tool outside a handler (a reconciliation script) can compute
    /// the key a handler sent.
    pub fn for_message(consumer: &ConsumerName, logical_id: &str, scope: &str) -> Self {
        Self::derive(b"message", consumer, logical_id, scope)
    }

    /// The key for `scope` of one business request of `consumer`: the same for every message
    /// that carries `business_key`, whatever its message id.
    pub fn for_business_key(consumer: &ConsumerName, business_key: &str, scope: &str) -> Self {
        Self::derive(b"business", consumer, business_key, scope)
    }

    /// The key as text (a lowercase hyphenated UUID).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn derive(kind: &[u8], consumer: &ConsumerName, id: &str, scope: &str) -> Self {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(DOMAIN);
        // Length prefixes keep ("a", "bc") and ("ab", "c") apart.
        for field in [
            kind,
            consumer.as_str().as_bytes(),
            id.as_bytes(),
            scope.as_bytes(),
        ] {
            context.update(&(field.len() as u64).to_be_bytes());
            context.update(field);
        }
        let digest = context.finish();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest.as_ref()[..16]);
        IdempotencyKey(
            uuid::Builder::from_custom_bytes(bytes)
                .into_uuid()
                .hyphenated()
                .to_string(),
        )
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn consumer(name: &str) -> ConsumerName {
        ConsumerName::new(name).unwrap()
    }

    /// Pins the derivation: these values were computed independently with Python's hashlib
    /// (see the comment in the test body), so a change to the scheme fails here instead of
    /// silently giving retries after an upgrade a new key.
    #[test]
    fn derivation_is_pinned() {
        // import hashlib, struct, uuid
        // def key(kind, *fields):
        //     h = hashlib.sha256(b"sb-inbox/idempotency-key/v1")
        //     for f in (kind, *fields):
        //         h.update(struct.pack(">Q", len(f))); h.update(f)
        //     b = bytearray(h.digest()[:16]); b[6] = (b[6] & 0x0f) | 0x80; b[8] = (b[8] & 0x3f) | 0x80
        //     return str(uuid.UUID(bytes=bytes(b)))
        // key(b"message", b"shipping.order-placed.v1", b"m-1", b"create-shipment")
        // key(b"business", b"shipping.order-placed.v1", b"order:o-1", b"create-shipment")
        let c = consumer("shipping.order-placed.v1");
        assert_eq!(
            IdempotencyKey::for_message(&c, "m-1", "create-shipment").as_str(),
            PINNED_MESSAGE
        );
        assert_eq!(
            IdempotencyKey::for_business_key(&c, "order:o-1", "create-shipment").as_str(),
            PINNED_BUSINESS
        );
    }

    const PINNED_MESSAGE: &str = "30f03e47-1aae-8d33-b1ac-514291b883f6";
    const PINNED_BUSINESS: &str = "f08ef3bb-38fd-8128-b690-34dc13cc5f15";

    #[test]
    fn same_inputs_same_key_and_every_input_matters() {
        let c = consumer("shipping.order-placed.v1");
        let key = IdempotencyKey::for_message(&c, "m-1", "create-shipment");
        assert_eq!(
            key,
            IdempotencyKey::for_message(&c, "m-1", "create-shipment")
        );
        let others = [
            IdempotencyKey::for_message(&consumer("billing.v1"), "m-1", "create-shipment"),
            IdempotencyKey::for_message(&c, "m-2", "create-shipment"),
            IdempotencyKey::for_message(&c, "m-1", "cancel-shipment"),
            // Same strings, other kind: a message id that happens to equal a business key.
            IdempotencyKey::for_business_key(&c, "m-1", "create-shipment"),
            // Field boundaries are part of the input.
            IdempotencyKey::for_message(&c, "m-1c", "reate-shipment"),
        ];
        for other in others {
            assert_ne!(key, other);
        }
    }

    #[test]
    fn a_key_is_a_version_8_uuid() {
        let key = IdempotencyKey::for_message(&consumer("c"), "m", "s");
        let parsed = uuid::Uuid::parse_str(key.as_str()).unwrap();
        assert_eq!(parsed.get_version_num(), 8);
        assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(key.as_str().len(), 36);
        assert_eq!(key.to_string(), key.as_str());
    }
}

//! Upcasters: a body of an old contract version decoded as the old type, turned into the type
//! the new version's handler takes, validated, and handed to that handler.

use std::any::TypeId;

use super::table::{PendingUpcast, RouterBuilder};
use crate::ports::Tx;
use crate::runtime::handler::DecodeError;
use crate::runtime::json::{JsonContract, decode_json};

/// Why an upcaster refused to turn an old contract version into the new one: the value has no
/// faithful counterpart in the new version (a field the new one requires and the old one cannot
/// supply, a value the new one forbids). The message is dead-lettered `InvalidPayload` at
/// once, with a description naming both contracts and this reason; redelivery could not
/// change the answer.
///
/// The reason must not quote the payload (it is written into the dead letter's description).
///
/// # Examples
/// ```
/// use sb_inbox::UpcastError;
/// let refused = UpcastError::new("v1 total is negative: v2 has no refunds");
/// assert_eq!(refused.to_string(), "v1 total is negative: v2 has no refunds");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UpcastError(String);

impl UpcastError {
    /// A refusal with this reason (bounded; never quote the payload).
    pub fn new(reason: impl AsRef<str>) -> Self {
        UpcastError(crate::envelope::truncate(reason.as_ref(), 512))
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

impl<T: Tx + 'static> RouterBuilder<T> {
    /// Accepts `Old`'s contract by converting it: a body of `Old`'s contract is decoded (and
    /// validated) as `Old`, turned into `New` by `upcast`, validated as `New`, and handed to the
    /// route of `New`'s contract, whose handler sees `New`'s contract in
    /// [`Context::contract`] (the message's own subject still names `Old`). A body that does
    /// not decode as `Old` is `InvalidPayload`, as for any route.
    ///
    /// `upcast` may refuse a value with no faithful counterpart in `New` ([`UpcastError`]):
    /// the message is dead-lettered `InvalidPayload` at once, the description naming both
    /// contracts and the reason. (An upcaster that panics instead is caught and counted like a
    /// handler's panic: abandoned, then dead-lettered `HandlerPanicked` after
    /// [`RuntimeConfig::max_panics`](crate::RuntimeConfig::max_panics) deliveries.)
    ///
    /// The route of `New` must be a [`JsonHandler`] of `New` (or any handler whose payload is
    /// `New`); [`RouterBuilder::build`] refuses an upcaster without one.
    ///
    /// [`Context::contract`]: crate::runtime::Context::contract
    /// [`JsonHandler`]: crate::runtime::JsonHandler
    #[must_use]
    pub fn upcast<Old, New, F>(mut self, upcast: F) -> Self
    where
        Old: JsonContract,
        New: JsonContract,
        F: Fn(Old) -> Result<New, UpcastError> + Send + Sync + 'static,
    {
        let (from, to) = (Old::contract(), New::contract());
        let refused = format!("upcast from {from} to {to} refused");
        self.upcasts.push(PendingUpcast {
            from,
            to,
            produces: TypeId::of::<New>(),
            upcaster: Box::new(move |body| {
                let new = upcast(decode_json::<Old>(body)?)
                    .map_err(|error| DecodeError::new(format!("{refused}: {error}")))?;
                new.validate()?;
                Ok(Box::new(new))
            }),
        });
        self
    }
}

//! [`ConsumerConfig`]: one consumer the worker hosts. Its own file, below both the
//! configuration that builds it and the host that runs it.

use crate::runtime::{ConsumerName, RuntimeConfig};

/// One consumer a [`Worker`](super::Worker) hosts: the entity it receives from and how its
/// runtime runs (its consumer name, half of the inbox key, concurrency, prefetch, lock margin,
/// grace).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// A queue, or `TOPIC/Subscriptions/SUBSCRIPTION`.
    pub entity: String,
    /// The runtime settings; `runtime.consumer` names the consumer.
    pub runtime: RuntimeConfig,
}

impl ConsumerConfig {
    /// A consumer named `name` on `entity`, with [`RuntimeConfig::new`]'s defaults.
    pub fn new(name: ConsumerName, entity: impl Into<String>) -> Self {
        ConsumerConfig {
            entity: entity.into(),
            runtime: RuntimeConfig::new(name),
        }
    }

    /// Deliveries handled at once.
    #[must_use]
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.runtime.concurrency = concurrency;
        self
    }

    /// Deliveries received ahead of a free handler slot.
    #[must_use]
    pub fn with_prefetch(mut self, prefetch: usize) -> Self {
        self.runtime.prefetch = prefetch;
        self
    }

    /// How the consumer reads its deliveries (MassTransit, NServiceBus, CloudEvents, raw;
    /// the subject-versioned envelope by default): see [`crate::envelope`].
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use sb_inbox::ConsumerName;
    /// use sb_inbox::envelope::{MassTransit, TypeMap};
    /// use sb_inbox::worker::ConsumerConfig;
    /// let types = TypeMap::new()
    ///     .with("urn:message:Shop.Contracts:OrderPlaced", "orders.order-placed.v1")?;
    /// let consumer = ConsumerConfig::new(ConsumerName::new("shop.inventory")?, "orders")
    ///     .with_envelope(Arc::new(MassTransit::new(types)?));
    /// assert_eq!(consumer.runtime.envelope.kind(), "masstransit");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_envelope(
        mut self,
        envelope: std::sync::Arc<dyn crate::envelope::EnvelopeReader>,
    ) -> Self {
        self.runtime.envelope = envelope;
        self
    }

    /// The consumer name.
    pub fn name(&self) -> &ConsumerName {
        &self.runtime.consumer
    }
}

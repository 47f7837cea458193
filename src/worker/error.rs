//! [`WorkerError`]: why a [`super::Worker`] stopped or refused to start, each variant keeping the
//! error underneath as its `source`.

use crate::ports::StoreError;
use crate::runtime::ConsumerName;
use crate::runtime::RuntimeError;
use crate::servicebus::TrustError;
use crate::store::StoreUrlError;

/// Why the worker stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The store could not be opened. Permanent: the open retries transient failures itself
    /// and gives up only on what waiting does not fix.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The store URL names a store this build lacks. Permanent.
    #[error("store: {0}")]
    StoreUrl(#[from] StoreUrlError),
    /// The runtime failed (a receiver that cannot go on).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The health endpoints could not be served: the port is taken or not ours to bind.
    #[error("health endpoints: cannot listen on port {port}")]
    Health {
        /// The port asked for.
        port: u16,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The broker's trust roots (an extra CA bundle, the OS store) cannot be loaded.
    #[error("broker trust roots")]
    Trust(#[source] TrustError),
    /// The broker address cannot be used by this build.
    #[error("broker: {0}")]
    Broker(String),
    /// The retention would delete inbox rows whose messages can still come back. Permanent:
    /// raise the retention or lower the entity's TTL or the DLQ resubmission window.
    #[error("dedupe retention does not cover the replay horizon")]
    Retention(#[from] super::RetentionTooShort),
    /// The consumers cannot be hosted as given.
    #[error("worker: {0}")]
    Config(#[from] HostingError),
    /// The consumer's entity disagrees with the configuration, or cannot be checked.
    #[error("entity check")]
    Entity(#[from] super::EntityCheckError),
    /// A shutdown signal handler could not be installed ([`super::shutdown_signal`]).
    #[error("cannot handle {signal}")]
    Signal {
        /// The signal.
        signal: &'static str,
        /// The OS's or Tokio's refusal.
        #[source]
        source: std::io::Error,
    },
    /// A consumer's task ended abnormally (a panic outside the handler's own catch).
    #[error("consumer {name} ended abnormally")]
    Consumer {
        /// The consumer.
        name: ConsumerName,
        /// The task's end.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// Consumers a [`super::Worker`] refuses to host: each would break the inbox's promise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostingError {
    /// No consumer was added.
    #[error("no consumer to host")]
    NoConsumer,
    /// Two consumers under one name would share an inbox key.
    #[error("consumer {0} is hosted twice: each consumer needs its own name (its inbox key)")]
    HostedTwice(ConsumerName),
    /// Competing receivers under two names: a redelivery (lock expiry, abandon) that lands on
    /// the other one finds no inbox row under its name and applies the effect again.
    #[error(
        "consumers {first} and {second} both receive from {entity}: a message redelivered to \
         the other one would take effect twice (two inbox keys); host one consumer per entity, \
         or give each its own subscription"
    )]
    SharedEntity {
        /// The consumer added first.
        first: ConsumerName,
        /// The consumer added later.
        second: ConsumerName,
        /// The entity both receive from.
        entity: String,
    },
    /// A delayed-retry copy is scheduled on the consumer's entity, and a topic subscription
    /// cannot be sent to.
    #[error("consumer {name}: delayed retries need a queue, {entity} is a subscription")]
    RetryOnSubscription {
        /// The consumer.
        name: ConsumerName,
        /// Its subscription.
        entity: String,
    },
    /// A retry copy goes to the end of its session, breaking the session's order.
    #[error(
        "delayed retries cannot keep a session's order (a retry copy goes to the end of its \
         session): turn one of them off"
    )]
    RetryWithSessions,
    /// The consumer's envelope resolves foreign types through a table that is empty: every
    /// message whose type is not itself a contract would be dead-lettered `UnsupportedContract`.
    #[error(
        "consumer {name}: the {kind} envelope has no type map (envelope.types): map each \
         message type the entity carries to a contract"
    )]
    EmptyTypeMap {
        /// The consumer.
        name: ConsumerName,
        /// The envelope's kind.
        kind: &'static str,
    },
    /// A type map entry names a contract the handler does not take (a typo, or a route
    /// missing): every message of that type would be dead-lettered `UnsupportedContract`.
    #[error(
        "consumer {name}: envelope.types maps {type_name:?} to {contract}, which no route of \
         the handler takes (it takes {accepted})"
    )]
    UnroutedType {
        /// The consumer.
        name: ConsumerName,
        /// The type map's key.
        type_name: String,
        /// The contract it maps to (`name.vN`, or `name` when the envelope gives the version).
        contract: String,
        /// The handler's contracts, comma-separated.
        accepted: String,
    },
    /// The handler takes a contract that no type map entry maps to: with this envelope, no
    /// message can reach that route.
    #[error(
        "consumer {name}: the handler takes {contract}, and no entry of the {kind} envelope's \
         type map (envelope.types) maps to it: add its message type"
    )]
    UnmappedContract {
        /// The consumer.
        name: ConsumerName,
        /// The envelope's kind.
        kind: &'static str,
        /// The contract no type reaches.
        contract: String,
    },
}

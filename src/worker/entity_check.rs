//! At start-up the worker reads the entity it consumes from the management API
//! ([`crate::servicebus::admin`]) and checks what depends on it: the settings `[entity]` copies
//! (TTL, lock duration, max delivery count), the session mode, and that dedupe retention covers
//! the replay horizon those settings give. Without `[entity]` it uses what it read. Only where
//! the management API cannot be reached does it fall back to `[entity]`, and says so in the log
//! and on `/readyz`. "Cannot be reached" includes a management API that keeps answering 408,
//! 429 or 5xx through the client's retries, and one that does not answer within
//! [`START_CHECK_BOUND`] (protocol3 F4): a throttled API at fleet roll-out must not turn into a
//! crash loop.
//!
//! Why: a copy of the entity's settings that drifts from the portal silently makes retention
//! unsafe (an inbox row deleted before a redelivery lets the message take effect twice).

use std::time::Duration;

use super::horizon::{ReplayHorizon, RetentionTooShort};
use crate::servicebus::admin::{AdminClient, AdminError, EntityDescription, EntityProperties};
/// Defined with the `[entity]` section it is read from; still at this path.
pub use crate::worker::config::DeclaredEntity;

/// How long the start-up read may take in all, retries included: past it the worker starts on
/// `[entity]`, as when the management API is unreachable.
pub const START_CHECK_BOUND: Duration = Duration::from_secs(60);

/// Each try of the start-up read: the connect, then the rest (the token, the proxy tunnel,
/// TLS, the exchange); three retries and their backoff fit in [`START_CHECK_BOUND`].
const START_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const START_TRY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the worker refuses to start after reading its entity.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EntityCheckError {
    /// `[entity]` disagrees with the entity.
    #[error(
        "{key} = {declared} in [entity], but entity {entity} has {actual}: correct {key} (or \
         remove it: the worker reads the entity's settings itself)"
    )]
    Mismatch {
        /// The entity path.
        entity: String,
        /// The configuration key.
        key: &'static str,
        /// What the configuration says.
        declared: String,
        /// What the entity has.
        actual: String,
    },
    /// The session mode does not match `RequiresSession`.
    #[error(
        "entity {entity} has RequiresSession={requires_session}, but servicebus.sessions = \
         {configured}: set servicebus.sessions = {requires_session}"
    )]
    Sessions {
        /// The entity path.
        entity: String,
        /// The entity's setting.
        requires_session: bool,
        /// The worker's session mode.
        configured: bool,
    },
    /// Messages never reach the entity's receivers: it forwards them.
    #[error("entity {entity} forwards every message to {to} (ForwardTo): consume {to} instead")]
    Forwarded {
        /// The entity path.
        entity: String,
        /// The forwarding target.
        to: String,
    },
    /// The entity does not exist.
    #[error("entity {0} does not exist (the management API has no such queue or subscription)")]
    NotFound(String),
    /// The entity lacks a setting the horizon needs.
    #[error("entity {entity} reports no {setting}")]
    Incomplete {
        /// The entity path.
        entity: String,
        /// The missing setting.
        setting: &'static str,
    },
    /// Retention is shorter than the horizon the entity's settings give.
    #[error("entity {entity}: {source}")]
    RetentionTooShort {
        /// The entity path.
        entity: String,
        /// The comparison.
        #[source]
        source: RetentionTooShort,
    },
    /// Retention is set, the management API is unreachable and `[entity]` does not give all
    /// three settings: the horizon cannot be known.
    #[error(
        "entity {entity}: retention.retention_secs needs the replay horizon, but {reason} and \
         [entity] does not give message_ttl_secs, lock_duration_secs and max_delivery_count"
    )]
    Unverifiable {
        /// The entity path.
        entity: String,
        /// Why the entity could not be read.
        reason: String,
    },
    /// The management API refused the worker's credentials, or failed otherwise (not merely
    /// unreachable).
    #[error("reading entity {entity} from the management API failed")]
    Read {
        /// The entity path.
        entity: String,
        /// Why.
        #[source]
        source: AdminError,
    },
}

/// What the start-up check settled on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntitySource {
    /// Read from the management API and checked.
    Read(EntityProperties),
    /// The management API was unreachable: `[entity]` is used as written.
    Declared {
        /// Why it could not be read.
        reason: String,
    },
}

/// Checks `actual` (read from the management API) against the configuration: every
/// `[entity]` setting given must match, the session mode must match `RequiresSession`, the
/// entity must not forward, and `retention` (when set) must cover the horizon. Returns the
/// horizon the entity's settings give.
///
/// # Errors
/// [`EntityCheckError`] naming the first disagreement.
pub fn judge(
    entity: &str,
    declared: &DeclaredEntity,
    actual: &EntityProperties,
    sessions: bool,
    retention: Option<Duration>,
) -> Result<ReplayHorizon, EntityCheckError> {
    let mismatch =
        |key: &'static str, declared: String, actual: String| EntityCheckError::Mismatch {
            entity: entity.to_owned(),
            key,
            declared,
            actual,
        };
    let incomplete = |setting| EntityCheckError::Incomplete {
        entity: entity.to_owned(),
        setting,
    };
    consumable(entity, actual, sessions)?;
    let ttl = actual
        .default_message_time_to_live
        .ok_or_else(|| incomplete("DefaultMessageTimeToLive"))?;
    let lock = actual
        .lock_duration
        .ok_or_else(|| incomplete("LockDuration"))?;
    let max = actual
        .max_delivery_count
        .ok_or_else(|| incomplete("MaxDeliveryCount"))?;
    let secs = |d: Duration| format!("{} s", d.as_secs());
    if let Some(d) = declared.message_ttl
        && d.as_secs() != ttl.as_secs()
    {
        return Err(mismatch(
            "entity.message_ttl_secs",
            d.as_secs().to_string(),
            format!("DefaultMessageTimeToLive {}", secs(ttl)),
        ));
    }
    if let Some(d) = declared.lock_duration
        && d.as_secs() != lock.as_secs()
    {
        return Err(mismatch(
            "entity.lock_duration_secs",
            d.as_secs().to_string(),
            format!("LockDuration {}", secs(lock)),
        ));
    }
    if let Some(d) = declared.max_delivery_count
        && d != max
    {
        return Err(mismatch(
            "entity.max_delivery_count",
            d.to_string(),
            format!("MaxDeliveryCount {max}"),
        ));
    }
    let horizon = ReplayHorizon {
        message_ttl: ttl,
        lock_duration: lock,
        max_delivery_count: max,
        retry_span: declared.retry_span,
        dlq_resubmit_window: declared.dlq_resubmit_window,
    };
    if let Some(retention) = retention {
        horizon
            .check(retention)
            .map_err(|source| EntityCheckError::RetentionTooShort {
                entity: entity.to_owned(),
                source,
            })?;
    }
    Ok(horizon)
}

/// The entity can be consumed as configured: it does not forward, and its session mode is the
/// configuration's.
fn consumable(
    entity: &str,
    actual: &EntityProperties,
    sessions: bool,
) -> Result<(), EntityCheckError> {
    if let Some(to) = &actual.forward_to {
        return Err(EntityCheckError::Forwarded {
            entity: entity.to_owned(),
            to: to.clone(),
        });
    }
    if actual.requires_session != sessions {
        return Err(EntityCheckError::Sessions {
            entity: entity.to_owned(),
            requires_session: actual.requires_session,
            configured: sessions,
        });
    }
    Ok(())
}

/// Reads `entity` through `admin` and [`judge`]s it; falls back to `[entity]` only when the
/// management API cannot be reached (or `admin` is `None`: a connection string to a local
/// emulator has no management endpoint), returning why.
///
/// # Errors
/// [`EntityCheckError`] on a disagreement, a missing entity, refused credentials, or, in the
/// fallback, retention shorter than the horizon `[entity]` gives.
pub async fn read_and_judge(
    admin: Result<&AdminClient, String>,
    entity: &str,
    declared: &DeclaredEntity,
    sessions: bool,
    retention: Option<Duration>,
) -> Result<(Option<ReplayHorizon>, EntitySource), EntityCheckError> {
    let read = match admin {
        Ok(admin) => tokio::time::timeout(START_CHECK_BOUND, admin.entity(entity))
            .await
            .unwrap_or_else(|_| {
                Err(AdminError::Timeout {
                    endpoint: "the management API".to_owned(),
                    what: "answer",
                    after: START_CHECK_BOUND,
                })
            }),
        Err(reason) => return fallback(entity, declared, retention, reason),
    };
    judge_read(read, entity, declared, sessions, retention)
}

/// [`read_and_judge`] once the management API answered (or failed to).
fn judge_read(
    read: Result<Option<EntityDescription>, AdminError>,
    entity: &str,
    declared: &DeclaredEntity,
    sessions: bool,
    retention: Option<Duration>,
) -> Result<(Option<ReplayHorizon>, EntitySource), EntityCheckError> {
    match read {
        Ok(Some(description)) => {
            let horizon = judge(
                entity,
                declared,
                &description.properties,
                sessions,
                retention,
            )?;
            Ok((Some(horizon), EntitySource::Read(description.properties)))
        }
        Ok(None) => Err(EntityCheckError::NotFound(entity.to_owned())),
        Err(error) if error.is_unreachable() => {
            let reason = format!("the management API is unreachable: {error}");
            fallback(entity, declared, retention, reason)
        }
        // Throttled or failing past the client's retries (408, 429, 5xx): as unreachable.
        Err(error) if error.is_transient() => {
            let reason = format!("the management API kept failing: {error}");
            fallback(entity, declared, retention, reason)
        }
        // Least-privilege deployments receive with a Listen key or the Data Receiver role,
        // which may not read entity descriptions (that takes the Manage right): a refusal to
        // read is no reason to refuse to consume, so `[entity]` stands, noted on `/readyz`. Bad
        // credentials fail the receive link anyway.
        Err(AdminError::Unauthorized { status, detail }) => {
            let reason = format!(
                "the worker's credentials may not read the entity ({status}: {detail}); \
                 reading it takes the Manage right"
            );
            fallback(entity, declared, retention, reason)
        }
        Err(source) => Err(EntityCheckError::Read {
            entity: entity.to_owned(),
            source,
        }),
    }
}

fn fallback(
    entity: &str,
    declared: &DeclaredEntity,
    retention: Option<Duration>,
    reason: String,
) -> Result<(Option<ReplayHorizon>, EntitySource), EntityCheckError> {
    let horizon = declared.horizon();
    match (horizon, retention) {
        (Some(horizon), Some(retention)) => {
            horizon
                .check(retention)
                .map_err(|source| EntityCheckError::RetentionTooShort {
                    entity: entity.to_owned(),
                    source,
                })?;
        }
        (None, Some(_)) => {
            return Err(EntityCheckError::Unverifiable {
                entity: entity.to_owned(),
                reason,
            });
        }
        _ => {}
    }
    Ok((horizon, EntitySource::Declared { reason }))
}

/// What the start-up check found over every hosted entity.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct StartCheck {
    /// The longest replay horizon of the hosted entities: retention deletes the inbox rows of
    /// every consumer, so it must outlast each entity's. `None` when none could be computed.
    pub horizon: Option<ReplayHorizon>,
    /// Each hosted entity's `LockDuration`, where it was read from the management API.
    pub lock_durations: std::collections::HashMap<String, Duration>,
}

/// The start-up check of `sb-inbox run`: reads each hosted consumer's entity over the
/// management API with the worker's own credentials and trust roots, and judges each (a copy in
/// `[entity]` that disagrees, `ForwardTo`, the session mode, retention shorter than that
/// entity's horizon: each refuses the start). On a fallback the reason is logged and noted on
/// `/readyz` (`entity`, or `entity <name>` for entities after the first).
///
/// # Errors
/// As [`read_and_judge`], for the first entity that fails.
pub async fn at_start(
    config: &super::WorkerConfig,
    readiness: &super::Readiness,
) -> Result<StartCheck, EntityCheckError> {
    let admin = admin_client(config);
    let retention = config.retention.as_ref().map(|r| r.retention);
    let mut checked = StartCheck::default();
    for (n, entity) in hosted_entities(config).into_iter().enumerate() {
        let (horizon, source) = read_and_judge(
            admin.as_ref().map_err(Clone::clone),
            entity,
            &config.declared_entity,
            config.sessions.is_some(),
            retention,
        )
        .await?;
        let note = if n == 0 {
            "entity".to_owned()
        } else {
            format!("entity {entity}")
        };
        report(config, readiness, entity, &note, horizon, &source);
        if let EntitySource::Read(properties) = &source
            && let Some(lock) = properties.lock_duration
        {
            checked.lock_durations.insert(entity.to_owned(), lock);
        }
        checked.horizon = longest(checked.horizon, horizon);
    }
    Ok(checked)
}

/// The entities the worker's consumers read, each once, in their order (the first consumer's
/// entity when the list is empty).
fn hosted_entities(config: &super::WorkerConfig) -> Vec<&str> {
    let mut entities: Vec<&str> = Vec::new();
    for entity in config.consumers.iter().map(|c| c.entity.as_str()) {
        if !entities.contains(&entity) {
            entities.push(entity);
        }
    }
    if entities.is_empty() {
        entities.push(&config.entity);
    }
    entities
}

/// The longer of two horizons (by span).
fn longest(a: Option<ReplayHorizon>, b: Option<ReplayHorizon>) -> Option<ReplayHorizon> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.span() > a.span() { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Logs where `entity`'s settings came from; a fallback on a real namespace is noted on
/// `/readyz` under `note`.
fn report(
    config: &super::WorkerConfig,
    readiness: &super::Readiness,
    entity: &str,
    note: &str,
    horizon: Option<ReplayHorizon>,
    source: &EntitySource,
) {
    let horizon_secs = horizon.map(|h| h.span().as_secs());
    match source {
        EntitySource::Read(p) => {
            tracing::info!(entity, lock_duration = ?p.lock_duration, message_ttl = ?p.default_message_time_to_live, max_delivery_count = ?p.max_delivery_count, requires_session = p.requires_session, horizon_secs, "Entity settings read from the management API.");
        }
        // A local emulator's connection string names no management endpoint: `[entity]` is
        // the expected source there, not a degraded state worth a note on `/readyz`.
        EntitySource::Declared { reason } if local_emulator(config) => {
            tracing::info!(entity, %reason, horizon_secs, "Entity settings from [entity].");
        }
        EntitySource::Declared { reason } => {
            tracing::warn!(entity, %reason, horizon_secs, "Entity settings not read; using [entity] as configured.");
            readiness.note(
                note,
                format!("settings from [entity], not read from the entity: {reason}"),
            );
        }
    }
}

fn local_emulator(config: &super::WorkerConfig) -> bool {
    matches!(&config.broker, super::BrokerAddress::Connection(cs) if !cs.use_tls())
}

/// The management client for the worker's broker address; why there is none for a local
/// emulator's connection string.
fn admin_client(config: &super::WorkerConfig) -> Result<AdminClient, String> {
    match &config.broker {
        super::BrokerAddress::Connection(cs) if !cs.use_tls() => Err(
            "a UseDevelopmentEmulator connection string names no management endpoint".to_owned(),
        ),
        super::BrokerAddress::Connection(cs) => AdminClient::from_connection_string(cs)
            .and_then(|a| a.with_trust(&config.trust))
            .map(|a| bounded(a, config))
            .map_err(|e| e.to_string()),
        #[cfg(feature = "entra")]
        super::BrokerAddress::Namespace {
            host, client_id, ..
        } => {
            let credential = sb_servicebus::entra::EntraCredential::new(
                sb_servicebus::entra::EntraMode::Default,
                client_id.clone(),
            );
            let tokens = std::sync::Arc::new(crate::servicebus::EntraProvider::new(credential));
            AdminClient::for_namespace(host, tokens, &config.trust)
                .map(|a| bounded(a, config))
                .map_err(|e| e.to_string())
        }
        #[cfg(not(feature = "entra"))]
        super::BrokerAddress::Namespace { host, .. } => Err(format!(
            "{host}: Entra ID tokens need the `entra` cargo feature"
        )),
    }
}

/// The start-up read's bounds, through the worker's proxy (as its AMQP over WebSockets).
fn bounded(admin: AdminClient, config: &super::WorkerConfig) -> AdminClient {
    admin
        .with_proxy(&config.proxy)
        .with_timeouts(START_CONNECT_TIMEOUT, START_TRY_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actual() -> EntityProperties {
        EntityProperties {
            lock_duration: Some(Duration::from_secs(60)),
            default_message_time_to_live: Some(Duration::from_secs(86_400)),
            max_delivery_count: Some(10),
            ..EntityProperties::default()
        }
    }

    #[test]
    fn each_disagreement_names_its_setting_and_agreement_gives_the_horizon() {
        let none = DeclaredEntity::default();
        let horizon = judge("q", &none, &actual(), false, None).unwrap();
        assert_eq!(horizon.span(), Duration::from_secs(86_400 + 600));
        let table: [(DeclaredEntity, &str); 3] = [
            (
                DeclaredEntity {
                    message_ttl: Some(Duration::from_secs(3600)),
                    ..none
                },
                "entity.message_ttl_secs = 3600 in [entity], but entity q has DefaultMessageTimeToLive 86400 s",
            ),
            (
                DeclaredEntity {
                    lock_duration: Some(Duration::from_secs(30)),
                    ..none
                },
                "entity.lock_duration_secs = 30 in [entity], but entity q has LockDuration 60 s",
            ),
            (
                DeclaredEntity {
                    max_delivery_count: Some(5),
                    ..none
                },
                "entity.max_delivery_count = 5 in [entity], but entity q has MaxDeliveryCount 10",
            ),
        ];
        for (declared, message) in table {
            let error = judge("q", &declared, &actual(), false, None).unwrap_err();
            assert!(error.to_string().starts_with(message), "{error}");
        }
        // Near miss: the same values in [entity] agree.
        let same = DeclaredEntity {
            message_ttl: Some(Duration::from_secs(86_400)),
            lock_duration: Some(Duration::from_secs(60)),
            max_delivery_count: Some(10),
            ..none
        };
        assert!(judge("q", &same, &actual(), false, None).is_ok());
    }

    #[test]
    fn sessions_forwarding_and_retention_are_checked() {
        let none = DeclaredEntity::default();
        let sessions = EntityProperties {
            requires_session: true,
            ..actual()
        };
        let error = judge("q", &none, &sessions, false, None).unwrap_err();
        assert!(
            error.to_string().contains("servicebus.sessions = true"),
            "{error}"
        );
        assert!(judge("q", &none, &sessions, true, None).is_ok());
        let forwarded = EntityProperties {
            forward_to: Some("elsewhere".into()),
            ..actual()
        };
        assert!(matches!(
            judge("q", &none, &forwarded, false, None),
            Err(EntityCheckError::Forwarded { .. })
        ));
        let short = judge(
            "q",
            &none,
            &actual(),
            false,
            Some(Duration::from_secs(86_400)),
        );
        assert!(matches!(
            short,
            Err(EntityCheckError::RetentionTooShort { .. })
        ));
        assert!(
            judge(
                "q",
                &none,
                &actual(),
                false,
                Some(Duration::from_secs(87_000))
            )
            .is_ok()
        );
    }

    /// A Listen key or the Data Receiver role may not read the entity: the worker still starts on
    /// `[entity]`, saying why; without `[entity]` a retention cannot be checked and is refused.
    #[test]
    fn a_refusal_to_read_the_entity_falls_back_to_the_declared_copy() {
        for status in [401, 403] {
            let refused = || {
                Err(AdminError::Unauthorized {
                    status,
                    detail: "Manage claim required".to_owned(),
                })
            };
            let declared = DeclaredEntity {
                message_ttl: Some(Duration::from_secs(86_400)),
                lock_duration: Some(Duration::from_secs(60)),
                max_delivery_count: Some(10),
                ..DeclaredEntity::default()
            };
            let (horizon, source) = judge_read(
                refused(),
                "q",
                &declared,
                false,
                Some(Duration::from_secs(30 * 86_400)),
            )
            .unwrap();
            assert_eq!(horizon, declared.horizon());
            let EntitySource::Declared { reason } = source else {
                panic!("read, not declared: {source:?}");
            };
            assert!(reason.contains("Manage"), "{reason}");
            let unverifiable = judge_read(
                refused(),
                "q",
                &DeclaredEntity::default(),
                false,
                Some(Duration::from_secs(86_400)),
            )
            .unwrap_err();
            assert!(
                matches!(unverifiable, EntityCheckError::Unverifiable { .. }),
                "{unverifiable:?}"
            );
        }
        // A status no retry clears refuses the start; one that persisted through the
        // client's retries (408, 429, 5xx) falls back (protocol3 F4).
        let other = judge_read(
            Err(AdminError::Status {
                status: 400,
                detail: "bad".to_owned(),
            }),
            "q",
            &DeclaredEntity::default(),
            false,
            None,
        )
        .unwrap_err();
        assert!(matches!(other, EntityCheckError::Read { .. }), "{other:?}");
        for status in [408, 429, 500, 502, 503, 504] {
            let (_, source) = judge_read(
                Err(AdminError::Status {
                    status,
                    detail: "busy".to_owned(),
                }),
                "q",
                &DeclaredEntity::default(),
                false,
                None,
            )
            .unwrap_or_else(|e| panic!("{status}: {e}"));
            let EntitySource::Declared { reason } = source else {
                panic!("{status}: read, not declared: {source:?}");
            };
            assert!(reason.contains("kept failing"), "{status}: {reason}");
        }
    }
}

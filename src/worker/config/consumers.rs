//! The consumers a worker hosts: the top-level `consumer` on `servicebus.entity`, or each
//! `[[consumers]]` entry, one form or the other.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::envelope::{self, EnvelopeFile};
use super::keys::CONSUMER;
use super::reader::Reader;
use super::runtime::RuntimeSection;
use crate::envelope::EnvelopeReader;
use crate::runtime::{ConsumerName, UnknownContracts};
use crate::worker::ConsumerConfig;
use crate::worker::host::is_subscription;

/// One `[[consumers]]` entry as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConsumerFile {
    name: Option<String>,
    entity: Option<String>,
    concurrency: Option<u64>,
    prefetch: Option<u64>,
    envelope: Option<EnvelopeFile>,
    unknown_contracts: Option<String>,
}

/// One `[[consumers]]` entry read: its name and entity (`None` after a reported problem), and
/// its concurrency and prefetch (`runtime.*` when not given).
#[derive(Debug)]
pub(super) struct Listed {
    name: Option<ConsumerName>,
    entity: Option<String>,
    concurrency: u64,
    prefetch: u64,
    /// The entry's own `[consumers.envelope]`, else the top-level `[envelope]`'s.
    envelope: Option<Arc<dyn EnvelopeReader>>,
    unknown_contracts: UnknownContracts,
}

/// The top-level `consumer`: required without `[[consumers]]` (`listed`), refused beside them.
pub(super) fn single_name(
    r: &mut Reader<'_>,
    file: Option<String>,
    listed: bool,
) -> Option<ConsumerName> {
    match r.text(CONSUMER, file) {
        Some(_) if listed => {
            r.fail(
                CONSUMER,
                "give either consumer (and servicebus.entity) or [[consumers]], not both",
            );
            None
        }
        Some(name) => ConsumerName::new(name)
            .map_err(|e| r.fail(CONSUMER, e.to_string()))
            .ok(),
        None if listed => None,
        None => {
            r.fail(CONSUMER, "required (or [[consumers]])");
            None
        }
    }
}

/// Each `[[consumers]]` entry, checked one by one (names unique: each is an inbox key).
pub(super) fn listed(
    r: &mut Reader<'_>,
    entries: &[ConsumerFile],
    runtime: &RuntimeSection,
) -> Vec<Listed> {
    let mut listed: Vec<Listed> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let key = |field: &str| format!("consumers[{i}].{field}");
        let name = match &entry.name {
            Some(name) => ConsumerName::new(name.clone())
                .map_err(|e| r.fail_at(key("name"), e.to_string()))
                .ok(),
            None => {
                r.fail_at(key("name"), "required");
                None
            }
        };
        if let Some(name) = &name
            && listed.iter().any(|other| other.name.as_ref() == Some(name))
        {
            r.fail_at(
                key("name"),
                format!("{name} is listed twice: each consumer needs its own name (its inbox key)"),
            );
        }
        let entity = entry.entity.clone().filter(|e| !e.is_empty());
        if entity.is_none() {
            r.fail_at(
                key("entity"),
                "required: a queue or TOPIC/Subscriptions/SUBSCRIPTION",
            );
        }
        let concurrency = r.file_number(key("concurrency"), entry.concurrency, 1..=1024);
        let prefetch = r.file_number(key("prefetch"), entry.prefetch, 0..=10_000);
        let envelope = envelope::entry(r, entry.envelope.as_ref(), i);
        let unknown_contracts = match entry
            .unknown_contracts
            .as_deref()
            .map(str::parse::<UnknownContracts>)
        {
            Some(Ok(unknown)) => unknown,
            Some(Err(e)) => {
                r.fail_at(key("unknown_contracts"), e.to_string());
                runtime.unknown_contracts
            }
            None => runtime.unknown_contracts,
        };
        listed.push(Listed {
            unknown_contracts,
            name,
            entity,
            concurrency: concurrency.unwrap_or(runtime.concurrency),
            prefetch: prefetch.unwrap_or(runtime.prefetch),
            envelope,
        });
    }
    listed
}

/// A subscription among the consumed entities, if any (delayed retries cannot go back to one).
pub(super) fn subscription<'a>(listed: &'a [Listed], single: Option<&'a str>) -> Option<&'a str> {
    listed
        .iter()
        .filter_map(|entry| entry.entity.as_deref())
        .chain(single)
        .find(|entity| is_subscription(entity))
}

/// The consumers to host: the single one when named with its entity, else every complete
/// `[[consumers]]` entry; each with the `[runtime]` settings, the entity's lock duration and its
/// envelope (an entry's own, else `top_envelope`, else the subject-versioned default).
pub(super) fn hosted(
    single: (Option<ConsumerName>, Option<String>),
    listed: Vec<Listed>,
    runtime: &RuntimeSection,
    lock_duration: Option<Duration>,
    top_envelope: Option<&Arc<dyn EnvelopeReader>>,
) -> Vec<ConsumerConfig> {
    let config = |name, slots, unknown, envelope: Option<Arc<dyn EnvelopeReader>>| {
        let mut config = runtime.for_consumer(name, slots, unknown, lock_duration);
        if let Some(envelope) = envelope.or_else(|| top_envelope.cloned()) {
            config.envelope = envelope;
        }
        config
    };
    match single {
        (Some(name), Some(entity)) => vec![ConsumerConfig {
            entity,
            runtime: config(
                name,
                (runtime.concurrency, runtime.prefetch),
                runtime.unknown_contracts,
                None,
            ),
        }],
        _ => listed
            .into_iter()
            .filter_map(|entry| {
                Some(ConsumerConfig {
                    entity: entry.entity?,
                    runtime: config(
                        entry.name?,
                        (entry.concurrency, entry.prefetch),
                        entry.unknown_contracts,
                        entry.envelope,
                    ),
                })
            })
            .collect(),
    }
}

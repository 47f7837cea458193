//! `[envelope]` (and each `[consumers.envelope]`): how a consumer reads its deliveries
//! (`kind`: subject, masstransit, nservicebus, cloudevents, raw), with the type map and the raw
//! envelope's fields.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::keys::{
    ENVELOPE_CONTRACT, ENVELOPE_CONTRACT_FROM, ENVELOPE_ID_FROM, ENVELOPE_KIND, ENVELOPE_TYPES,
    ENVELOPE_VERSION_FROM, Key,
};
use super::reader::Reader;
use crate::envelope::{
    CloudEvents, Contract, EnvelopeReader, Field, MassTransit, NServiceBus, Raw, SubjectVersioned,
    TypeMap,
};

/// The envelope kinds `envelope.kind` takes, in `--help` order.
pub(super) const ENVELOPE_KINDS: [&str; 5] = [
    "subject",
    "masstransit",
    "nservicebus",
    "cloudevents",
    "raw",
];

/// An `[envelope]` table as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EnvelopeFile {
    kind: Option<String>,
    #[serde(default)]
    types: BTreeMap<String, String>,
    contract: Option<String>,
    contract_from: Option<String>,
    version_from: Option<String>,
    id_from: Option<String>,
}

/// Where an envelope's settings sit, for naming them in problems: the top-level `[envelope]`
/// (each key with its variable) or a `[[consumers]]` entry's (file only).
#[derive(Clone, Copy)]
pub(super) enum Place {
    TopLevel,
    Entry(usize),
}

impl Place {
    fn name(self, key: Key) -> String {
        match self {
            Place::TopLevel => key.to_string(),
            Place::Entry(i) => format!("consumers[{i}].{}", key.file),
        }
    }
}

/// The settings read: from the file, with the variables over the top-level table.
struct Settings {
    kind: Option<String>,
    types: Vec<(String, String)>,
    // Pairs were written (even if none parsed: that is reported on its own).
    types_given: bool,
    contract: Option<String>,
    contract_from: Option<String>,
    version_from: Option<String>,
    id_from: Option<String>,
}

/// The top-level envelope: `[envelope]` with `SB_INBOX_ENVELOPE*` over it; `None` when nothing
/// is set (the default, [`SubjectVersioned`], or a `[[consumers]]` entry's own).
pub(super) fn top_level(
    r: &mut Reader<'_>,
    file: &EnvelopeFile,
) -> Option<Arc<dyn EnvelopeReader>> {
    let (types, types_given) = match r.text(ENVELOPE_TYPES, None) {
        Some(pairs) => (parse_pairs(r, &pairs), true),
        None => (
            file.types.clone().into_iter().collect(),
            !file.types.is_empty(),
        ),
    };
    let settings = Settings {
        kind: r.text(ENVELOPE_KIND, file.kind.clone()),
        types,
        types_given,
        contract: r.text(ENVELOPE_CONTRACT, file.contract.clone()),
        contract_from: r.text(ENVELOPE_CONTRACT_FROM, file.contract_from.clone()),
        version_from: r.text(ENVELOPE_VERSION_FROM, file.version_from.clone()),
        id_from: r.text(ENVELOPE_ID_FROM, file.id_from.clone()),
    };
    build(r, settings, Place::TopLevel)
}

/// A `[[consumers]]` entry's envelope (file only); `None` when the entry has none.
pub(super) fn entry(
    r: &mut Reader<'_>,
    file: Option<&EnvelopeFile>,
    i: usize,
) -> Option<Arc<dyn EnvelopeReader>> {
    let file = file?;
    let settings = Settings {
        kind: file.kind.clone(),
        types: file.types.clone().into_iter().collect(),
        types_given: !file.types.is_empty(),
        contract: file.contract.clone(),
        contract_from: file.contract_from.clone(),
        version_from: file.version_from.clone(),
        id_from: file.id_from.clone(),
    };
    build(r, settings, Place::Entry(i))
}

/// `SB_INBOX_ENVELOPE_TYPES`: `TYPE=CONTRACT` pairs separated by `;` (neither .NET type names,
/// MassTransit URNs nor contracts contain `;`, and contracts no `=`).
fn parse_pairs(r: &mut Reader<'_>, pairs: &str) -> Vec<(String, String)> {
    let mut parsed = Vec::new();
    for pair in pairs.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.rsplit_once('=') {
            Some((type_name, contract)) => {
                parsed.push((type_name.trim().to_owned(), contract.trim().to_owned()));
            }
            None => r.fail(
                ENVELOPE_TYPES,
                format!("{pair:?} is not TYPE=CONTRACT (pairs separated by ;)"),
            ),
        }
    }
    parsed
}

fn build(r: &mut Reader<'_>, s: Settings, place: Place) -> Option<Arc<dyn EnvelopeReader>> {
    let raw_only = [
        (ENVELOPE_CONTRACT, s.contract.is_some()),
        (ENVELOPE_CONTRACT_FROM, s.contract_from.is_some()),
        (ENVELOPE_VERSION_FROM, s.version_from.is_some()),
        (ENVELOPE_ID_FROM, s.id_from.is_some()),
    ];
    let Some(kind) = s.kind.as_deref() else {
        let set: Vec<Key> = raw_only
            .iter()
            .filter(|(_, set)| *set)
            .map(|(key, _)| *key)
            .chain((!s.types.is_empty()).then_some(ENVELOPE_TYPES))
            .collect();
        for key in set {
            r.fail_at(place.name(key), "has no effect without envelope.kind");
        }
        return None;
    };
    let mut types = TypeMap::new();
    for (type_name, contract) in &s.types {
        if let Err(e) = types.insert(type_name, contract) {
            r.fail_at(place.name(ENVELOPE_TYPES), e.to_string());
        }
    }
    // Without a table, these readers dead-letter every message whose type is not itself a
    // contract name (MassTransit URNs, .NET type names, CloudEvents types never are): refused
    // here rather than discovered in the dead-letter queue.
    if matches!(kind, "masstransit" | "nservicebus" | "cloudevents") && !s.types_given {
        r.fail_at(
            place.name(ENVELOPE_TYPES),
            format!(
                "the {kind} envelope needs a type map: TYPE=CONTRACT pairs for every message type \
                 the entity carries"
            ),
        );
    }
    if kind != "raw" {
        for (key, set) in raw_only {
            if set {
                r.fail_at(
                    place.name(key),
                    format!("is for envelope.kind = \"raw\", not {kind:?}"),
                );
            }
        }
    }
    let reader: Result<Arc<dyn EnvelopeReader>, String> = match kind {
        "subject" if !s.types.is_empty() => Err("the subject envelope takes no type map".into()),
        "subject" => Ok(Arc::new(SubjectVersioned)),
        "masstransit" => MassTransit::new(types)
            .map(|reader| Arc::new(reader) as Arc<dyn EnvelopeReader>)
            .map_err(|e| e.to_string()),
        "nservicebus" => Ok(Arc::new(NServiceBus::new(types))),
        "cloudevents" => CloudEvents::new(types)
            .map(|reader| Arc::new(reader) as Arc<dyn EnvelopeReader>)
            .map_err(|e| e.to_string()),
        "raw" => return raw(r, &s, types, place),
        other => {
            r.fail_at(
                place.name(ENVELOPE_KIND),
                format!(
                    "{other:?} is not an envelope kind; one of: {}",
                    ENVELOPE_KINDS.join(", ")
                ),
            );
            return None;
        }
    };
    reader
        .map_err(|e| r.fail_at(place.name(ENVELOPE_TYPES), e))
        .ok()
}

fn raw(
    r: &mut Reader<'_>,
    s: &Settings,
    types: TypeMap,
    place: Place,
) -> Option<Arc<dyn EnvelopeReader>> {
    let mut field = |key: Key, text: &Option<String>| -> Option<Option<Field>> {
        match text.as_deref().map(str::parse::<Field>) {
            None => Some(None),
            Some(Ok(field)) => Some(Some(field)),
            Some(Err(e)) => {
                r.fail_at(place.name(key), e.to_string());
                None
            }
        }
    };
    let contract_from = field(ENVELOPE_CONTRACT_FROM, &s.contract_from)?;
    let version_from = field(ENVELOPE_VERSION_FROM, &s.version_from)?;
    let id_from = field(ENVELOPE_ID_FROM, &s.id_from)?;
    let base = match (&s.contract, contract_from) {
        (Some(contract), None) => match contract.parse::<Contract>() {
            Ok(contract) => Raw::fixed(contract),
            Err(e) => {
                r.fail_at(place.name(ENVELOPE_CONTRACT), e.to_string());
                return None;
            }
        },
        (None, Some(field)) => Raw::typed(field),
        (Some(_), Some(_)) => {
            r.fail_at(
                place.name(ENVELOPE_CONTRACT),
                "give either envelope.contract (fixed) or envelope.contract_from, not both",
            );
            return None;
        }
        (None, None) => {
            r.fail_at(
                place.name(ENVELOPE_CONTRACT),
                "the raw envelope needs envelope.contract (fixed) or envelope.contract_from",
            );
            return None;
        }
    };
    let with_version = match version_from {
        Some(field) => base
            .with_version(field)
            .map_err(|e| r.fail_at(place.name(ENVELOPE_VERSION_FROM), e.to_string()))
            .ok()?,
        None => base,
    };
    let with_id = match id_from {
        Some(field) => with_version.with_id(field),
        None => with_version,
    };
    with_id
        .with_types(types)
        .map(|reader| Arc::new(reader) as Arc<dyn EnvelopeReader>)
        .map_err(|e| r.fail_at(place.name(ENVELOPE_TYPES), e.to_string()))
        .ok()
}

//! [`RuntimeConfig`] as a service's own configuration file writes it (feature `serde`): the
//! keys and units of the worker's `[runtime]` section (`lock_margin_secs`, `batch_linger_ms`,
//! …), each absent key [`RuntimeConfig::new`]'s default, the result checked by
//! [`RuntimeConfig::validate`]. Delayed retries carry a sender and the envelope reader is code
//! (the worker's `[envelope]` table builds one), so code sets them after.

use std::time::Duration;

use super::{CircuitConfig, ConsumerName, RuntimeConfig, UnknownContracts};

/// The fields as written.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuntimeFields {
    consumer: String,
    concurrency: Option<usize>,
    prefetch: Option<usize>,
    lock_margin_secs: Option<u64>,
    lock_duration_secs: Option<u64>,
    max_processing_secs: Option<u64>,
    shutdown_grace_secs: Option<u64>,
    batch_size: Option<usize>,
    batch_linger_ms: Option<u64>,
    circuit: Option<CircuitConfig>,
    max_panics: Option<u32>,
    transient_hold_max_ms: Option<u64>,
    unknown_contracts: Option<String>,
}

impl TryFrom<RuntimeFields> for RuntimeConfig {
    type Error = String;

    fn try_from(fields: RuntimeFields) -> Result<Self, String> {
        let consumer = ConsumerName::new(&fields.consumer).map_err(|e| e.to_string())?;
        let mut config = RuntimeConfig::new(consumer);
        let secs = Duration::from_secs;
        let ms = Duration::from_millis;
        config.concurrency = fields.concurrency.unwrap_or(config.concurrency);
        config.prefetch = fields.prefetch.unwrap_or(config.prefetch);
        config.lock_margin = fields.lock_margin_secs.map_or(config.lock_margin, secs);
        config.lock_duration = fields.lock_duration_secs.map(secs);
        config.max_processing = fields
            .max_processing_secs
            .map_or(config.max_processing, secs);
        config.shutdown_grace = fields
            .shutdown_grace_secs
            .map_or(config.shutdown_grace, secs);
        config.batch_size = fields.batch_size.unwrap_or(config.batch_size);
        config.batch_linger = fields.batch_linger_ms.map_or(config.batch_linger, ms);
        config.circuit = fields.circuit.unwrap_or(config.circuit);
        config.max_panics = fields.max_panics.unwrap_or(config.max_panics);
        config.transient_hold_max = fields
            .transient_hold_max_ms
            .map_or(config.transient_hold_max, ms);
        if let Some(unknown) = fields.unknown_contracts {
            config.unknown_contracts = unknown
                .parse::<UnknownContracts>()
                .map_err(|e| e.to_string())?;
        }
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_section_reads_with_its_units_and_defaults() {
        let config: RuntimeConfig = serde_json::from_str(
            r#"{"consumer":"orders.inventory","concurrency":4,"lock_margin_secs":15,
                "lock_duration_secs":60,"batch_linger_ms":20,"transient_hold_max_ms":0,
                "circuit":{"consecutive":3},"unknown_contracts":"complete"}"#,
        )
        .unwrap();
        assert_eq!(config.consumer.to_string(), "orders.inventory");
        assert_eq!(config.concurrency, 4);
        assert_eq!(config.lock_margin, Duration::from_secs(15));
        assert_eq!(config.lock_duration, Some(Duration::from_secs(60)));
        assert_eq!(config.batch_linger, Duration::from_millis(20));
        assert_eq!(config.transient_hold_max, Duration::ZERO);
        assert_eq!(config.circuit.consecutive, 3);
        assert_eq!(config.unknown_contracts, UnknownContracts::Complete);
        let defaults = RuntimeConfig::new(config.consumer.clone());
        assert_eq!(config.prefetch, defaults.prefetch);
        assert_eq!(config.max_processing, defaults.max_processing);
        assert_eq!(config.max_panics, defaults.max_panics);
        assert!(config.delayed_retry.is_none());
    }

    #[test]
    fn what_cannot_work_is_refused_when_read() {
        for (json, why) in [
            (r#"{"consumer":"Bad Name"}"#, "consumer"),
            (r#"{"consumer":"orders","concurrency":0}"#, "concurrency"),
            (
                r#"{"consumer":"orders","lock_margin_secs":30,"lock_duration_secs":30}"#,
                "lock margin",
            ),
            (r#"{"consumer":"orders","lock_margin":30}"#, "lock_margin"),
            (
                r#"{"consumer":"orders","unknown_contracts":"drop"}"#,
                "complete",
            ),
        ] {
            let error = serde_json::from_str::<RuntimeConfig>(json)
                .expect_err(json)
                .to_string();
            assert!(error.contains(why), "{json}: {error}");
        }
    }
}

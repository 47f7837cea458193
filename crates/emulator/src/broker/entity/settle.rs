//! Settling locked messages: dispositions, the update-disposition request, lock renewal.

use std::time::SystemTime;

use sb_amqp::servicebus::management::DispositionStatus as WireStatus;
use uuid::Uuid;

use crate::error::Result;
use crate::message::Properties;
use crate::queue::Settlement;

use super::Entity;

/// The `disposition-status` of a `com.microsoft:update-disposition` management request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispositionStatus {
    /// `completed`.
    Completed,
    /// `abandoned`.
    Abandoned,
    /// `defered` (sic, as on the wire).
    Defered,
    /// `suspended`: dead-letter.
    Suspended,
}

impl DispositionStatus {
    /// Parses the wire value (case-insensitive; `deferred` spelled right is accepted too).
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.to_ascii_lowercase();
        match WireStatus::from_name(&value) {
            Some(WireStatus::Completed) => Some(DispositionStatus::Completed),
            Some(WireStatus::Abandoned) => Some(DispositionStatus::Abandoned),
            Some(WireStatus::Deferred) => Some(DispositionStatus::Defered),
            Some(WireStatus::Suspended) => Some(DispositionStatus::Suspended),
            None if value == "deferred" => Some(DispositionStatus::Defered),
            None => None,
        }
    }
}

impl Entity {
    /// Settles a locked message by lock token (link dispositions).
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) for an unknown, settled or expired token (also after an injected
    /// delay outlasted the lock); [`Error::Refused`](crate::Error::Refused) when a fault hook refuses it;
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) for dead-lettering in a dead-letter queue.
    pub async fn settle(&self, lock_token: Uuid, settlement: Settlement) -> Result<()> {
        self.disposition_fault().await?;
        self.with_queue("settle", |_, st, dlq, now| {
            st.settle(dlq, lock_token, settlement, now)
        })
    }

    async fn disposition_fault(&self) -> Result<()> {
        let delay = self.with_queue("settle", |_, st, _, _| st.faults.before_disposition())?;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }

    /// Completes a locked message.
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn complete(&self, lock_token: Uuid) -> Result<()> {
        self.settle(lock_token, Settlement::Complete).await
    }

    /// Abandons a locked message, merging `properties_to_modify` into its application
    /// properties; it is redelivered with delivery count + 1 or dead-lettered at
    /// `MaxDeliveryCount`.
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn abandon(&self, lock_token: Uuid, properties_to_modify: Properties) -> Result<()> {
        self.settle(
            lock_token,
            Settlement::Abandon {
                properties_to_modify,
            },
        )
        .await
    }

    /// Defers a locked message.
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn defer(&self, lock_token: Uuid, properties_to_modify: Properties) -> Result<()> {
        self.settle(
            lock_token,
            Settlement::Defer {
                properties_to_modify,
            },
        )
        .await
    }

    /// Dead-letters a locked message with `DeadLetterReason` and `DeadLetterErrorDescription`.
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn dead_letter(
        &self,
        lock_token: Uuid,
        reason: Option<String>,
        description: Option<String>,
        properties_to_modify: Properties,
    ) -> Result<()> {
        self.settle(
            lock_token,
            Settlement::DeadLetter {
                reason,
                description,
                properties_to_modify,
            },
        )
        .await
    }

    /// `com.microsoft:update-disposition`: settles each token in order; `suspended`
    /// dead-letters with the given reason and description.
    ///
    /// # Errors
    /// As [`settle`](Self::settle): the first failing token stops the request (earlier tokens
    /// stay settled).
    pub async fn update_disposition(
        &self,
        status: DispositionStatus,
        lock_tokens: &[Uuid],
        dead_letter_reason: Option<String>,
        dead_letter_description: Option<String>,
        properties_to_modify: Properties,
    ) -> Result<()> {
        self.disposition_fault().await?;
        for token in lock_tokens {
            let settlement = match status {
                DispositionStatus::Completed => Settlement::Complete,
                DispositionStatus::Abandoned => Settlement::Abandon {
                    properties_to_modify: properties_to_modify.clone(),
                },
                DispositionStatus::Defered => Settlement::Defer {
                    properties_to_modify: properties_to_modify.clone(),
                },
                DispositionStatus::Suspended => Settlement::DeadLetter {
                    reason: dead_letter_reason.clone(),
                    description: dead_letter_description.clone(),
                    properties_to_modify: properties_to_modify.clone(),
                },
            };
            self.with_queue("update-disposition", |_, st, dlq, now| {
                st.settle(dlq, *token, settlement, now)
            })?;
        }
        Ok(())
    }

    /// `com.microsoft:renew-lock`: extends each lock by the lock duration and returns the new
    /// expirations, in order.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if any token is unknown or expired (no lock is renewed then), or a
    /// fault hook refuses the renewal.
    pub fn renew_lock(&self, lock_tokens: &[Uuid]) -> Result<Vec<SystemTime>> {
        self.with_queue("renew-lock", |_, st, dlq, now| {
            st.renew(dlq, lock_tokens, now)
        })
    }
}

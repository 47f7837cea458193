//! `payments.payment-captured.v1` → the payment ledger: a typed JSON handler that claims the
//! payment's business key and applies only newer versions of the order's payment state.

use sb_inbox::store::Migration;
use sb_inbox::{
    Context, DecodeError, Handled, HandlerError, JsonContract, JsonHandler, SqliteTx, Tx,
    VersionCheck,
};

/// The consumer name: half of the inbox key. Never derived from a host or a version.
pub(crate) const CONSUMER: &str = "payments.payment-captured.v1";

/// The ledger's schema, applied with `SqliteStore::apply_migrations` after the core ones. Our
/// own versions start at 1000; sb-inbox keeps those below for itself.
pub(crate) const MIGRATION: Migration = Migration {
    version: 1000,
    name: "1000_payment_ledger.sql",
    sql: "CREATE TABLE payment_ledger (
              order_id     TEXT    NOT NULL CONSTRAINT pk_payment_ledger PRIMARY KEY,
              payment_id   TEXT    NOT NULL,
              captured     INTEGER NOT NULL,
              version      INTEGER NOT NULL);",
};

/// `payments.payment-captured.v1`: the payment service captured `capturedCents` in total for
/// an order; `version` counts the order's payment events. Fields it does not know are
/// ignored, so the payment service can add one without dead-lettering its events here.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PaymentCaptured {
    pub(crate) payment_id: String,
    pub(crate) order_id: String,
    pub(crate) captured_cents: i64,
    pub(crate) version: i64,
}

impl JsonContract for PaymentCaptured {
    const NAME: &'static str = "payments.payment-captured";
    const VERSION: u32 = 1;

    fn validate(&self) -> Result<(), DecodeError> {
        for (field, value) in [("paymentId", &self.payment_id), ("orderId", &self.order_id)] {
            if value.is_empty() || value.len() > 64 {
                return Err(DecodeError::new(format!(
                    "{field} must be 1 to 64 characters"
                )));
            }
        }
        if self.captured_cents <= 0 || self.version <= 0 {
            return Err(DecodeError::new(
                "capturedCents and version must be positive",
            ));
        }
        Ok(())
    }
}

/// The handler.
#[derive(Debug, Default)]
pub(crate) struct PaymentLedger;

impl JsonHandler<SqliteTx> for PaymentLedger {
    type Message = PaymentCaptured;

    async fn handle(
        &self,
        ctx: &Context<'_, PaymentCaptured>,
        payment: &PaymentCaptured,
        tx: &mut SqliteTx,
    ) -> Result<Handled, HandlerError> {
        // One capture, one effect, even when the payment service republishes it under another
        // message id: the business key's constraint says "duplicate".
        tx.claim_business_key(
            ctx.consumer.as_str(),
            &format!("payment:{}", payment.payment_id),
            ctx.logical_id(),
        )
        .await?;
        // Events of one order can arrive out of order: an older version changes nothing.
        let aggregate = format!("order:{}", payment.order_id);
        if let VersionCheck::Stale { .. } = tx
            .advance_version(ctx.consumer.as_str(), &aggregate, payment.version)
            .await?
        {
            return Ok(Handled::Stale);
        }
        tx.execute(
            "INSERT INTO payment_ledger (order_id, payment_id, captured, version)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (order_id) DO UPDATE
             SET payment_id = excluded.payment_id, captured = excluded.captured,
                 version = excluded.version",
            rusqlite::params![
                payment.order_id,
                payment.payment_id,
                payment.captured_cents,
                payment.version
            ],
        )?;
        Ok(Handled::Processed)
    }
}

/// A `payments.payment-captured.v1` message.
pub(crate) fn captured(
    message_id: &str,
    payment: &str,
    order: &str,
    cents: i64,
    version: i64,
) -> sb_inbox::Message {
    sb_inbox::Message::new(
        message_id,
        "payments.payment-captured.v1",
        format!(
            r#"{{"paymentId":"{payment}","orderId":"{order}","capturedCents":{cents},"version":{version}}}"#
        ),
    )
}

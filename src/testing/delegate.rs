//! [`recording_tx!`](crate::recording_tx): a [`RecordingTx`](super::RecordingTx) under a type
//! of the service's own, so the service's extension trait can be implemented for it in its
//! integration tests (the orphan rule forbids implementing a foreign trait for the foreign
//! `RecordingTx` there).

/// Defines `$name`: a [`Tx`](crate::Tx) that is a [`RecordingTx`](crate::testing::RecordingTx)
/// (every `Tx` method delegated; `Deref`/`DerefMut` to it, `From` it), a local type the
/// service's own extension trait can be implemented for, with one
/// [`RecordingTx::record`](crate::testing::RecordingTx::record) call per method.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::future::Future;
/// use sb_inbox::{StoreError, Tx};
///
/// // In the service's library: its own SQL, implemented for `PgTx` there.
/// pub trait OrdersTx: Tx {
///     fn insert_order(&mut self, id: &str, cents: i64)
///         -> impl Future<Output = Result<(), StoreError>> + Send;
/// }
///
/// // In its tests:
/// sb_inbox::recording_tx!(TestTx);
///
/// impl OrdersTx for TestTx {
///     async fn insert_order(&mut self, id: &str, cents: i64) -> Result<(), StoreError> {
///         self.record("insert_order", format!("{id} {cents}"))
///     }
/// }
///
/// let mut tx = TestTx::default();
/// tx.claim_business_key("shop.orders", "order:o-1", "m-1").await.unwrap();
/// tx.insert_order("o-1", 1250).await.unwrap();
/// assert_eq!(tx.business_keys(), ["order:o-1"]);
/// assert_eq!(tx.recorded("insert_order"), ["o-1 1250"]);
/// # }
/// ```
#[macro_export]
macro_rules! recording_tx {
    ($(#[$meta:meta])* $vis:vis $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name(pub $crate::testing::RecordingTx);

        impl ::core::ops::Deref for $name {
            type Target = $crate::testing::RecordingTx;
            fn deref(&self) -> &$crate::testing::RecordingTx {
                &self.0
            }
        }

        impl ::core::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut $crate::testing::RecordingTx {
                &mut self.0
            }
        }

        impl ::core::convert::From<$crate::testing::RecordingTx> for $name {
            fn from(tx: $crate::testing::RecordingTx) -> Self {
                $name(tx)
            }
        }

        impl $crate::Tx for $name {
            fn insert_inbox(
                &mut self,
                consumer: &str,
                logical_id: &str,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::insert_inbox(&mut self.0, consumer, logical_id)
            }
            fn insert_verdict(
                &mut self,
                consumer: &str,
                logical_id: &str,
                verdict: &$crate::Verdict,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::insert_verdict(&mut self.0, consumer, logical_id, verdict)
            }
            fn inbox_entry(
                &mut self,
                consumer: &str,
                logical_id: &str,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<
                    ::core::option::Option<$crate::InboxEntry>,
                    $crate::StoreError,
                >,
            > + ::core::marker::Send {
                $crate::Tx::inbox_entry(&mut self.0, consumer, logical_id)
            }
            fn take_over_verdict(
                &mut self,
                consumer: &str,
                logical_id: &str,
                resubmission: i64,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<bool, $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::take_over_verdict(&mut self.0, consumer, logical_id, resubmission)
            }
            fn claim_business_key(
                &mut self,
                consumer: &str,
                key: &str,
                logical_id: &str,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::claim_business_key(&mut self.0, consumer, key, logical_id)
            }
            fn advance_version(
                &mut self,
                consumer: &str,
                aggregate: &str,
                version: i64,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<$crate::VersionCheck, $crate::StoreError>,
            > + ::core::marker::Send {
                $crate::Tx::advance_version(&mut self.0, consumer, aggregate, version)
            }
            fn append_outbox(
                &mut self,
                message: &$crate::OutboxMessage,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::append_outbox(&mut self.0, message)
            }
            fn savepoint(
                &mut self,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<$crate::Savepoint, $crate::StoreError>,
            > + ::core::marker::Send {
                $crate::Tx::savepoint(&mut self.0)
            }
            fn rollback_to(
                &mut self,
                savepoint: $crate::Savepoint,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::rollback_to(&mut self.0, savepoint)
            }
            fn release(
                &mut self,
                savepoint: $crate::Savepoint,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::release(&mut self.0, savepoint)
            }
            fn bound_lock_waits(
                &mut self,
                limit: ::core::time::Duration,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::bound_lock_waits(&mut self.0, limit)
            }
            fn commit(
                self,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::commit(self.0)
            }
            fn rollback(
                self,
            ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::StoreError>>
                   + ::core::marker::Send {
                $crate::Tx::rollback(self.0)
            }
        }
    };
}

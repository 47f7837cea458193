//! [`recording_tx!`](crate::recording_tx): a [`RecordingTx`](super::RecordingTx) under a type
//! of the service's own, so the service's extension trait can be implemented for it in its
//! integration tests (the orphan rule forbids implementing a foreign trait for the foreign
//! `RecordingTx` there).

/// Defines `$name`: a [`Tx`](crate::Tx) that is a [`RecordingTx`](crate::testing::RecordingTx)
/// (every `Tx` and `StoreTx` method passed on through [`DelegateTx`](crate::DelegateTx); `Deref`/`DerefMut` to it, `From` it), a local type the
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

        // Every operation passed on to the `RecordingTx` (`DelegateTx`'s provided methods).
        impl $crate::ports::DelegateTx for $name {
            type Inner = $crate::testing::RecordingTx;
            fn inner(&mut self) -> &mut $crate::testing::RecordingTx {
                &mut self.0
            }
            fn into_inner(self) -> $crate::testing::RecordingTx {
                self.0
            }
        }
    };
}

//! Test handlers: wrappers that make an inner handler fail, take time or wait at a gate after
//! its business writes; small handlers of their own contracts; and a store wrapper that makes
//! transactions race.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sb_inbox::{
    Context, Contract, DecodeError, Handled, Handler, HandlerError, Message, Store, StoreError, Tx,
    VersionCheck,
};
use tokio::sync::{Barrier, Notify};
use tokio::time::Instant;

/// Implements `Handler` for a wrapper of an inner handler (in field `$inner`): the contracts
/// and the decoding are the inner handler's; `handle` is the body given, which calls the inner
/// handler where the wrapper wants it.
macro_rules! wrapper_handler {
    ($wrapper:ident, $inner:tt, |$this:ident, $ctx:ident, $tx:ident| $body:block) => {
        impl<T: sb_inbox::Tx, H: sb_inbox::Handler<T>> sb_inbox::Handler<T> for $wrapper<H> {
            type Payload = H::Payload;

            fn contracts(&self) -> &[sb_inbox::Contract] {
                self.$inner.contracts()
            }

            fn decode(
                &self,
                contract: &sb_inbox::Contract,
                body: &[u8],
            ) -> Result<H::Payload, sb_inbox::DecodeError> {
                self.$inner.decode(contract, body)
            }

            async fn handle(
                &$this,
                $ctx: &sb_inbox::Context<'_, H::Payload>,
                $tx: &mut T,
            ) -> Result<sb_inbox::Handled, sb_inbox::HandlerError> $body
        }
    };
}
// Only some binaries wrap handlers of their own with it.
#[allow(unused_imports)]
pub(crate) use wrapper_handler;

/// Fails the first `failures` attempts with a transient error after the inner handler wrote its
/// rows, so the transaction must roll them back. Records when each attempt started and on which
/// broker message id.
#[derive(Debug)]
pub struct Flaky<H> {
    inner: H,
    failures: AtomicU32,
    attempts: Mutex<Vec<(Instant, String)>>,
}

impl<H> Flaky<H> {
    /// `inner`, failing its first `failures` attempts.
    pub fn new(inner: H, failures: u32) -> Self {
        Flaky {
            inner,
            failures: AtomicU32::new(failures),
            attempts: Mutex::default(),
        }
    }

    /// Every attempt so far: when it started (tokio's clock) and the broker message id.
    pub fn attempts(&self) -> Vec<(Instant, String)> {
        self.attempts.lock().unwrap().clone()
    }

    /// The broker message id of every attempt so far, in order.
    pub fn attempted_ids(&self) -> Vec<String> {
        self.attempts().into_iter().map(|(_, id)| id).collect()
    }
}

wrapper_handler!(Flaky, inner, |self, ctx, tx| {
    let id = ctx.message.message_id.clone().unwrap_or_default();
    self.attempts.lock().unwrap().push((Instant::now(), id));
    let handled = self.inner.handle(ctx, tx).await?;
    let left = self.failures.load(Ordering::SeqCst);
    if left > 0 {
        self.failures.store(left - 1, Ordering::SeqCst);
        return Err(HandlerError::transient(
            "injected failure after the business writes",
        ));
    }
    Ok(handled)
});

/// Writes its rows, then takes `duration` of (tokio) time before returning.
#[derive(Debug)]
pub struct Slow<H> {
    pub inner: H,
    pub duration: Duration,
}

wrapper_handler!(Slow, inner, |self, ctx, tx| {
    let handled = self.inner.handle(ctx, tx).await?;
    tokio::time::sleep(self.duration).await;
    Ok(handled)
});

/// Signals `started`, then waits for `open` before returning.
#[derive(Debug)]
pub struct Gate<H> {
    pub inner: H,
    pub started: Arc<Notify>,
    pub open: Arc<Notify>,
}

wrapper_handler!(Gate, inner, |self, ctx, tx| {
    let handled = self.inner.handle(ctx, tx).await?;
    self.started.notify_one();
    self.open.notified().await;
    Ok(handled)
});

/// Accepts `orders.order-placed.v1` and writes nothing beyond the inbox row.
#[derive(Debug)]
pub struct Noop(pub Vec<Contract>);

impl Noop {
    /// A handler of `orders.order-placed.v1`.
    pub fn new() -> Self {
        Noop(vec![Contract::new("orders.order-placed", 1)])
    }
}

impl<T: Tx> Handler<T> for Noop {
    type Payload = ();

    fn contracts(&self) -> &[Contract] {
        &self.0
    }

    fn decode(&self, _: &Contract, _: &[u8]) -> Result<(), DecodeError> {
        Ok(())
    }

    async fn handle(&self, _: &Context<'_, ()>, _: &mut T) -> Result<Handled, HandlerError> {
        Ok(Handled::Processed)
    }
}

/// `orders.order-status.v1` `{"orderId": "...", "version": N}`: applies a status only when its
/// version is newer than the stored one.
#[derive(Debug)]
pub struct Versioned(pub Vec<Contract>);

impl Versioned {
    pub fn new() -> Self {
        Versioned(vec![Contract::new("orders.order-status", 1)])
    }

    pub fn message(message_id: &str, order_id: &str, version: i64) -> Message {
        Message::new(
            message_id,
            "orders.order-status.v1",
            format!(r#"{{"orderId":"{order_id}","version":{version}}}"#),
        )
    }
}

impl<T: Tx> Handler<T> for Versioned {
    type Payload = (String, i64);

    fn contracts(&self) -> &[Contract] {
        &self.0
    }

    fn decode(&self, _: &Contract, body: &[u8]) -> Result<(String, i64), DecodeError> {
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| DecodeError::json(&e))?;
        let order = value["orderId"]
            .as_str()
            .ok_or_else(|| DecodeError::new("orderId missing"))?;
        let version = value["version"]
            .as_i64()
            .ok_or_else(|| DecodeError::new("version missing"))?;
        Ok((order.to_owned(), version))
    }

    async fn handle(
        &self,
        ctx: &Context<'_, (String, i64)>,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        let (order, version) = &ctx.payload;
        match tx
            .advance_version(ctx.consumer.as_str(), &format!("order:{order}"), *version)
            .await?
        {
            VersionCheck::Advanced => Ok(Handled::Processed),
            VersionCheck::Stale { .. } => Ok(Handled::Stale),
        }
    }
}

/// Holds the first `parties` `begin`s until all of them are open, so those transactions race
/// for real; later ones (a duplicate's read of the message's inbox row, issue 41) go through.
#[derive(Debug, Clone)]
pub struct BarrierStore<S> {
    pub inner: S,
    pub barrier: Arc<Barrier>,
    /// How many `begin`s the barrier holds.
    pub parties: usize,
    /// `begin`s so far.
    pub begun: Arc<AtomicUsize>,
}

impl<S: Store> Store for BarrierStore<S> {
    type Tx = S::Tx;

    async fn begin(&self) -> Result<S::Tx, StoreError> {
        let tx = self.inner.begin().await?;
        if self.begun.fetch_add(1, Ordering::SeqCst) < self.parties {
            self.barrier.wait().await;
        }
        Ok(tx)
    }
}

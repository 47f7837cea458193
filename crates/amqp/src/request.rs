//! Request/response over a link pair on one node (`$cbs`, `$management`).
//!
//! Replies are matched to requests by `correlation-id` = request `message-id`, comparing AMQP
//! message-id values of any type (ulong, uuid, string, binary). A request whose future is
//! dropped leaves no trace: its late reply is discarded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fe2o3_amqp_types::messaging::{Message, MessageId, Properties, SerializableBody};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::core::{ReceiverOptions, Sender, SenderOptions, Session, unique_name};
use crate::delivery::{AnyMessage, Sendable};
use crate::error::{Error, Result};

/// The largest reply [`RequestResponse::attach`] takes: 1 MiB, several times what a `$cbs`
/// or `$management` status reply holds.
pub const DEFAULT_MAX_REPLY_SIZE: u64 = 1024 * 1024;

type Pending = Arc<Mutex<HashMap<MessageId, oneshot::Sender<AnyMessage>>>>;

/// A sender and a receiver on the same node, correlating replies to requests.
#[derive(Debug)]
pub struct RequestResponse {
    sender: Sender,
    pending: Pending,
    reply_to: String,
    next_id: AtomicU64,
    failure: Arc<Mutex<Option<Error>>>,
    task: JoinHandle<()>,
}

impl Drop for RequestResponse {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Guard<'a> {
    pending: &'a Pending,
    id: MessageId,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&self.id);
        }
    }
}

impl RequestResponse {
    /// Attaches the link pair to `node`, taking replies up to [`DEFAULT_MAX_REPLY_SIZE`]. The
    /// receiver's target (our `reply-to`) is a unique address derived from the node name.
    ///
    /// # Errors
    /// Attach errors.
    pub async fn attach(session: &Session, node: &str) -> Result<Self> {
        Self::attach_with_max_reply(session, node, DEFAULT_MAX_REPLY_SIZE).await
    }

    /// [`RequestResponse::attach`] whose reply link advertises `max_reply_size` as its
    /// `max-message-size`: a larger reply detaches it with `amqp:link:message-size-exceeded`
    /// (every later request then fails), so a peer cannot make us buffer more.
    ///
    /// # Errors
    /// Attach errors.
    pub async fn attach_with_max_reply(
        session: &Session,
        node: &str,
        max_reply_size: u64,
    ) -> Result<Self> {
        let reply_to = unique_name(&format!("{node}-reply"));
        let sender = session
            .attach_sender(SenderOptions::new(
                unique_name(&format!("{node}-sender")),
                node,
            ))
            .await?;
        let receiver = session
            .attach_receiver(
                ReceiverOptions::new(unique_name(&format!("{node}-receiver")), node)
                    .target(reply_to.clone())
                    .max_message_size(max_reply_size)
                    .auto_credit(64),
            )
            .await?;
        let pending: Pending = Arc::default();
        let failure: Arc<Mutex<Option<Error>>> = Arc::default();
        let (p, f) = (pending.clone(), failure.clone());
        let task = tokio::spawn(async move {
            loop {
                match receiver.recv().await {
                    Ok(d) => {
                        if !d.settled
                            && let Err(e) = receiver.accept(&d).await
                        {
                            tracing::debug!(error = %e, "Could not accept a reply.");
                        }
                        let m = match d.message() {
                            Ok(m) => m,
                            Err(e) => {
                                tracing::warn!(error = %e, "Undecodable reply discarded.");
                                continue;
                            }
                        };
                        let key = m.properties.as_ref().and_then(|p| {
                            p.correlation_id.clone().or_else(|| p.message_id.clone())
                        });
                        let waiter = key.and_then(|k| p.lock().ok().and_then(|mut p| p.remove(&k)));
                        match waiter {
                            // The requester may have given up in the meantime.
                            Some(w) => drop(w.send(m)),
                            None => tracing::debug!("Reply without a waiting request discarded."),
                        }
                    }
                    Err(e) => {
                        if let Ok(mut f) = f.lock() {
                            *f = Some(e);
                        }
                        if let Ok(mut p) = p.lock() {
                            p.clear();
                        }
                        return;
                    }
                }
            }
        });
        Ok(Self {
            sender,
            pending,
            reply_to,
            next_id: AtomicU64::new(1),
            failure,
            task,
        })
    }

    /// Why the pair stopped working (either link was detached, or the connection is gone);
    /// `None` while it works. A failed pair stays failed: attach a new one.
    pub fn error(&self) -> Option<Error> {
        let failed = self.failure.lock().ok().and_then(|f| f.clone());
        // The request link may go on its own (a forced detach) while replies still flow.
        failed.or_else(|| (!self.sender.is_attached()).then_some(Error::LinkDetached(None)))
    }

    /// The `reply-to` address put on requests.
    pub fn reply_to(&self) -> &str {
        &self.reply_to
    }

    /// Sends `request` and waits for its reply. A missing `message-id` is set to a ulong
    /// counter; `reply-to` is always set.
    ///
    /// # Errors
    /// [`Error::Rejected`] if the node rejects the request; link and connection errors.
    pub async fn request<B: SerializableBody>(
        &self,
        mut request: Message<B>,
    ) -> Result<AnyMessage> {
        let props = request.properties.get_or_insert_with(Properties::default);
        let id = props
            .message_id
            .get_or_insert_with(|| MessageId::Ulong(self.next_id.fetch_add(1, Ordering::Relaxed)))
            .clone();
        props.reply_to = Some(self.reply_to.clone());
        if let Some(e) = self.error() {
            return Err(e);
        }
        let (tx, rx) = oneshot::channel();
        if let Ok(mut p) = self.pending.lock() {
            p.insert(id.clone(), tx);
        }
        let _guard = Guard {
            pending: &self.pending,
            id,
        };
        self.sender
            .send(Sendable::message(&request)?)
            .await?
            .into_result()?;
        rx.await.map_err(|_| {
            self.failure
                .lock()
                .ok()
                .and_then(|f| f.clone())
                .unwrap_or(Error::LinkDetached(None))
        })
    }
}

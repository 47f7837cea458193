//! A link handle's event queue (deliveries, dispositions, the end of the link) and its credit
//! state, shareable between tasks, and [`LinkStatus`], the view of that state any task may hold.
//! The link handles above build on this file; it names none of them (issue 46).

use tokio::sync::{mpsc, watch};

use crate::core::command::{ConnCtx, LinkEvent};
use crate::delivery::LinkFlow;
use crate::error::{Error, Result};

/// Whether a link is still attached, readable from any task (a server's link listing, say)
/// without the link handle. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LinkStatus {
    /// The driver drops the sending end when the link leaves its state: detached by the peer
    /// (or our detach answered), its session ended, or the connection gone.
    flow: watch::Receiver<LinkFlow>,
}

impl LinkStatus {
    /// False once the link is gone: the peer detached it (or answered our detach), its session
    /// ended or the connection closed. A link we are detaching counts as attached until the
    /// peer answers.
    pub fn is_attached(&self) -> bool {
        self.flow.has_changed().is_ok()
    }

    /// Resolves once the link is gone (see [`LinkStatus::is_attached`]).
    pub async fn gone(mut self) {
        while self.flow.changed().await.is_ok() {}
    }
}

/// A link handle's view of its event queue and credit state, shareable between tasks.
#[derive(Debug)]
pub(crate) struct LinkEvents {
    rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<LinkEvent>>,
    gone: std::sync::Mutex<Option<Error>>,
    flow: watch::Receiver<LinkFlow>,
    flow_wait: tokio::sync::Mutex<watch::Receiver<LinkFlow>>,
}

impl LinkEvents {
    pub(super) fn new(
        rx: mpsc::UnboundedReceiver<LinkEvent>,
        flow: watch::Receiver<LinkFlow>,
    ) -> Self {
        Self {
            rx: tokio::sync::Mutex::new(rx),
            gone: std::sync::Mutex::new(None),
            flow_wait: tokio::sync::Mutex::new(flow.clone()),
            flow,
        }
    }

    fn gone(&self) -> Option<Error> {
        self.gone.lock().ok().and_then(|g| g.clone())
    }

    fn set_gone(&self, e: &Error) {
        if let Ok(mut g) = self.gone.lock() {
            *g = Some(e.clone());
        }
    }

    /// Next event `pick` accepts; other kinds are skipped. `Gone` ends the link for good.
    pub(super) async fn next<T>(
        &self,
        ctx: &ConnCtx,
        pick: impl Fn(LinkEvent) -> Option<T>,
    ) -> Result<T> {
        if let Some(e) = self.gone() {
            return Err(e);
        }
        let mut rx = self.rx.lock().await;
        loop {
            match rx.recv().await {
                Some(LinkEvent::Gone(e)) => {
                    self.set_gone(&e);
                    return Err(e);
                }
                Some(ev) => {
                    if let Some(v) = pick(ev) {
                        return Ok(v);
                    }
                }
                None => return Err(self.gone().unwrap_or_else(|| ctx.err())),
            }
        }
    }

    /// Like [`LinkEvents::next`] without waiting; `Ok(None)` if nothing is queued or another
    /// task is waiting on the queue.
    pub(super) fn try_next<T>(
        &self,
        ctx: &ConnCtx,
        pick: impl Fn(LinkEvent) -> Option<T>,
    ) -> Result<Option<T>> {
        if let Some(e) = self.gone() {
            return Err(e);
        }
        let Ok(mut rx) = self.rx.try_lock() else {
            return Ok(None);
        };
        loop {
            match rx.try_recv() {
                Ok(LinkEvent::Gone(e)) => {
                    self.set_gone(&e);
                    return Err(e);
                }
                Ok(ev) => {
                    if let Some(v) = pick(ev) {
                        return Ok(Some(v));
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => return Ok(None),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Err(self.gone().unwrap_or_else(|| ctx.err()));
                }
            }
        }
    }

    /// Why the link is gone: the queued detach/end/close error, else the connection's.
    fn gone_error(&self, ctx: &ConnCtx) -> Error {
        if let Some(e) = self.gone() {
            return e;
        }
        if let Ok(mut rx) = self.rx.try_lock() {
            while let Ok(ev) = rx.try_recv() {
                if let LinkEvent::Gone(e) = ev {
                    self.set_gone(&e);
                    return e;
                }
            }
        }
        ctx.err()
    }

    /// A cheap handle telling whether the link is still attached.
    pub(super) fn status(&self) -> LinkStatus {
        LinkStatus {
            flow: self.flow.clone(),
        }
    }

    pub(super) fn flow(&self) -> LinkFlow {
        *self.flow.borrow()
    }

    pub(super) async fn flow_changed(&self, ctx: &ConnCtx) -> Result<LinkFlow> {
        let mut w = self.flow_wait.lock().await;
        if w.changed().await.is_err() {
            return Err(self.gone_error(ctx));
        }
        Ok(*w.borrow_and_update())
    }

    pub(super) async fn wait_credit(&self, ctx: &ConnCtx) -> Result<LinkFlow> {
        let mut w = self.flow_wait.lock().await;
        let r = w.wait_for(|f| f.credit > 0).await.map(|f| *f);
        r.map_err(|_| self.gone_error(ctx))
    }
}

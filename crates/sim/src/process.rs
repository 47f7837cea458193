//! A simulated process's life, for crashes (`SIM_FAULTS=process`).
//!
//! The runtime, the relay and the client spawn tasks of their own (handler slots, lock keepers,
//! connection drivers), and tokio cannot abort a group of tasks: aborting the runtime's and
//! relay's tasks leaves their children running. A SIGKILL stops all of them at once, so a
//! dead process here is fenced instead: at its death every edge through which its code could
//! still touch the world stops answering, for good. Its open transactions are rolled back (as a
//! database server does when a client's connection dies), and whatever it asks of the store
//! afterwards waits forever ([`crate::store::FaultyStore`]); its connections are cut and it
//! cannot open new ones ([`crate::net::Net::cut_owner`], the run's connector); its handlers
//! stop where they are ([`crate::handler::SimHandler`]). Its leftover tasks then wait forever:
//! nothing they do after the instant of the crash is seen by the broker, the database or the
//! model.

use std::sync::{Arc, Mutex, Weak};

use sb_inbox::SqliteTx;
use tokio_util::sync::CancellationToken;

/// An open transaction of a process, shared with its [`crate::store::FaultyTx`] so that the
/// process's death can roll it back.
pub(crate) type Slot = Arc<Mutex<Option<SqliteTx>>>;

/// What a [`Life`] keeps of its open transactions: they end without it.
type OpenSlots = Arc<Mutex<Vec<Weak<Mutex<Option<SqliteTx>>>>>>;

/// One process's life: alive until [`Life::kill`].
#[derive(Debug, Clone, Default)]
pub struct Life {
    dead: CancellationToken,
    open: OpenSlots,
}

impl Life {
    /// A process alive now.
    pub fn new() -> Self {
        Life::default()
    }

    /// True once the process died.
    pub fn is_dead(&self) -> bool {
        self.dead.is_cancelled()
    }

    /// Returns at once while the process lives; never once it died.
    pub async fn alive(&self) {
        if self.is_dead() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves when the process dies.
    pub async fn died(&self) {
        self.dead.cancelled().await;
    }

    /// Notes a transaction the process opened.
    pub(crate) fn opened(&self, slot: &Slot) {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        open.retain(|weak| weak.strong_count() > 0);
        open.push(Arc::downgrade(slot));
    }

    /// Kills the process: from now on it cannot reach the store (its open transactions are
    /// rolled back here) nor, through [`Life::alive`], anything else. Returns how many
    /// transactions were rolled back.
    pub fn kill(&self) -> usize {
        self.dead.cancel();
        let open: Vec<_> = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
            .collect();
        let mut rolled_back = 0;
        for slot in open.iter().filter_map(Weak::upgrade) {
            let tx = slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            // Dropping a `SqliteTx` rolls it back and frees the connection for the living.
            if let Some(tx) = tx {
                drop(tx);
                rolled_back += 1;
            }
        }
        rolled_back
    }
}

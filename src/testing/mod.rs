//! Test tools (feature `test-util`): an in-memory broker with fault injection.
//!
//! [`MemoryBroker`] implements the [`crate::Receiver`] port with peek-lock semantics (lock
//! duration, expiry and redelivery with delivery count + 1, max delivery count, dead-letter
//! subqueue) on an injected [`crate::Clock`], so runtime tests are deterministic under tokio's
//! paused time. It implements the [`crate::Sender`] port too: scheduled messages become
//! receivable at their time on that clock. It is a test tool, not the demo broker: the demo runs on the Service Bus emulator.

mod memory;

pub use memory::{
    BrokerCounts, DeadLettered, MemoryBroker, MemoryDelivery, MemoryReceiver, RenewFault,
    SentMessage,
};

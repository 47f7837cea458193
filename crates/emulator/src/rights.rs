//! Shared access policies and their rights (Listen, Send, Manage).

use std::fmt;

/// One right a shared access policy grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Right {
    /// Receive, peek, renew locks, settle.
    Listen,
    /// Send and schedule.
    Send,
    /// Manage entities and rules (implies Listen and Send, as Azure requires).
    Manage,
}

impl Right {
    /// As Azure names it (`Listen`, `Send`, `Manage`).
    pub fn name(self) -> &'static str {
        match self {
            Right::Listen => "Listen",
            Right::Send => "Send",
            Right::Manage => "Manage",
        }
    }
}

impl fmt::Display for Right {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The rights of a key or token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rights {
    /// `Listen`.
    pub listen: bool,
    /// `Send`.
    pub send: bool,
    /// `Manage`.
    pub manage: bool,
}

impl Rights {
    /// Listen, Send and Manage: the root key (`RootManageSharedAccessKey`).
    pub const ALL: Rights = Rights {
        listen: true,
        send: true,
        manage: true,
    };

    /// True when these rights include `right`.
    pub fn allows(self, right: Right) -> bool {
        match right {
            Right::Listen => self.listen,
            Right::Send => self.send,
            Right::Manage => self.manage,
        }
    }

    /// Adds `right`.
    #[must_use]
    pub fn with(mut self, right: Right) -> Self {
        match right {
            Right::Listen => self.listen = true,
            Right::Send => self.send = true,
            Right::Manage => self.manage = true,
        }
        self
    }
}

/// A shared access policy: a key name, its key and its rights. An extension of Microsoft's
/// emulator `Config.json` (which has only the fixed `RootManageSharedAccessKey`):
/// `"SharedAccessPolicies": [{"Name": "listener", "Key": "…", "Rights": ["Listen"]}]` on the
/// namespace, as Azure's authorization rules (`Listen`, `Send`, `Manage`; Manage requires
/// Listen and Send).
#[derive(Clone, PartialEq, Eq)]
pub struct SharedAccessPolicy {
    /// `SharedAccessKeyName`.
    pub name: String,
    /// `SharedAccessKey` (never printed).
    pub key: String,
    /// What tokens signed with it may do.
    pub rights: Rights,
}

impl fmt::Debug for SharedAccessPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedAccessPolicy")
            .field("name", &self.name)
            .field("key", &"***")
            .field("rights", &self.rights)
            .finish()
    }
}

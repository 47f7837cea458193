//! [`UnknownContracts`]: what a consumer does with a contract no handler accepts.

use std::fmt;
use std::str::FromStr;

/// What happens to a message whose contract name no handler accepts
/// ([`DeadLetterReason::UnsupportedContract`](super::DeadLetterReason::UnsupportedContract)):
/// [`RuntimeConfig::unknown_contracts`](super::RuntimeConfig::unknown_contracts), or
/// `unknown_contracts` in `worker.toml` (`[runtime]` and per `[[consumers]]` entry).
///
/// What counts as unknown is every rejection with reason `UnsupportedContract`: a name no route
/// lists, a subject that names no `name.vN` at all, and a handler's own
/// `HandlerError::rejection` with that reason (rolled back first). A message with no contract
/// (`MissingContract`) is still dead-lettered.
///
/// Only an unknown *name* is affected: a known name in a version no handler accepts stays
/// `UnsupportedContractVersion` (dead-lettered) either way. That message is ours — a producer
/// shipped a version before its consumer — and completing it would lose it; from the dead-letter
/// queue it is resubmitted once a handler accepts the version.
///
/// # Examples
/// ```
/// use sb_inbox::UnknownContracts;
/// assert_eq!("complete".parse(), Ok(UnknownContracts::Complete));
/// assert_eq!(UnknownContracts::default(), UnknownContracts::DeadLetter);
/// assert!("drop".parse::<UnknownContracts>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownContracts {
    /// Dead-letter with reason `UnsupportedContract` (`dead-letter`, the default): on an
    /// entity that carries only this consumer's contracts, an unknown one is a mistake to
    /// look at.
    #[default]
    DeadLetter,
    /// Complete it without a transaction and count it (`complete`): for a topic subscription
    /// that also carries other teams' events. The outcome is
    /// [`Outcome::Ignored`](super::Outcome::Ignored), counted in
    /// [`StatsSnapshot::ignored`](super::StatsSnapshot::ignored) and the
    /// `sb_inbox.unknown_contracts` metric.
    Complete,
}

impl UnknownContracts {
    /// The configuration value: `dead-letter` or `complete`.
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownContracts::DeadLetter => "dead-letter",
            UnknownContracts::Complete => "complete",
        }
    }
}

impl fmt::Display for UnknownContracts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value other than `dead-letter` or `complete`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an unknown-contract outcome: use \"dead-letter\" or \"complete\"")]
pub struct UnknownContractsParseError(String);

impl FromStr for UnknownContracts {
    type Err = UnknownContractsParseError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "dead-letter" => Ok(UnknownContracts::DeadLetter),
            "complete" => Ok(UnknownContracts::Complete),
            other => Err(UnknownContractsParseError(super::truncate(other, 64))),
        }
    }
}

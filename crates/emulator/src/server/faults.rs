//! Command-line fault injection: faults the real service produces at random, drawn per
//! operation from a seeded generator so a failing run can be replayed with its seed.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

/// How the management API (HTTP) answers one request instead of handling it
/// ([`crate::Emulator::fail_management_requests`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ManagementFault {
    /// Answer this status (429 when throttled, 500/502/503/504 when failing), unhandled.
    Status(u16),
    /// Never answer: hold the connection until the client closes it (a stalled middlebox).
    Stall,
}

/// A fault the emulator can inject, each with a probability per operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Per transfer or disposition on any entity link: detach a random live entity link with
    /// `com.microsoft:server-busy` (Service Bus detaches links with server-busy, timeout,
    /// internal-error; the SDKs re-attach, e.g. azure-sdk-for-net `AmqpExceptionHelper`).
    DetachLink,
    /// Per unsettled disposition: answer `rejected{com.microsoft:server-busy}` without
    /// applying it (the message stays locked, as after a throttled settlement).
    BusySettle,
    /// Per transfer: close the connection with `amqp:connection:forced`.
    DropConnection,
    // Issue 29's connection-level faults (see `survival`).
    /// Per put-token: answer 503 without granting (the service's `$cbs` during a gateway
    /// upgrade; Go `azservicebus/internal/errors.go` retries management replies of 408, 500,
    /// 503).
    CbsBusy,
    /// Per transfer: end the link's AMQP session with `amqp:internal-error`, connection kept.
    EndSession,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Fault::DetachLink,
        Fault::BusySettle,
        Fault::DropConnection,
        Fault::CbsBusy,
        Fault::EndSession,
    ];

    /// The command-line name (`--fault NAME=P`).
    pub fn name(self) -> &'static str {
        match self {
            Fault::DetachLink => "detach-link",
            Fault::BusySettle => "busy-settle",
            Fault::DropConnection => "drop-connection",
            Fault::CbsBusy => "cbs-busy",
            Fault::EndSession => "end-session",
        }
    }

    fn index(self) -> usize {
        match self {
            Fault::DetachLink => 0,
            Fault::BusySettle => 1,
            Fault::DropConnection => 2,
            Fault::CbsBusy => 3,
            Fault::EndSession => 4,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--fault NAME=P`: a fault and its probability in `[0, 1]`.
///
/// # Examples
/// ```
/// use sb_emulator::{Fault, FaultSpec};
/// let spec: FaultSpec = "busy-settle=0.02".parse().unwrap();
/// assert_eq!(spec, FaultSpec { fault: Fault::BusySettle, probability: 0.02 });
/// assert!("busy-settle=2".parse::<FaultSpec>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultSpec {
    /// Which fault.
    pub fault: Fault,
    /// Probability per operation, `0.0..=1.0`.
    pub probability: f64,
}

impl FromStr for FaultSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names = || {
            Fault::ALL
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (name, p) = s
            .split_once('=')
            .ok_or_else(|| format!("expected NAME=PROBABILITY (NAME one of {})", names()))?;
        let fault = Fault::ALL
            .into_iter()
            .find(|f| f.name() == name.trim())
            .ok_or_else(|| format!("unknown fault {name:?} (one of {})", names()))?;
        let probability: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("{name}: {p:?} is not a number"))?;
        if !(0.0..=1.0).contains(&probability) {
            return Err(format!(
                "{name}: probability {probability} is not within 0..=1"
            ));
        }
        Ok(FaultSpec { fault, probability })
    }
}

/// A fault of `--management-fault`: how a management request is answered instead of handled,
/// on the HTTP management API (Atom, what `ServiceBusAdministrationClient` calls) and on the
/// AMQP `<entity>/$management` node (lock renewal, peek, settlement by lock token, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ManagementFaultKind {
    /// Server busy. HTTP 503 (.NET's administration client reads 503 as
    /// `ServiceBusFailureReason.ServiceBusy`, `Administration/HttpRequestAndResponse.cs`
    /// `ThrowIfRequestFailed`, after Azure.Core's pipeline retried it,
    /// `ResponseClassifier.IsRetriableResponse`: 408, 429, 500, 502, 503, 504); `$management`
    /// status 503 with `com.microsoft:server-busy` (.NET `AmqpExceptionHelper`:
    /// `ServerBusyException`, retried after the client-wide server-busy pause).
    Busy,
    /// A throttled namespace. HTTP 429 (Resource Manager's "The request was terminated because
    /// the namespace … is being throttled", learn.microsoft.com service-bus-resource-manager-exceptions;
    /// retried by Azure.Core); `$management` as [`ManagementFaultKind::Busy`] with the
    /// throttling text (AMQP throttles with `com.microsoft:server-busy`, Microsoft Learn
    /// "Throttling operations on Azure Service Bus").
    Throttled,
    /// The operation ran past its time. HTTP 408; `$management` 408 with
    /// `com.microsoft:timeout` (.NET: `ServiceBusTimeoutException`, transient).
    Timeout,
    /// HTTP 500; `$management` 500 with `amqp:internal-error` (transient for every SDK).
    InternalError,
    /// Never answered: the HTTP connection is held until the client closes it, the
    /// `$management` request gets no reply; the client's own timeout must end the wait.
    Stall,
}

impl ManagementFaultKind {
    const ALL: [ManagementFaultKind; 5] = [
        ManagementFaultKind::Busy,
        ManagementFaultKind::Throttled,
        ManagementFaultKind::Timeout,
        ManagementFaultKind::InternalError,
        ManagementFaultKind::Stall,
    ];

    /// The command-line name (`--management-fault NAME[xN]`).
    pub fn name(self) -> &'static str {
        match self {
            ManagementFaultKind::Busy => "busy",
            ManagementFaultKind::Throttled => "throttled",
            ManagementFaultKind::Timeout => "timeout",
            ManagementFaultKind::InternalError => "internal-error",
            ManagementFaultKind::Stall => "stall",
        }
    }

    /// How the HTTP management API answers it.
    pub fn http(self) -> ManagementFault {
        match self {
            ManagementFaultKind::Busy => ManagementFault::Status(503),
            ManagementFaultKind::Throttled => ManagementFault::Status(429),
            ManagementFaultKind::Timeout => ManagementFault::Status(408),
            ManagementFaultKind::InternalError => ManagementFault::Status(500),
            ManagementFaultKind::Stall => ManagementFault::Stall,
        }
    }

    /// How a `$management` node answers it (the condition follows the status, see
    /// [`crate::Emulator::fail_management_node_requests`]).
    pub fn node(self) -> ManagementFault {
        match self {
            ManagementFaultKind::Busy | ManagementFaultKind::Throttled => {
                ManagementFault::Status(503)
            }
            ManagementFaultKind::Timeout => ManagementFault::Status(408),
            ManagementFaultKind::InternalError => ManagementFault::Status(500),
            ManagementFaultKind::Stall => ManagementFault::Stall,
        }
    }
}

impl fmt::Display for ManagementFaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--management-fault FAULT[xN]`: the next `times` management requests (HTTP and
/// `$management`, each counting its own) are answered with `fault`.
///
/// # Examples
/// ```
/// use sb_emulator::{ManagementFaultKind, ManagementFaultSpec};
/// let spec: ManagementFaultSpec = "busyx3".parse().unwrap();
/// assert_eq!(spec, ManagementFaultSpec { fault: ManagementFaultKind::Busy, times: 3 });
/// let once: ManagementFaultSpec = "internal-error".parse().unwrap();
/// assert_eq!(once.times, 1);
/// assert!("busyx0".parse::<ManagementFaultSpec>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagementFaultSpec {
    /// Which answer.
    pub fault: ManagementFaultKind,
    /// How many requests get it.
    pub times: usize,
}

impl FromStr for ManagementFaultSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names = || {
            ManagementFaultKind::ALL
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let s = s.trim();
        // `NAMExN`: the count is the digits after the last `x`, when there are any.
        let (name, times) = match s.rsplit_once('x') {
            Some((name, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                let times: usize = n
                    .parse()
                    .map_err(|_| format!("{s}: {n:?} is not a count"))?;
                (name, times)
            }
            _ => (s, 1),
        };
        if times == 0 {
            return Err(format!("{s}: the count must be at least 1"));
        }
        let fault = ManagementFaultKind::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| format!("unknown management fault {name:?} (one of {})", names()))?;
        Ok(ManagementFaultSpec { fault, times })
    }
}

/// The faults in force and their generator.
#[derive(Debug)]
pub(crate) struct Faults {
    probability: [f64; Fault::ALL.len()],
    /// splitmix64 state: tiny, seedable, good enough for fault draws.
    state: Mutex<u64>,
}

impl Faults {
    pub(crate) fn new(specs: &[FaultSpec], seed: u64) -> Self {
        let mut probability = [0.0; Fault::ALL.len()];
        for spec in specs {
            probability[spec.fault.index()] = spec.probability;
        }
        Faults {
            probability,
            state: Mutex::new(seed),
        }
    }

    fn next(&self) -> u64 {
        let Ok(mut state) = self.state.lock() else {
            return u64::MAX;
        };
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Draws once for `fault`: true with its probability (no draw when the fault is off).
    pub(crate) fn hit(&self, fault: Fault) -> bool {
        let p = self.probability[fault.index()];
        if p <= 0.0 {
            return false;
        }
        // 53 random bits → uniform in [0, 1).
        let x = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// A uniform index below `n` (`n > 0`).
    pub(crate) fn pick(&self, n: usize) -> usize {
        usize::try_from(self.next() % n.max(1) as u64).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs_and_refuses_bad_ones() {
        let spec: FaultSpec = "detach-link=0.5".parse().unwrap();
        assert_eq!(spec.fault, Fault::DetachLink);
        assert!("detach-link".parse::<FaultSpec>().is_err());
        assert!("nope=0.1".parse::<FaultSpec>().is_err());
        assert!("drop-connection=-0.1".parse::<FaultSpec>().is_err());
        assert!("drop-connection=x".parse::<FaultSpec>().is_err());
    }

    #[test]
    fn parses_management_faults_and_refuses_bad_ones() {
        let spec: ManagementFaultSpec = "throttledx12".parse().unwrap();
        assert_eq!(
            (spec.fault, spec.times),
            (ManagementFaultKind::Throttled, 12)
        );
        let spec: ManagementFaultSpec = "stall".parse().unwrap();
        assert_eq!((spec.fault, spec.times), (ManagementFaultKind::Stall, 1));
        assert!("busyx".parse::<ManagementFaultSpec>().is_err());
        assert!("busyx0".parse::<ManagementFaultSpec>().is_err());
        assert!("nope".parse::<ManagementFaultSpec>().is_err());
        assert!("x3".parse::<ManagementFaultSpec>().is_err());
        // Throttling is 429 over HTTP, server-busy (503) on the AMQP node.
        assert_eq!(
            ManagementFaultKind::Throttled.http(),
            ManagementFault::Status(429)
        );
        assert_eq!(
            ManagementFaultKind::Throttled.node(),
            ManagementFault::Status(503)
        );
    }

    #[test]
    fn draws_are_reproducible_and_near_their_probability() {
        let spec = FaultSpec {
            fault: Fault::BusySettle,
            probability: 0.25,
        };
        let a = Faults::new(&[spec], 7);
        let b = Faults::new(&[spec], 7);
        let draws_a: Vec<bool> = (0..10_000).map(|_| a.hit(Fault::BusySettle)).collect();
        let draws_b: Vec<bool> = (0..10_000).map(|_| b.hit(Fault::BusySettle)).collect();
        assert_eq!(draws_a, draws_b);
        let hits = draws_a.iter().filter(|h| **h).count();
        assert!((2_300..2_700).contains(&hits), "{hits} hits of 10000");
        assert!(!a.hit(Fault::DetachLink), "off faults never fire");
        let always = Faults::new(
            &[FaultSpec {
                fault: Fault::DropConnection,
                probability: 1.0,
            }],
            1,
        );
        assert!((0..100).all(|_| always.hit(Fault::DropConnection)));
    }
}

//! Injected faults of one queue or subscription: paused delivery, refused or delayed
//! dispositions, refused renewals, undecodable deliveries.

use std::time::Duration;

use crate::error::{Error, Result};

/// Injected faults of one queue or subscription (both subqueues).
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub(crate) paused: bool,
    pub(crate) refuse_renewals: u32,
    pub(crate) refuse_dispositions: u32,
    pub(crate) delay_dispositions: u32,
    pub(crate) disposition_delay: Duration,
    pub(crate) undecodable_deliveries: u32,
}

impl Faults {
    /// Consumes one disposition fault: a refusal, or a delay to wait before settling.
    pub(crate) fn before_disposition(&mut self) -> Result<Option<Duration>> {
        if self.refuse_dispositions > 0 {
            self.refuse_dispositions -= 1;
            return Err(Error::Refused {
                operation: "disposition",
            });
        }
        if self.delay_dispositions > 0 {
            self.delay_dispositions -= 1;
            return Ok(Some(self.disposition_delay));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_refuse_before_delaying() {
        let mut f = Faults {
            refuse_dispositions: 1,
            delay_dispositions: 1,
            disposition_delay: Duration::from_secs(1),
            ..Faults::default()
        };
        assert!(matches!(f.before_disposition(), Err(Error::Refused { .. })));
        assert_eq!(
            f.before_disposition().unwrap(),
            Some(Duration::from_secs(1))
        );
        assert_eq!(f.before_disposition().unwrap(), None);
    }
}

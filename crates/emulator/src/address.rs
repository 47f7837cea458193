//! Link addresses: `q1`, `amqps://host:5699/q1`, `<topic>/Subscriptions/<sub>`,
//! `<entity>/$DeadLetterQueue`, `<entity>/$management`, `$cbs`.

use std::fmt;

use sb_amqp::servicebus::{cbs, management};

use crate::error::{Error, Result};

/// An entity as addressed by a link: a queue or topic, optionally a subscription, optionally its
/// dead-letter subqueue. Names keep the caller's case; the broker resolves them
/// case-insensitively, as Service Bus does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityPath {
    /// The queue or topic name.
    pub entity: String,
    /// The subscription name when the address is `<topic>/Subscriptions/<sub>`.
    pub subscription: Option<String>,
    /// Whether the address names the `$DeadLetterQueue` subqueue.
    pub dead_letter: bool,
}

impl EntityPath {
    /// A queue or topic.
    pub fn entity(name: impl Into<String>) -> Self {
        EntityPath {
            entity: name.into(),
            subscription: None,
            dead_letter: false,
        }
    }

    /// A subscription of a topic.
    pub fn subscription(topic: impl Into<String>, subscription: impl Into<String>) -> Self {
        EntityPath {
            entity: topic.into(),
            subscription: Some(subscription.into()),
            dead_letter: false,
        }
    }

    /// The same entity's dead-letter subqueue.
    pub fn dead_letter_queue(mut self) -> Self {
        self.dead_letter = true;
        self
    }
}

impl fmt::Display for EntityPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.entity)?;
        if let Some(sub) = &self.subscription {
            write!(f, "/Subscriptions/{sub}")?;
        }
        if self.dead_letter {
            f.write_str("/$DeadLetterQueue")?;
        }
        Ok(())
    }
}

/// The entity path of a link address: scheme, host and port stripped (the key the server's
/// grants, link routing and reply routes use).
pub(crate) fn link_path(address: &str) -> String {
    let rest = match address.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, p)| p),
        None => address,
    };
    rest.trim_matches('/').to_owned()
}

/// What a link's source or target address names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A queue, topic, subscription or dead-letter subqueue.
    Entity(EntityPath),
    /// The `$management` node of an entity.
    Management(EntityPath),
    /// The claims-based security node `$cbs`.
    Cbs,
}

impl Address {
    /// Parses an address: strips the scheme, host and port, then reads the path.
    ///
    /// Segment keywords (`Subscriptions`, `$DeadLetterQueue`, `$management`, `$cbs`) compare
    /// case-insensitively. Entity names may contain `/` (Microsoft's name pattern allows it), so
    /// the path is read from the end.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] when no entity name is left.
    ///
    /// # Examples
    /// ```
    /// use sb_emulator::{Address, EntityPath};
    ///
    /// let a = Address::parse("amqps://localhost:5699/orders/Subscriptions/audit/$DeadLetterQueue")?;
    /// assert_eq!(a, Address::Entity(EntityPath::subscription("orders", "audit").dead_letter_queue()));
    /// # Ok::<(), sb_emulator::Error>(())
    /// ```
    pub fn parse(address: &str) -> Result<Address> {
        let invalid = |reason| Error::InvalidAddress {
            address: address.to_owned(),
            reason,
        };
        let path = match address.find("://") {
            // Drop the scheme and the authority (host and port) up to the first slash.
            Some(i) => match address[i + 3..].find('/') {
                Some(j) => &address[i + 3 + j..],
                None => "",
            },
            None => address,
        };
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let mut segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        if segments.len() == 1 && segments[0].eq_ignore_ascii_case(cbs::NODE) {
            return Ok(Address::Cbs);
        }
        let management = segments
            .last()
            .is_some_and(|s| s.eq_ignore_ascii_case(management::NODE_SUFFIX));
        if management {
            segments.pop();
        }
        let dead_letter = segments
            .last()
            .is_some_and(|s| s.eq_ignore_ascii_case("$DeadLetterQueue"));
        if dead_letter {
            segments.pop();
        }
        let n = segments.len();
        let subscription = if n >= 3 && segments[n - 2].eq_ignore_ascii_case("Subscriptions") {
            let sub = segments[n - 1].to_owned();
            segments.truncate(n - 2);
            Some(sub)
        } else {
            None
        };
        if segments.is_empty() {
            return Err(invalid("no entity name"));
        }
        if segments.iter().any(|s| s.starts_with('$')) {
            return Err(invalid("unknown system node"));
        }
        let path = EntityPath {
            entity: segments.join("/"),
            subscription,
            dead_letter,
        };
        Ok(if management {
            Address::Management(path)
        } else {
            Address::Entity(path)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(a: &str) -> EntityPath {
        match Address::parse(a).unwrap() {
            Address::Entity(p) => p,
            other => panic!("{a}: {other:?}"),
        }
    }

    #[test]
    fn plain_and_url_forms() {
        for a in [
            "q1",
            "/q1",
            "amqps://localhost:5699/q1",
            "amqp://127.0.0.1/q1",
            "sb://sbemulatorns.localhost/q1/",
        ] {
            assert_eq!(entity(a), EntityPath::entity("q1"), "{a}");
        }
    }

    #[test]
    fn subscriptions_and_dead_letter_queues() {
        assert_eq!(
            entity("t1/Subscriptions/s1"),
            EntityPath::subscription("t1", "s1")
        );
        assert_eq!(
            entity("amqp://127.0.0.1:5672/t1/subscriptions/s1/$deadletterqueue"),
            EntityPath::subscription("t1", "s1").dead_letter_queue()
        );
        assert_eq!(
            entity("q1/$DeadLetterQueue"),
            EntityPath::entity("q1").dead_letter_queue()
        );
        // Names with slashes are read from the end.
        assert_eq!(
            entity("a/b/Subscriptions/c"),
            EntityPath::subscription("a/b", "c")
        );
        assert_eq!(entity("a/b"), EntityPath::entity("a/b"));
    }

    #[test]
    fn management_and_cbs() {
        assert_eq!(
            Address::parse("sb://localhost:5699/q1/$management").unwrap(),
            Address::Management(EntityPath::entity("q1"))
        );
        assert_eq!(
            Address::parse("t/Subscriptions/s/$Management").unwrap(),
            Address::Management(EntityPath::subscription("t", "s"))
        );
        assert_eq!(Address::parse("$cbs").unwrap(), Address::Cbs);
        assert_eq!(
            Address::parse("amqp://localhost/$CBS").unwrap(),
            Address::Cbs
        );
    }

    #[test]
    fn rejects_empty_and_unknown_nodes() {
        for a in [
            "",
            "/",
            "amqp://localhost",
            "amqp://localhost/",
            "$DeadLetterQueue",
            "$foo",
        ] {
            assert!(Address::parse(a).is_err(), "{a:?}");
        }
    }

    #[test]
    fn display_round_trips() {
        let p = EntityPath::subscription("t", "s").dead_letter_queue();
        assert_eq!(p.to_string(), "t/Subscriptions/s/$DeadLetterQueue");
        assert_eq!(entity(&p.to_string()), p);
    }
}

//! A subscription's rules through its entity handle: enumerate, add, remove.

use std::sync::Arc;
use std::time::SystemTime;

use crate::address::{Address, EntityPath};
use crate::error::{Error, Result};
use crate::filter::Rule;

use crate::broker::namespace::Node;
use crate::broker::topic::Subscription;

use super::{Entity, Target};

/// The longest rule name Service Bus accepts (`Constants.ruleNameMaximumLength` in
/// `@azure/core-amqp`).
const MAX_RULE_NAME_LENGTH: usize = 50;

impl Entity {
    /// The subscription this handle addresses (not its dead-letter queue).
    fn subscription(&self, operation: &'static str) -> Result<Arc<Subscription>> {
        let not_a_subscription = || self.not_allowed(operation, "rules belong to subscriptions");
        let Target::Queue { queue, dlq: false } = &self.target else {
            return Err(not_a_subscription());
        };
        let Ok(Address::Entity(EntityPath {
            entity,
            subscription: Some(name),
            ..
        })) = Address::parse(&queue.path)
        else {
            return Err(not_a_subscription());
        };
        match self.ns.node(&entity)? {
            Node::Topic(topic) => topic.subscription(&name).ok_or_else(not_a_subscription),
            Node::Queue(_) => Err(not_a_subscription()),
        }
    }

    /// `com.microsoft:enumerate-rules`: the subscription's rules in creation order, each with
    /// its creation time.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] unless this is a subscription.
    pub fn rules(&self) -> Result<Vec<(Rule, SystemTime)>> {
        Ok(self.subscription("enumerate-rules")?.rules().clone())
    }

    /// `com.microsoft:add-rule`: adds a rule to the subscription; messages sent from now on
    /// are matched against it.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] when a rule of that name (case-insensitive) exists;
    /// [`Error::InvalidRule`] for an empty name or one longer than 50 characters (the
    /// service's limit); [`Error::NotAllowed`] unless this is a subscription.
    pub fn add_rule(&self, rule: Rule) -> Result<()> {
        let subscription = self.subscription("add-rule")?;
        let length = rule.name.chars().count();
        if length == 0 || length > MAX_RULE_NAME_LENGTH {
            return Err(Error::InvalidRule {
                reason: format!("a rule name has 1 to {MAX_RULE_NAME_LENGTH} characters"),
                rule: rule.name,
            });
        }
        let mut rules = subscription.rules();
        if rules
            .iter()
            .any(|(r, _)| r.name.eq_ignore_ascii_case(&rule.name))
        {
            return Err(Error::AlreadyExists {
                entity: format!("{}/Rules/{}", self.path, rule.name),
            });
        }
        rules.push((rule, self.ns.clock.now()));
        Ok(())
    }

    /// `com.microsoft:remove-rule`: removes the named rule (case-insensitive). A subscription
    /// left without rules receives nothing, as on Service Bus.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such rule; [`Error::NotAllowed`] unless this is a
    /// subscription.
    pub fn remove_rule(&self, name: &str) -> Result<()> {
        let subscription = self.subscription("remove-rule")?;
        let mut rules = subscription.rules();
        let before = rules.len();
        rules.retain(|(r, _)| !r.name.eq_ignore_ascii_case(name));
        if rules.len() == before {
            return Err(Error::NotFound {
                entity: format!("{}/Rules/{name}", self.path),
            });
        }
        Ok(())
    }
}

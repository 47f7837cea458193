//! Subscription rules: correlation filters, SQL filters and the `$Default` rule.

use crate::message::{BrokerMessage, Properties, PropertyValue};
use crate::sql_filter::{SqlFilter, SqlRuleAction};

/// A subscription filter.
#[derive(Debug, Clone)]
pub enum Filter {
    /// Matches every message (`1=1`, `TRUE`; the `$Default` rule).
    True,
    /// Matches no message (`1=0`, `FALSE`).
    False,
    /// A correlation filter: every field that is set must match.
    Correlation(CorrelationFilter),
    /// A SQL filter from the supported subset.
    Sql(SqlFilter),
}

impl Filter {
    /// Whether the message matches.
    pub fn matches(&self, message: &BrokerMessage) -> bool {
        match self {
            Filter::True => true,
            Filter::False => false,
            Filter::Correlation(c) => c.matches(message),
            Filter::Sql(s) => s.matches(message),
        }
    }
}

/// A correlation filter (Microsoft's `CorrelationFilter`). String fields compare exactly;
/// each entry of `properties` must be present with an equal value (numbers compare across
/// integer and floating-point types).
#[derive(Debug, Clone, Default)]
pub struct CorrelationFilter {
    /// `ContentType`.
    pub content_type: Option<String>,
    /// `CorrelationId`.
    pub correlation_id: Option<String>,
    /// `Label` (the message subject).
    pub label: Option<String>,
    /// `MessageId`.
    pub message_id: Option<String>,
    /// `ReplyTo`.
    pub reply_to: Option<String>,
    /// `ReplyToSessionId`.
    pub reply_to_session_id: Option<String>,
    /// `SessionId`.
    pub session_id: Option<String>,
    /// `To`.
    pub to: Option<String>,
    /// `Properties`: application properties that must match.
    pub properties: Properties,
}

impl CorrelationFilter {
    /// Whether every set field matches the message.
    pub fn matches(&self, m: &BrokerMessage) -> bool {
        let field = |want: &Option<String>, have: &Option<String>| match want {
            None => true,
            Some(w) => have.as_deref() == Some(w.as_str()),
        };
        field(&self.content_type, &m.content_type)
            && field(&self.correlation_id, &m.correlation_id)
            && field(&self.label, &m.subject)
            && field(&self.message_id, &m.message_id)
            && field(&self.reply_to, &m.reply_to)
            && field(&self.reply_to_session_id, &m.reply_to_session_id)
            && field(&self.session_id, &m.session_id)
            && field(&self.to, &m.to)
            && self.properties.iter().all(|(name, want)| {
                m.application_properties
                    .get(name)
                    .is_some_and(|have| values_equal(want, have))
            })
    }
}

fn values_equal(a: &PropertyValue, b: &PropertyValue) -> bool {
    match (a, b) {
        (PropertyValue::Long(x), PropertyValue::Double(y))
        | (PropertyValue::Double(y), PropertyValue::Long(x)) => (*x as f64) == *y,
        _ => a == b,
    }
}

/// A named subscription rule: a filter and an optional action applied to the subscription's
/// copy of each message the filter selects.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The rule name (`$Default` for the implicit rule).
    pub name: String,
    /// The filter.
    pub filter: Filter,
    /// The rule action, if any.
    pub action: Option<SqlRuleAction>,
}

impl Rule {
    /// The `$Default` rule a subscription gets when it has no rules: `1=1`.
    pub fn default_rule() -> Rule {
        Rule {
            name: "$Default".to_owned(),
            filter: Filter::True,
            action: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg() -> BrokerMessage {
        let mut m = BrokerMessage::new("x")
            .with_property("region", "eu")
            .with_property("tier", 2);
        m.subject = Some("created".into());
        m.correlation_id = Some("c-1".into());
        m.content_type = Some("application/json".into());
        m
    }

    #[test]
    fn empty_correlation_filter_matches_everything() {
        assert!(CorrelationFilter::default().matches(&msg()));
    }

    #[test]
    fn every_set_field_must_match() {
        let mut f = CorrelationFilter {
            label: Some("created".into()),
            correlation_id: Some("c-1".into()),
            ..Default::default()
        };
        assert!(f.matches(&msg()));
        f.content_type = Some("text/plain".into());
        assert!(!f.matches(&msg()));
        let f = CorrelationFilter {
            to: Some("x".into()),
            ..Default::default()
        };
        assert!(!f.matches(&msg()), "an unset message field never matches");
        let f = CorrelationFilter {
            session_id: Some("s".into()),
            ..Default::default()
        };
        assert!(!f.matches(&msg()));
    }

    #[test]
    fn properties_must_be_present_and_equal() {
        let mut f = CorrelationFilter::default();
        f.properties.insert("region".into(), "eu".into());
        f.properties
            .insert("tier".into(), PropertyValue::Double(2.0));
        assert!(f.matches(&msg()));
        f.properties.insert("missing".into(), "x".into());
        assert!(!f.matches(&msg()));
        let mut f = CorrelationFilter::default();
        f.properties.insert("region".into(), "us".into());
        assert!(!f.matches(&msg()));
    }

    #[test]
    fn filter_variants() {
        assert!(Filter::True.matches(&msg()));
        assert!(!Filter::False.matches(&msg()));
        assert!(Rule::default_rule().filter.matches(&msg()));
        let sql = SqlFilter::parse("tier >= 2").unwrap();
        assert!(Filter::Sql(sql).matches(&msg()));
    }
}

//! The subscription rule operations of `<topic>/Subscriptions/<sub>/$management`, as the SDKs'
//! rule managers send them (`@azure/service-bus` 7.9 `src/core/managementClient.ts`
//! `addRule`/`removeRule`/`getRules`; .NET `ServiceBusRuleManager` over `AmqpRuleManager`;
//! Microsoft's "AMQP 1.0 in Azure Service Bus: request-response-based operations").
//!
//! - `com.microsoft:add-rule`: `{rule-name, rule-description: {sql-filter: {expression} |
//!   correlation-filter: {correlation-id, message-id, to, reply-to, label, session-id,
//!   reply-to-session-id, content-type, properties}, sql-rule-action?: {expression}}}`.
//! - `com.microsoft:remove-rule`: `{rule-name}`.
//! - `com.microsoft:enumerate-rules`: `{top, skip}` → `{rules: [{rule-description:
//!   described(0x137:0x4)[filter, action, name, created-at]}]}`, 204 when there are none.

use std::time::SystemTime;

use sb_amqp::codec::Value;
use sb_amqp::codec::described::Described;
use sb_amqp::codec::descriptor::Descriptor;
use sb_amqp::codec::primitives::{Array, OrderedMap};
use sb_amqp::servicebus::management::key::{SKIP, TOP};
use sb_amqp::servicebus::rule::{correlation, descriptor, key};

use crate::server::codec::{key_text, property_to_value, to_timestamp, value_property};
use crate::server::nodes::Reply;
use crate::server::nodes::body::{count, text};
use crate::{CorrelationFilter, Entity, Error, Filter, Rule, SqlFilter, SqlRuleAction};

fn entries(value: Option<&Value>) -> Vec<(&str, &Value)> {
    match value {
        Some(Value::Map(map)) => map
            .iter()
            .filter_map(|(k, v)| key_text(k).map(|k| (k, v)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The entry `name` of a map, absent when null.
fn get<'a>(value: Option<&'a Value>, name: &str) -> Option<&'a Value> {
    entries(value)
        .into_iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !matches!(v, Value::Null))
}

fn invalid(rule: &str, reason: impl Into<String>) -> Error {
    Error::InvalidRule {
        rule: rule.to_owned(),
        reason: reason.into(),
    }
}

/// The `rule-name` of an add-rule or remove-rule request.
pub(super) fn rule_name(body: Option<&Value>) -> Result<String, Error> {
    text(get(body, key::RULE_NAME)).ok_or_else(|| invalid("", "rule-name is missing"))
}

/// A rule from an add-rule request body.
pub(super) fn parse_rule(body: Option<&Value>) -> Result<Rule, Error> {
    let name = rule_name(body)?;
    let description = get(body, key::RULE_DESCRIPTION);
    let sql = get(description, key::SQL_FILTER);
    let correlation = get(description, key::CORRELATION_FILTER);
    let filter = match (sql, correlation) {
        (Some(sql), None) => {
            let expression = text(get(Some(sql), key::EXPRESSION))
                .ok_or_else(|| invalid(&name, "sql-filter needs an expression"))?;
            let parsed = SqlFilter::parse(&expression)
                .map_err(|e| invalid(&name, format!("SQL filter {expression:?}: {e}")))?;
            Filter::Sql(parsed)
        }
        (None, Some(correlation)) => Filter::Correlation(parse_correlation(correlation)),
        _ => {
            return Err(invalid(
                &name,
                "rule-description needs exactly one of sql-filter and correlation-filter",
            ));
        }
    };
    let action = match get(description, key::SQL_RULE_ACTION) {
        None => None,
        Some(action) => {
            let expression = text(get(Some(action), key::EXPRESSION))
                .ok_or_else(|| invalid(&name, "sql-rule-action needs an expression"))?;
            // The service refuses an action it cannot parse when the rule is added, as it does
            // a bad filter; one outside the emulator's subset is refused the same way.
            Some(
                SqlRuleAction::parse(&expression)
                    .map_err(|e| invalid(&name, format!("SQL rule action {expression:?}: {e}")))?,
            )
        }
    };
    Ok(Rule {
        name,
        filter,
        action,
    })
}

fn parse_correlation(correlation: &Value) -> CorrelationFilter {
    let field = |key| text(get(Some(correlation), key));
    let mut filter = CorrelationFilter {
        correlation_id: field(correlation::CORRELATION_ID),
        message_id: field(correlation::MESSAGE_ID),
        to: field(correlation::TO),
        reply_to: field(correlation::REPLY_TO),
        label: field(correlation::LABEL),
        session_id: field(correlation::SESSION_ID),
        reply_to_session_id: field(correlation::REPLY_TO_SESSION_ID),
        content_type: field(correlation::CONTENT_TYPE),
        ..CorrelationFilter::default()
    };
    for (key, value) in entries(get(Some(correlation), correlation::PROPERTIES)) {
        filter
            .properties
            .insert(key.to_owned(), value_property(value));
    }
    filter
}

/// The `skip` and `top` of an enumerate-rules request (from the first, all of them).
pub(super) fn page(body: Option<&Value>) -> (usize, usize) {
    let number = |key| count(get(body, key));
    (number(SKIP).unwrap_or(0), number(TOP).unwrap_or(usize::MAX))
}

/// The rules from `skip` on, at most `top`; `204 No Content` when there are none.
pub(super) fn enumerate(entity: &Entity, skip: usize, top: usize) -> Reply {
    let rules: Vec<Value> = match entity.rules() {
        Ok(rules) => rules
            .iter()
            .skip(skip)
            .take(top)
            .map(|(rule, created)| {
                let mut entry = OrderedMap::new();
                entry.insert(
                    Value::String(key::RULE_DESCRIPTION.into()),
                    description(rule, *created),
                );
                Value::Map(entry)
            })
            .collect(),
        Err(error) => return Reply::error(&error),
    };
    if rules.is_empty() {
        return Reply::no_content();
    }
    let mut body = OrderedMap::new();
    body.insert(Value::String(key::RULES.into()), Value::Array(Array(rules)));
    Reply::ok(Some(Value::Map(body)))
}

fn described(code: u64, fields: Vec<Value>) -> Value {
    Value::Described(Box::new(Described {
        descriptor: Descriptor::Code(code),
        value: Value::List(fields),
    }))
}

fn optional(value: Option<&String>) -> Value {
    value.map_or(Value::Null, |s| Value::String(s.clone()))
}

/// A rule as `rule-description`: `[filter, action, name, created-at]`.
fn description(rule: &Rule, created: SystemTime) -> Value {
    let filter = match &rule.filter {
        Filter::True => described(descriptor::TRUE_FILTER, vec![Value::String("1=1".into())]),
        Filter::False => described(descriptor::FALSE_FILTER, vec![Value::String("1=0".into())]),
        Filter::Sql(sql) => described(
            descriptor::SQL_FILTER,
            vec![Value::String(sql.expression().into())],
        ),
        Filter::Correlation(c) => correlation_description(c),
    };
    let action = match &rule.action {
        Some(action) => described(
            descriptor::SQL_RULE_ACTION,
            vec![Value::String(action.expression().into())],
        ),
        None => described(descriptor::EMPTY_RULE_ACTION, Vec::new()),
    };
    described(
        descriptor::RULE_DESCRIPTION,
        vec![
            filter,
            action,
            Value::String(rule.name.clone()),
            Value::Timestamp(to_timestamp(created)),
        ],
    )
}

/// A correlation filter as its described list (JS `getRules` reads it by index).
fn correlation_description(c: &CorrelationFilter) -> Value {
    let mut properties = OrderedMap::new();
    for (key, value) in &c.properties {
        properties.insert(Value::String(key.clone()), property_to_value(value));
    }
    let fields = [
        &c.correlation_id,
        &c.message_id,
        &c.to,
        &c.reply_to,
        &c.label,
        &c.session_id,
        &c.reply_to_session_id,
        &c.content_type,
    ];
    let mut list: Vec<Value> = fields.iter().map(|f| optional(f.as_ref())).collect();
    list.push(Value::Map(properties));
    described(descriptor::CORRELATION_FILTER, list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: Vec<(&str, Value)>) -> Value {
        let mut map = OrderedMap::new();
        for (k, v) in entries {
            map.insert(Value::String(k.into()), v);
        }
        Value::Map(map)
    }

    #[test]
    fn parses_sql_and_correlation_rules_as_the_js_sdk_sends_them() {
        let sql = map(vec![
            ("rule-name", Value::String("big".into())),
            (
                "rule-description",
                map(vec![
                    (
                        "sql-filter",
                        map(vec![("expression", Value::String("quantity > 10".into()))]),
                    ),
                    (
                        "sql-rule-action",
                        map(vec![("expression", Value::String("SET x = 1".into()))]),
                    ),
                ]),
            ),
        ]);
        let rule = parse_rule(Some(&sql)).unwrap();
        assert_eq!(rule.name, "big");
        assert!(matches!(&rule.filter, Filter::Sql(f) if f.expression() == "quantity > 10"));
        assert_eq!(
            rule.action.as_ref().map(SqlRuleAction::expression),
            Some("SET x = 1")
        );

        // JS writes every correlation key, unset ones as null.
        let mut fields: Vec<(&str, Value)> = [
            "correlation-id",
            "message-id",
            "to",
            "reply-to",
            "label",
            "session-id",
            "reply-to-session-id",
            "content-type",
        ]
        .into_iter()
        .map(|k| (k, Value::Null))
        .collect();
        fields[4].1 = Value::String("created".into());
        fields.push((
            "properties",
            map(vec![("region", Value::String("eu".into()))]),
        ));
        let corr = map(vec![
            ("rule-name", Value::String("c".into())),
            (
                "rule-description",
                map(vec![("correlation-filter", map(fields))]),
            ),
        ]);
        let rule = parse_rule(Some(&corr)).unwrap();
        let Filter::Correlation(c) = &rule.filter else {
            panic!("{rule:?}")
        };
        assert_eq!(c.label.as_deref(), Some("created"));
        assert_eq!(c.correlation_id, None);
        assert_eq!(c.properties.len(), 1);
        assert!(rule.action.is_none());
    }

    #[test]
    fn refuses_bad_rule_descriptions() {
        let bad_sql = map(vec![
            ("rule-name", Value::String("r".into())),
            (
                "rule-description",
                map(vec![(
                    "sql-filter",
                    map(vec![("expression", Value::String("a = ".into()))]),
                )]),
            ),
        ]);
        assert!(matches!(
            parse_rule(Some(&bad_sql)),
            Err(Error::InvalidRule { .. })
        ));
        let no_filter = map(vec![
            ("rule-name", Value::String("r".into())),
            ("rule-description", map(vec![])),
        ]);
        assert!(matches!(
            parse_rule(Some(&no_filter)),
            Err(Error::InvalidRule { .. })
        ));
        assert!(matches!(parse_rule(None), Err(Error::InvalidRule { .. })));
        let bad_action = map(vec![
            ("rule-name", Value::String("r".into())),
            (
                "rule-description",
                map(vec![
                    (
                        "sql-filter",
                        map(vec![("expression", Value::String("1=1".into()))]),
                    ),
                    (
                        "sql-rule-action",
                        map(vec![("expression", Value::String("SET a = 1 + 1".into()))]),
                    ),
                ]),
            ),
        ]);
        assert!(matches!(
            parse_rule(Some(&bad_action)),
            Err(Error::InvalidRule { reason, .. }) if reason.contains("SQL rule action")
        ));
    }

    #[test]
    fn describes_rules_with_the_sdk_descriptor_codes() {
        let Value::Described(d) = description(&Rule::default_rule(), SystemTime::UNIX_EPOCH) else {
            panic!()
        };
        assert_eq!(d.descriptor, Descriptor::Code(1_335_734_829_060));
        let Value::List(fields) = &d.value else {
            panic!()
        };
        assert_eq!(fields.len(), 4);
        assert!(
            matches!(&fields[0], Value::Described(f) if f.descriptor == Descriptor::Code(83_483_426_823))
        );
        assert!(
            matches!(&fields[1], Value::Described(a) if a.descriptor == Descriptor::Code(descriptor::EMPTY_RULE_ACTION))
        );
        assert_eq!(fields[2], Value::String("$Default".into()));
    }
}

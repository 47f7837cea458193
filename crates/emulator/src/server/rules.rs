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

use super::codec::{key_text, property_to_value, to_timestamp, value_property};
use crate::{CorrelationFilter, Entity, Error, Filter, Rule, SqlFilter};

/// Descriptor codes of the rule description types (`Constants.descriptorCodes` in
/// `@azure/core-amqp`; `AmqpRuleDescriptionCodec` and friends in .NET).
const RULE_DESCRIPTION: u64 = 0x0000_0137_0000_0004;
const SQL_RULE_ACTION: u64 = 0x0000_0137_0000_0006;
const EMPTY_RULE_ACTION: u64 = 0x0000_0137_0000_0005;
const SQL_FILTER: u64 = 0x0000_0013_7000_0006;
const TRUE_FILTER: u64 = 0x0000_0013_7000_0007;
const FALSE_FILTER: u64 = 0x0000_0013_7000_0008;
const CORRELATION_FILTER: u64 = 0x0000_0013_7000_0009;

fn entries(value: Option<&Value>) -> Vec<(&str, &Value)> {
    match value {
        Some(Value::Map(map)) => map
            .iter()
            .filter_map(|(k, v)| key_text(k).map(|k| (k, v)))
            .collect(),
        _ => Vec::new(),
    }
}

fn get<'a>(value: Option<&'a Value>, name: &str) -> Option<&'a Value> {
    entries(value)
        .into_iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !matches!(v, Value::Null))
}

fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Symbol(s) => Some(s.0.clone()),
        _ => None,
    }
}

fn invalid(rule: &str, reason: impl Into<String>) -> Error {
    Error::InvalidRule {
        rule: rule.to_owned(),
        reason: reason.into(),
    }
}

/// A rule from an add-rule request body.
fn parse_rule(body: Option<&Value>) -> Result<Rule, Error> {
    let name = text(get(body, "rule-name")).ok_or_else(|| invalid("", "rule-name is missing"))?;
    let description = get(body, "rule-description");
    let sql = get(description, "sql-filter");
    let correlation = get(description, "correlation-filter");
    let filter = match (sql, correlation) {
        (Some(sql), None) => {
            let expression = text(get(Some(sql), "expression"))
                .ok_or_else(|| invalid(&name, "sql-filter needs an expression"))?;
            let parsed = SqlFilter::parse(&expression)
                .map_err(|e| invalid(&name, format!("SQL filter {expression:?}: {e}")))?;
            Filter::Sql(parsed)
        }
        (None, Some(correlation)) => {
            let field = |key| text(get(Some(correlation), key));
            let mut filter = CorrelationFilter {
                correlation_id: field("correlation-id"),
                message_id: field("message-id"),
                to: field("to"),
                reply_to: field("reply-to"),
                label: field("label"),
                session_id: field("session-id"),
                reply_to_session_id: field("reply-to-session-id"),
                content_type: field("content-type"),
                ..CorrelationFilter::default()
            };
            for (key, value) in entries(get(Some(correlation), "properties")) {
                filter
                    .properties
                    .insert(key.to_owned(), value_property(value));
            }
            Filter::Correlation(filter)
        }
        _ => {
            return Err(invalid(
                &name,
                "rule-description needs exactly one of sql-filter and correlation-filter",
            ));
        }
    };
    let action = match get(description, "sql-rule-action") {
        None => None,
        Some(action) => Some(
            text(get(Some(action), "expression"))
                .ok_or_else(|| invalid(&name, "sql-rule-action needs an expression"))?,
        ),
    };
    if let Some(action) = &action {
        tracing::warn!(rule = %name, %action, "Rule actions are kept but not applied by this emulator.");
    }
    Ok(Rule {
        name,
        filter,
        action,
    })
}

pub(super) fn add(entity: &Entity, body: Option<&Value>) -> Result<Option<Value>, Error> {
    entity.add_rule(parse_rule(body)?).map(|()| None)
}

pub(super) fn remove(entity: &Entity, body: Option<&Value>) -> Result<Option<Value>, Error> {
    let name = text(get(body, "rule-name")).ok_or_else(|| invalid("", "rule-name is missing"))?;
    entity.remove_rule(&name).map(|()| None)
}

/// The rules from `skip` on, at most `top`; `None` when there are none (status 204).
pub(super) fn enumerate(entity: &Entity, body: Option<&Value>) -> Result<Option<Value>, Error> {
    let number = |key| match get(body, key) {
        Some(Value::Int(n)) => usize::try_from(*n).ok(),
        Some(Value::Long(n)) => usize::try_from(*n).ok(),
        Some(Value::Uint(n)) => usize::try_from(*n).ok(),
        _ => None,
    };
    let skip = number("skip").unwrap_or(0);
    let top = number("top").unwrap_or(usize::MAX);
    let rules: Vec<Value> = entity
        .rules()?
        .iter()
        .skip(skip)
        .take(top)
        .map(|(rule, created)| {
            let mut entry = OrderedMap::new();
            entry.insert(
                Value::String("rule-description".into()),
                description(rule, *created),
            );
            Value::Map(entry)
        })
        .collect();
    if rules.is_empty() {
        return Ok(None);
    }
    let mut body = OrderedMap::new();
    body.insert(Value::String("rules".into()), Value::Array(Array(rules)));
    Ok(Some(Value::Map(body)))
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
        Filter::True => described(TRUE_FILTER, vec![Value::String("1=1".into())]),
        Filter::False => described(FALSE_FILTER, vec![Value::String("1=0".into())]),
        Filter::Sql(sql) => described(SQL_FILTER, vec![Value::String(sql.expression().into())]),
        Filter::Correlation(c) => {
            let mut properties = OrderedMap::new();
            for (key, value) in &c.properties {
                properties.insert(Value::String(key.clone()), property_to_value(value));
            }
            // The order of the described list (JS `getRules` reads it by index).
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
            described(CORRELATION_FILTER, list)
        }
    };
    let action = match &rule.action {
        Some(expression) => described(SQL_RULE_ACTION, vec![Value::String(expression.clone())]),
        None => described(EMPTY_RULE_ACTION, Vec::new()),
    };
    described(
        RULE_DESCRIPTION,
        vec![
            filter,
            action,
            Value::String(rule.name.clone()),
            Value::Timestamp(to_timestamp(created)),
        ],
    )
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
        assert_eq!(rule.action.as_deref(), Some("SET x = 1"));

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
            matches!(&fields[1], Value::Described(a) if a.descriptor == Descriptor::Code(EMPTY_RULE_ACTION))
        );
        assert_eq!(fields[2], Value::String("$Default".into()));
    }
}

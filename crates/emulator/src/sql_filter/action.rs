//! A subscription rule's SQL action: `SET` and `REMOVE` statements applied to the copy of a
//! message the subscription receives.
//!
//! Grammar (Microsoft, "Subscription rule SQL action syntax",
//! <https://learn.microsoft.com/azure/service-bus-messaging/service-bus-messaging-sql-rule-action>):
//! ```text
//! statements := (statement [";"])+
//! statement  := "SET" property "=" operand | "REMOVE" property
//! ```
//! `property` and `operand` are the filter's (scope `sys.` or `user.`, `user` by default). The
//! service's arithmetic and functions (`+`, `newid()`, …) are outside the subset and refused,
//! so an action is either applied as the service would or refused when the rule is created.
//! `SET` targets the system properties a sender sets as text (`Label`/`Subject`,
//! `CorrelationId`, `To`, `ReplyTo`, `ReplyToSessionId`, `ContentType`, `SessionId`) or any
//! user property; `REMOVE` takes user properties only.

use super::ast::{Literal, Operand, SysProp};
use super::lex::{CmpOp, Tok, lex};
use super::parse::Parser;
use super::{SqlError, err};
use crate::message::{BrokerMessage, PropertyValue};

#[derive(Debug, Clone)]
enum Statement {
    Set(Target, Operand),
    Remove(String),
}

#[derive(Debug, Clone)]
enum Target {
    Sys(SysProp),
    User(String),
}

/// A parsed rule action (`SqlRuleAction`).
///
/// # Examples
/// ```
/// use sb_emulator::{BrokerMessage, SqlRuleAction};
///
/// let action = SqlRuleAction::parse("SET sys.Label = 'routed'; SET tier = 2; REMOVE secret")?;
/// let mut msg = BrokerMessage::new("x").with_property("secret", "s");
/// action.apply(&mut msg);
/// assert_eq!(msg.subject.as_deref(), Some("routed"));
/// assert!(msg.application_properties.contains_key("tier"));
/// assert!(!msg.application_properties.contains_key("secret"));
/// # Ok::<(), sb_emulator::SqlError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SqlRuleAction {
    text: String,
    statements: Vec<Statement>,
}

impl SqlRuleAction {
    /// Parses an action.
    ///
    /// # Errors
    /// [`SqlError`] for anything outside the supported subset, and for an empty action.
    pub fn parse(text: &str) -> Result<SqlRuleAction, SqlError> {
        let mut parser = Parser::new(lex(text)?);
        let mut statements = Vec::new();
        loop {
            while parser.peek().kind == Tok::Semicolon {
                parser.next();
            }
            let t = parser.next();
            let keyword = match &t.kind {
                Tok::Eof if !statements.is_empty() => break,
                Tok::Ident(word) => word.to_ascii_uppercase(),
                other => {
                    return err(
                        t.offset,
                        format!("expected SET or REMOVE, found {}", other.describe()),
                    );
                }
            };
            let offset = parser.peek().offset;
            let property = parser.operand()?;
            let statement = match keyword.as_str() {
                "SET" => {
                    let target = match property {
                        Operand::User(name) => Target::User(name),
                        Operand::Sys(SysProp::MessageId) => {
                            return err(offset, "sys.MessageId cannot be SET by an action");
                        }
                        Operand::Sys(p) => Target::Sys(p),
                        Operand::Literal(_) => return err(offset, "SET needs a property"),
                    };
                    parser.expect(Tok::Cmp(CmpOp::Eq), "'=' after the SET property")?;
                    Statement::Set(target, parser.operand()?)
                }
                "REMOVE" => match property {
                    Operand::User(name) => Statement::Remove(name),
                    _ => return err(offset, "REMOVE takes a user property"),
                },
                _ => return err(t.offset, format!("expected SET or REMOVE, found {keyword}")),
            };
            statements.push(statement);
        }
        Ok(SqlRuleAction {
            text: text.to_owned(),
            statements,
        })
    }

    /// The action as written.
    pub fn expression(&self) -> &str {
        &self.text
    }

    /// Applies the statements in order; each `SET` reads the message as the statements
    /// before it left it. A missing property reads as `NULL`; `NULL` clears a system property.
    pub fn apply(&self, msg: &mut BrokerMessage) {
        for statement in &self.statements {
            match statement {
                Statement::Remove(name) => {
                    msg.application_properties.remove(name);
                }
                Statement::Set(Target::User(name), source) => {
                    let value = read(msg, source);
                    msg.application_properties.insert(name.clone(), value);
                }
                Statement::Set(Target::Sys(prop), source) => {
                    let value = text_of(read(msg, source));
                    *sys_field(msg, *prop) = value;
                }
            }
        }
    }
}

/// The field of `msg` a settable system property names.
fn sys_field(msg: &mut BrokerMessage, prop: SysProp) -> &mut Option<String> {
    match prop {
        SysProp::Label => &mut msg.subject,
        SysProp::MessageId => &mut msg.message_id,
        SysProp::CorrelationId => &mut msg.correlation_id,
        SysProp::To => &mut msg.to,
        SysProp::ReplyTo => &mut msg.reply_to,
        SysProp::ReplyToSessionId => &mut msg.reply_to_session_id,
        SysProp::ContentType => &mut msg.content_type,
        SysProp::SessionId => &mut msg.session_id,
    }
}

fn read(msg: &mut BrokerMessage, source: &Operand) -> PropertyValue {
    match source {
        Operand::Literal(Literal::Null) => PropertyValue::Null,
        Operand::Literal(Literal::Bool(b)) => PropertyValue::Bool(*b),
        Operand::Literal(Literal::Int(n)) => PropertyValue::Long(*n),
        Operand::Literal(Literal::Float(f)) => PropertyValue::Double(*f),
        Operand::Literal(Literal::Str(s)) => PropertyValue::String(s.clone()),
        Operand::Sys(p) => sys_field(msg, *p)
            .clone()
            .map_or(PropertyValue::Null, PropertyValue::String),
        Operand::User(name) => msg
            .application_properties
            .get(name)
            .cloned()
            .unwrap_or(PropertyValue::Null),
    }
}

/// A value as a system property's text: numbers, booleans and uuids as text, `NULL` as unset.
fn text_of(value: PropertyValue) -> Option<String> {
    match value {
        PropertyValue::Null => None,
        PropertyValue::String(s) => Some(s),
        PropertyValue::Bool(b) => Some(b.to_string()),
        PropertyValue::Long(n) => Some(n.to_string()),
        PropertyValue::Double(f) => Some(f.to_string()),
        PropertyValue::Uuid(u) => Some(u.to_string()),
        // No documented text form; the property is left unset rather than given a made-up one.
        PropertyValue::Timestamp(_) | PropertyValue::Binary(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg() -> BrokerMessage {
        let mut m = BrokerMessage::new("body")
            .with_property("color", "red")
            .with_property("secret", "s");
        m.subject = Some("created".into());
        m
    }

    fn applied(text: &str) -> BrokerMessage {
        let mut m = msg();
        SqlRuleAction::parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .apply(&mut m);
        m
    }

    #[test]
    fn set_user_and_system_properties() {
        let m = applied(
            "SET sys.Label = 'routed'; SET user.tier = 2; SET ratio = -1.5; SET vip = TRUE \
             SET sys.CorrelationId = color; SET sys.To = sys.Label; SET [a b] = 'x'",
        );
        assert_eq!(m.subject.as_deref(), Some("routed"));
        assert_eq!(m.correlation_id.as_deref(), Some("red"));
        assert_eq!(m.to.as_deref(), Some("routed"), "reads the earlier SET");
        let p = &m.application_properties;
        assert_eq!(p.get("tier"), Some(&PropertyValue::Long(2)));
        assert_eq!(p.get("ratio"), Some(&PropertyValue::Double(-1.5)));
        assert_eq!(p.get("vip"), Some(&PropertyValue::Bool(true)));
        assert_eq!(p.get("a b"), Some(&PropertyValue::String("x".into())));
    }

    #[test]
    fn set_every_allowed_system_property() {
        let m = applied(
            "set sys.Subject = 's'; SET sys.ReplyTo = 'r'; SET sys.ReplyToSessionId = 'rs'; \
             SET sys.ContentType = 'text/plain'; SET sys.SessionId = 42",
        );
        assert_eq!(m.subject.as_deref(), Some("s"));
        assert_eq!(m.reply_to.as_deref(), Some("r"));
        assert_eq!(m.reply_to_session_id.as_deref(), Some("rs"));
        assert_eq!(m.content_type.as_deref(), Some("text/plain"));
        assert_eq!(m.session_id.as_deref(), Some("42"));
    }

    #[test]
    fn remove_and_null() {
        let m = applied("REMOVE secret; REMOVE missing; SET sys.Label = NULL; SET copy = missing");
        assert!(!m.application_properties.contains_key("secret"));
        assert_eq!(m.subject, None);
        assert_eq!(
            m.application_properties.get("copy"),
            Some(&PropertyValue::Null)
        );
        assert_eq!(
            m.application_properties.get("color"),
            Some(&PropertyValue::String("red".into()))
        );
    }

    #[test]
    fn refuses_outside_the_subset() {
        let cases = [
            ("", "expected SET or REMOVE"),
            (";", "expected SET or REMOVE"),
            ("UPDATE a = 1", "expected SET or REMOVE, found UPDATE"),
            ("SET a", "expected '='"),
            ("SET a = 1 + 2", "unexpected character '+'"),
            ("SET a = newid()", "expected SET or REMOVE"),
            ("SET sys.MessageId = 'x'", "sys.MessageId cannot be SET"),
            ("SET sys.Foo = 1", "unsupported system property"),
            ("SET 1 = 2", "SET needs a property"),
            ("REMOVE sys.Label", "REMOVE takes a user property"),
            ("SET a = 'x", "unterminated string"),
        ];
        for (text, expected) in cases {
            let e = SqlRuleAction::parse(text).expect_err(text);
            assert!(
                e.to_string().contains(expected),
                "{text:?}: {e} (wanted {expected:?})"
            );
        }
    }
}

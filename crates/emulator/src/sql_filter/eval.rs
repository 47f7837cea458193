//! Three-valued evaluation of a parsed expression against a message.

use std::cmp::Ordering;

use super::ast::{Expr, Literal, Operand, PatternItem, SysProp};
use super::lex::CmpOp;
use crate::message::{BrokerMessage, PropertyValue};

/// A runtime value; `None` stands for SQL `NULL`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value<'a> {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
    /// Types the subset cannot compare (uuid, timestamp, binary).
    Opaque,
}

impl Operand {
    pub(super) fn value<'a>(&'a self, m: &'a BrokerMessage) -> Option<Value<'a>> {
        match self {
            Operand::Literal(l) => literal_value(l),
            Operand::Sys(p) => {
                let field = match p {
                    SysProp::Label => &m.subject,
                    SysProp::MessageId => &m.message_id,
                    SysProp::CorrelationId => &m.correlation_id,
                    SysProp::To => &m.to,
                    SysProp::ReplyTo => &m.reply_to,
                    SysProp::ReplyToSessionId => &m.reply_to_session_id,
                    SysProp::ContentType => &m.content_type,
                    SysProp::SessionId => &m.session_id,
                };
                field.as_deref().map(Value::Str)
            }
            Operand::User(name) => match m.application_properties.get(name)? {
                PropertyValue::Null => None,
                PropertyValue::Bool(b) => Some(Value::Bool(*b)),
                PropertyValue::Long(n) => Some(Value::Int(*n)),
                PropertyValue::Double(f) => Some(Value::Float(*f)),
                PropertyValue::String(s) => Some(Value::Str(s)),
                PropertyValue::Uuid(_) | PropertyValue::Timestamp(_) | PropertyValue::Binary(_) => {
                    Some(Value::Opaque)
                }
            },
        }
    }
}

pub(super) fn literal_value(l: &Literal) -> Option<Value<'_>> {
    match l {
        Literal::Null => None,
        Literal::Bool(b) => Some(Value::Bool(*b)),
        Literal::Int(n) => Some(Value::Int(*n)),
        Literal::Float(f) => Some(Value::Float(*f)),
        Literal::Str(s) => Some(Value::Str(s)),
    }
}

/// Orders two values of comparable types; `None` when the types differ.
pub(super) fn compare(a: &Value<'_>, b: &Value<'_>) -> Option<Ordering> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Int(x), Value::Float(y)) => (*x as f64).partial_cmp(y),
        (Value::Float(x), Value::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Value::Float(x), Value::Float(y)) => x.partial_cmp(y),
        (Value::Str(x), Value::Str(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

pub(super) fn like(text: &[char], pattern: &[PatternItem]) -> bool {
    // Classic wildcard matching with backtracking on the last '%'.
    let (mut t, mut p) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(PatternItem::Any) => {
                star = Some((p, t));
                p += 1;
            }
            Some(PatternItem::One) => {
                t += 1;
                p += 1;
            }
            Some(PatternItem::Char(c)) if text.get(t) == Some(c) => {
                t += 1;
                p += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern
        .get(p..)
        .is_none_or(|rest| rest.iter().all(|i| *i == PatternItem::Any))
}

impl Expr {
    pub(super) fn eval(&self, m: &BrokerMessage) -> Option<bool> {
        match self {
            Expr::Const(b) => Some(*b),
            Expr::And(a, b) => match (a.eval(m), b.eval(m)) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            },
            Expr::Or(a, b) => match (a.eval(m), b.eval(m)) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            },
            Expr::Not(a) => a.eval(m).map(|b| !b),
            Expr::Cmp(l, op, r) => {
                let (l, r) = (l.value(m)?, r.value(m)?);
                let ord = compare(&l, &r)?;
                let bools = matches!(l, Value::Bool(_));
                Some(match op {
                    CmpOp::Eq => ord == Ordering::Equal,
                    CmpOp::Ne => ord != Ordering::Equal,
                    // Booleans only compare for (in)equality.
                    _ if bools => return None,
                    CmpOp::Lt => ord == Ordering::Less,
                    CmpOp::Gt => ord == Ordering::Greater,
                    CmpOp::Le => ord != Ordering::Greater,
                    CmpOp::Ge => ord != Ordering::Less,
                })
            }
            Expr::IsNull(o, negated) => Some(o.value(m).is_none() != *negated),
            Expr::In(o, items, negated) => {
                let v = o.value(m)?;
                let mut unknown = false;
                for item in items {
                    match literal_value(item).and_then(|i| compare(&v, &i)) {
                        Some(Ordering::Equal) => return Some(!negated),
                        Some(_) => {}
                        None => unknown = true,
                    }
                }
                if unknown { None } else { Some(*negated) }
            }
            Expr::Like(o, pattern, negated) => match o.value(m)? {
                Value::Str(s) => {
                    let chars: Vec<char> = s.chars().collect();
                    Some(like(&chars, pattern) != *negated)
                }
                _ => None,
            },
        }
    }
}

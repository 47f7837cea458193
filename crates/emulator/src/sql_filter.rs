//! A documented subset of Service Bus SQL filter expressions.
//!
//! # Grammar
//! ```text
//! expr      := or
//! or        := and ("OR" and)*
//! and       := unary ("AND" unary)*
//! unary     := "NOT" unary | primary
//! primary   := "(" expr ")" | "TRUE" | "FALSE" | operand tail
//! tail      := cmp operand | "IS" ["NOT"] "NULL"
//!            | ["NOT"] "IN" "(" literal ("," literal)* ")"
//!            | ["NOT"] "LIKE" string ["ESCAPE" string]
//! cmp       := "=" | "<>" | "!=" | "<" | ">" | "<=" | ">="
//! operand   := identifier | literal
//! literal   := 'string' | ["-"] number | "TRUE" | "FALSE" | "NULL"
//! identifier:= name | sys.<Label|Subject|MessageId|CorrelationId|To|ReplyTo|ReplyToSessionId|
//!              ContentType|SessionId> | user.name | [any text]
//! ```
//! Keywords and `sys.` names are case-insensitive; application property names are exact.
//! Evaluation is three-valued: a missing property is `NULL`, comparisons with `NULL` or between
//! mismatched types are unknown, and a filter matches only when the result is true.

use std::cmp::Ordering;

use crate::message::{BrokerMessage, PropertyValue};

/// A SQL filter that failed to parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at offset {offset}")]
pub struct SqlError {
    /// Byte offset in the expression.
    pub offset: usize,
    /// What went wrong.
    pub message: String,
}

/// A parsed SQL filter expression.
///
/// # Examples
/// ```
/// use sb_emulator::{BrokerMessage, SqlFilter};
///
/// let filter = SqlFilter::parse("priority = 'High' AND sys.Label LIKE 'order-%'")?;
/// let mut msg = BrokerMessage::new("x").with_property("priority", "High");
/// msg.subject = Some("order-42".into());
/// assert!(filter.matches(&msg));
/// # Ok::<(), sb_emulator::SqlError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SqlFilter {
    text: String,
    expr: Expr,
}

impl SqlFilter {
    /// Parses an expression.
    ///
    /// # Errors
    /// [`SqlError`] for anything outside the supported subset.
    pub fn parse(text: &str) -> Result<SqlFilter, SqlError> {
        let tokens = lex(text)?;
        let mut parser = Parser { tokens, pos: 0 };
        let expr = parser.expr()?;
        let tok = parser.peek();
        if tok.kind != Tok::Eof {
            return Err(SqlError {
                offset: tok.offset,
                message: format!("unexpected {}", tok.kind.describe()),
            });
        }
        Ok(SqlFilter {
            text: text.to_owned(),
            expr,
        })
    }

    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.text
    }

    /// Whether the message matches (the expression evaluates to true).
    pub fn matches(&self, message: &BrokerMessage) -> bool {
        self.expr.eval(message) == Some(true)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Int(i64),
    Float(f64),
    LParen,
    RParen,
    Comma,
    Minus,
    Cmp(CmpOp),
    And,
    Or,
    Not,
    Is,
    Null,
    In,
    Like,
    Escape,
    True,
    False,
    Eof,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier {s:?}"),
            Tok::Str(s) => format!("string '{s}'"),
            Tok::Int(n) => format!("number {n}"),
            Tok::Float(n) => format!("number {n}"),
            Tok::Eof => "end of expression".to_owned(),
            other => format!("{other:?}").to_uppercase(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

#[derive(Debug, Clone)]
struct Token {
    kind: Tok,
    offset: usize,
}

fn err<T>(offset: usize, message: impl Into<String>) -> Result<T, SqlError> {
    Err(SqlError {
        offset,
        message: message.into(),
    })
}

fn lex(text: &str) -> Result<Vec<Token>, SqlError> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let kind = match c {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'(' => {
                i += 1;
                Tok::LParen
            }
            b')' => {
                i += 1;
                Tok::RParen
            }
            b',' => {
                i += 1;
                Tok::Comma
            }
            b'-' => {
                i += 1;
                Tok::Minus
            }
            b'=' => {
                i += 1;
                Tok::Cmp(CmpOp::Eq)
            }
            b'!' if bytes.get(i + 1) == Some(&b'=') => {
                i += 2;
                Tok::Cmp(CmpOp::Ne)
            }
            b'<' => match bytes.get(i + 1) {
                Some(b'>') => {
                    i += 2;
                    Tok::Cmp(CmpOp::Ne)
                }
                Some(b'=') => {
                    i += 2;
                    Tok::Cmp(CmpOp::Le)
                }
                _ => {
                    i += 1;
                    Tok::Cmp(CmpOp::Lt)
                }
            },
            b'>' => {
                if bytes.get(i + 1) == Some(&b'=') {
                    i += 2;
                    Tok::Cmp(CmpOp::Ge)
                } else {
                    i += 1;
                    Tok::Cmp(CmpOp::Gt)
                }
            }
            b'\'' => {
                // '' inside a string is an escaped quote.
                let mut value = String::new();
                i += 1;
                loop {
                    let Some(rel) = text[i..].find('\'') else {
                        return err(start, "unterminated string");
                    };
                    value.push_str(&text[i..i + rel]);
                    i += rel + 1;
                    if bytes.get(i) == Some(&b'\'') {
                        value.push('\'');
                        i += 1;
                    } else {
                        break;
                    }
                }
                Tok::Str(value)
            }
            b'[' => {
                let Some(rel) = text[i + 1..].find(']') else {
                    return err(start, "unterminated [identifier]");
                };
                let name = text[i + 1..i + 1 + rel].to_owned();
                i += rel + 2;
                Tok::Ident(name)
            }
            b'0'..=b'9' | b'.' => {
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                let mut float = false;
                if i < bytes.len() && bytes[i] == b'.' {
                    float = true;
                    i += 1;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
                    float = true;
                    i += 1;
                    if i < bytes.len() && (bytes[i] == b'+' || bytes[i] == b'-') {
                        i += 1;
                    }
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                let lit = &text[start..i];
                if float {
                    match lit.parse::<f64>() {
                        Ok(v) => Tok::Float(v),
                        Err(_) => return err(start, format!("invalid number {lit:?}")),
                    }
                } else {
                    match lit.parse::<i64>() {
                        Ok(v) => Tok::Int(v),
                        Err(_) => return err(start, format!("invalid number {lit:?}")),
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'.')
                {
                    i += 1;
                }
                let word = &text[start..i];
                match word.to_ascii_uppercase().as_str() {
                    "AND" => Tok::And,
                    "OR" => Tok::Or,
                    "NOT" => Tok::Not,
                    "IS" => Tok::Is,
                    "NULL" => Tok::Null,
                    "IN" => Tok::In,
                    "LIKE" => Tok::Like,
                    "ESCAPE" => Tok::Escape,
                    "TRUE" => Tok::True,
                    "FALSE" => Tok::False,
                    _ => Tok::Ident(word.to_owned()),
                }
            }
            _ => {
                let ch = text[i..].chars().next().unwrap_or('?');
                return err(start, format!("unexpected character {ch:?}"));
            }
        };
        tokens.push(Token {
            kind,
            offset: start,
        });
    }
    tokens.push(Token {
        kind: Tok::Eof,
        offset: text.len(),
    });
    Ok(tokens)
}

#[derive(Debug, Clone)]
enum Literal {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SysProp {
    Label,
    MessageId,
    CorrelationId,
    To,
    ReplyTo,
    ReplyToSessionId,
    ContentType,
    SessionId,
}

#[derive(Debug, Clone)]
enum Operand {
    Literal(Literal),
    Sys(SysProp),
    User(String),
}

#[derive(Debug, Clone)]
enum Expr {
    Const(bool),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Cmp(Operand, CmpOp, Operand),
    IsNull(Operand, bool),
    In(Operand, Vec<Literal>, bool),
    Like(Operand, Vec<PatternItem>, bool),
}

#[derive(Debug, Clone, PartialEq)]
enum PatternItem {
    Any,
    One,
    Char(char),
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        // The lexer always ends with Eof and the parser never moves past it.
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn peek_at(&self, n: usize) -> &Tok {
        &self.tokens[(self.pos + n).min(self.tokens.len() - 1)].kind
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if t.kind != Tok::Eof {
            self.pos += 1;
        }
        t
    }

    fn expect(&mut self, kind: Tok, what: &str) -> Result<(), SqlError> {
        let t = self.next();
        if t.kind == kind {
            Ok(())
        } else {
            err(
                t.offset,
                format!("expected {what}, found {}", t.kind.describe()),
            )
        }
    }

    fn expr(&mut self) -> Result<Expr, SqlError> {
        let mut left = self.and()?;
        while self.peek().kind == Tok::Or {
            self.next();
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, SqlError> {
        let mut left = self.unary()?;
        while self.peek().kind == Tok::And {
            self.next();
            let right = self.unary()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, SqlError> {
        if self.peek().kind == Tok::Not {
            self.next();
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, SqlError> {
        match self.peek().kind {
            Tok::LParen => {
                self.next();
                let e = self.expr()?;
                self.expect(Tok::RParen, "')'")?;
                return Ok(e);
            }
            Tok::True | Tok::False if !self.starts_tail(1) => {
                let t = self.next();
                return Ok(Expr::Const(t.kind == Tok::True));
            }
            _ => {}
        }
        let left = self.operand()?;
        let t = self.next();
        match t.kind {
            Tok::Cmp(op) => Ok(Expr::Cmp(left, op, self.operand()?)),
            Tok::Is => {
                let negated = self.peek().kind == Tok::Not;
                if negated {
                    self.next();
                }
                self.expect(Tok::Null, "NULL")?;
                Ok(Expr::IsNull(left, negated))
            }
            Tok::Not => {
                let t = self.next();
                match t.kind {
                    Tok::In => self.in_list(left, true),
                    Tok::Like => self.like(left, true),
                    other => err(
                        t.offset,
                        format!("expected IN or LIKE after NOT, found {}", other.describe()),
                    ),
                }
            }
            Tok::In => self.in_list(left, false),
            Tok::Like => self.like(left, false),
            other => err(
                t.offset,
                format!(
                    "expected a comparison, IS, IN or LIKE, found {}",
                    other.describe()
                ),
            ),
        }
    }

    fn starts_tail(&self, n: usize) -> bool {
        matches!(self.peek_at(n), Tok::Cmp(_) | Tok::Is | Tok::In | Tok::Like)
            || (self.peek_at(n) == &Tok::Not && matches!(self.peek_at(n + 1), Tok::In | Tok::Like))
    }

    fn in_list(&mut self, left: Operand, negated: bool) -> Result<Expr, SqlError> {
        self.expect(Tok::LParen, "'(' after IN")?;
        let mut items = vec![self.literal()?];
        while self.peek().kind == Tok::Comma {
            self.next();
            items.push(self.literal()?);
        }
        self.expect(Tok::RParen, "')'")?;
        Ok(Expr::In(left, items, negated))
    }

    fn like(&mut self, left: Operand, negated: bool) -> Result<Expr, SqlError> {
        let t = self.next();
        let Tok::Str(pattern) = t.kind else {
            return err(t.offset, "LIKE needs a string pattern");
        };
        let mut escape = None;
        if self.peek().kind == Tok::Escape {
            self.next();
            let t = self.next();
            match t.kind {
                Tok::Str(s) if s.chars().count() == 1 => escape = s.chars().next(),
                _ => return err(t.offset, "ESCAPE needs a one-character string"),
            }
        }
        let mut items = Vec::new();
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            if Some(c) == escape {
                match chars.next() {
                    Some(n) => items.push(PatternItem::Char(n)),
                    None => return err(t.offset, "pattern ends with the escape character"),
                }
            } else if c == '%' {
                items.push(PatternItem::Any);
            } else if c == '_' {
                items.push(PatternItem::One);
            } else {
                items.push(PatternItem::Char(c));
            }
        }
        Ok(Expr::Like(left, items, negated))
    }

    fn literal(&mut self) -> Result<Literal, SqlError> {
        let t = self.next();
        Ok(match t.kind {
            Tok::Str(s) => Literal::Str(s),
            Tok::Int(n) => Literal::Int(n),
            Tok::Float(f) => Literal::Float(f),
            Tok::True => Literal::Bool(true),
            Tok::False => Literal::Bool(false),
            Tok::Null => Literal::Null,
            Tok::Minus => {
                let n = self.next();
                match n.kind {
                    Tok::Int(v) => Literal::Int(-v),
                    Tok::Float(v) => Literal::Float(-v),
                    other => {
                        return err(
                            n.offset,
                            format!("expected a number after '-', found {}", other.describe()),
                        );
                    }
                }
            }
            other => {
                return err(
                    t.offset,
                    format!("expected a literal, found {}", other.describe()),
                );
            }
        })
    }

    fn operand(&mut self) -> Result<Operand, SqlError> {
        if let Tok::Ident(name) = &self.peek().kind {
            let name = name.clone();
            let offset = self.peek().offset;
            self.next();
            return identifier(&name, offset);
        }
        Ok(Operand::Literal(self.literal()?))
    }
}

fn identifier(name: &str, offset: usize) -> Result<Operand, SqlError> {
    if let Some((scope, rest)) = name.split_once('.') {
        if scope.eq_ignore_ascii_case("sys") {
            let prop = match rest.to_ascii_lowercase().as_str() {
                "label" | "subject" => SysProp::Label,
                "messageid" => SysProp::MessageId,
                "correlationid" => SysProp::CorrelationId,
                "to" => SysProp::To,
                "replyto" => SysProp::ReplyTo,
                "replytosessionid" => SysProp::ReplyToSessionId,
                "contenttype" => SysProp::ContentType,
                "sessionid" => SysProp::SessionId,
                _ => return err(offset, format!("unsupported system property {name:?}")),
            };
            return Ok(Operand::Sys(prop));
        }
        if scope.eq_ignore_ascii_case("user") {
            return Ok(Operand::User(rest.to_owned()));
        }
    }
    Ok(Operand::User(name.to_owned()))
}

/// A runtime value; `None` stands for SQL `NULL`.
#[derive(Debug, Clone, PartialEq)]
enum Value<'a> {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
    /// Types the subset cannot compare (uuid, timestamp, binary).
    Opaque,
}

impl Operand {
    fn value<'a>(&'a self, m: &'a BrokerMessage) -> Option<Value<'a>> {
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

fn literal_value(l: &Literal) -> Option<Value<'_>> {
    match l {
        Literal::Null => None,
        Literal::Bool(b) => Some(Value::Bool(*b)),
        Literal::Int(n) => Some(Value::Int(*n)),
        Literal::Float(f) => Some(Value::Float(*f)),
        Literal::Str(s) => Some(Value::Str(s)),
    }
}

/// Orders two values of comparable types; `None` when the types differ.
fn compare(a: &Value<'_>, b: &Value<'_>) -> Option<Ordering> {
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

fn like(text: &[char], pattern: &[PatternItem]) -> bool {
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
    fn eval(&self, m: &BrokerMessage) -> Option<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn msg() -> BrokerMessage {
        let mut m = BrokerMessage::new("body")
            .with_property("color", "red")
            .with_property("quantity", 10)
            .with_property("price", 2.5)
            .with_property("vip", true)
            .with_property("note", PropertyValue::Null);
        m.subject = Some("order-42".into());
        m.message_id = Some("m1".into());
        m.correlation_id = Some("c1".into());
        m.content_type = Some("application/json".into());
        m.to = Some("shipping".into());
        m
    }

    fn eval(text: &str) -> bool {
        SqlFilter::parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .matches(&msg())
    }

    #[test]
    fn constants_and_trivial_filters() {
        assert!(eval("1=1"));
        assert!(!eval("1=0"));
        assert!(eval("TRUE"));
        assert!(!eval("FALSE"));
        assert!(eval("true OR false"));
        assert!(eval("NOT (1 = 0)"));
    }

    #[test]
    fn comparisons() {
        let yes = [
            "color = 'red'",
            "color <> 'blue'",
            "color != 'blue'",
            "quantity > 5",
            "quantity >= 10",
            "quantity < 10.5",
            "quantity <= 10",
            "price = 2.5",
            "price > 2",
            "vip = TRUE",
            "quantity = 10 AND color = 'red'",
            "quantity = 1 OR color = 'red'",
            "NOT color = 'blue'",
            "(color = 'blue' OR color = 'red') AND quantity > -1",
            "user.color = 'red'",
            "[color] = 'red'",
        ];
        for text in yes {
            assert!(eval(text), "{text}");
        }
        let no = [
            "color = 'Red'",
            "quantity > 10",
            "vip = FALSE",
            "color = 10",
            "missing = 'x'",
            "missing <> 'x'",
            "NOT missing = 'x'",
            "vip > FALSE",
        ];
        for text in no {
            assert!(!eval(text), "{text}");
        }
    }

    #[test]
    fn system_properties() {
        assert!(eval("sys.Label = 'order-42'"));
        assert!(eval("sys.label = 'order-42'"));
        assert!(eval("sys.Subject = 'order-42'"));
        assert!(eval("sys.MessageId = 'm1'"));
        assert!(eval("sys.CorrelationId = 'c1'"));
        assert!(eval("sys.ContentType = 'application/json'"));
        assert!(eval("sys.To = 'shipping'"));
        assert!(eval("sys.ReplyTo IS NULL"));
        assert!(eval("sys.SessionId IS NULL"));
    }

    #[test]
    fn null_in_and_like() {
        assert!(eval("missing IS NULL"));
        assert!(eval("note IS NULL"));
        assert!(eval("color IS NOT NULL"));
        assert!(eval("color IN ('blue', 'red')"));
        assert!(eval("quantity IN (1, 10)"));
        assert!(eval("color NOT IN ('blue', 'green')"));
        assert!(!eval("missing IN ('x')"));
        assert!(!eval("missing NOT IN ('x')"));
        assert!(eval("sys.Label LIKE 'order-%'"));
        assert!(eval("sys.Label LIKE 'order-__'"));
        assert!(!eval("sys.Label LIKE 'order-_'"));
        assert!(eval("sys.Label LIKE '%42'"));
        assert!(eval("sys.Label LIKE '%r%4%'"));
        assert!(eval("sys.Label NOT LIKE 'x%'"));
        assert!(eval("'50%' LIKE '50!%' ESCAPE '!'"));
        assert!(!eval("'500' LIKE '50!%' ESCAPE '!'"));
        assert!(eval("'it''s' = 'it''s'"));
    }

    #[test]
    fn three_valued_logic() {
        // Unknown OR true is true; unknown AND false is false; NOT unknown is unknown.
        assert!(eval("missing = 1 OR 1 = 1"));
        assert!(!eval("missing = 1 AND 1 = 1"));
        assert!(!eval("NOT (missing = 1)"));
        assert!(eval("NOT (missing = 1 AND 1 = 0)"));
    }

    #[test]
    fn rejects_outside_the_subset() {
        let cases = [
            ("", "expected a literal"),
            ("color", "expected a comparison"),
            ("color = ", "expected a literal"),
            ("color = 'red", "unterminated string"),
            ("sys.Foo = 1", "unsupported system property"),
            ("a = 1 +", "unexpected character '+'"),
            ("EXISTS(a)", "expected a comparison"),
            ("a IN ()", "expected a literal"),
            ("a LIKE 5", "LIKE needs a string pattern"),
            ("(a = 1", "expected ')'"),
            ("a = 1 b = 2", "unexpected identifier"),
            ("a IS 1", "expected NULL"),
            ("SET a = 1", "expected a comparison"),
        ];
        for (text, expected) in cases {
            let e = SqlFilter::parse(text).expect_err(text);
            assert!(
                e.to_string().contains(expected),
                "{text:?}: {e} (wanted {expected:?})"
            );
        }
        let e = SqlFilter::parse("a = 1 AND b ~ 2").unwrap_err();
        assert_eq!(e.offset, 12);
    }
}

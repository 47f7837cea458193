//! The recursive-descent parser over the tokens (the grammar in the module doc).

use super::ast::{Expr, Literal, Operand, PatternItem, SysProp};
use super::lex::{Tok, Token};
use super::{SqlError, err};

pub(super) struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    /// A parser at the first of `tokens` (which end with [`Tok::Eof`]).
    pub(super) fn new(tokens: Vec<Token>) -> Self {
        Parser { tokens, pos: 0 }
    }

    pub(super) fn peek(&self) -> &Token {
        // The lexer always ends with Eof and the parser never moves past it.
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn peek_at(&self, n: usize) -> &Tok {
        &self.tokens[(self.pos + n).min(self.tokens.len() - 1)].kind
    }

    pub(super) fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if t.kind != Tok::Eof {
            self.pos += 1;
        }
        t
    }

    pub(super) fn expect(&mut self, kind: Tok, what: &str) -> Result<(), SqlError> {
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

    pub(super) fn expr(&mut self) -> Result<Expr, SqlError> {
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

    pub(super) fn operand(&mut self) -> Result<Operand, SqlError> {
        if let Tok::Ident(name) = &self.peek().kind {
            let name = name.clone();
            let offset = self.peek().offset;
            self.next();
            return identifier(&name, offset);
        }
        Ok(Operand::Literal(self.literal()?))
    }
}

pub(super) fn identifier(name: &str, offset: usize) -> Result<Operand, SqlError> {
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

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
//!
//! # Layout
//! - this file: [`SqlFilter`] and [`SqlError`].
//! - `lex`: the text into tokens.
//! - `ast`: the parsed expression.
//! - `parse`: the tokens into an expression.
//! - `eval`: the expression against a message.
//! - `action`: [`SqlRuleAction`], a rule action's `SET`/`REMOVE` statements over the same
//!   operands.

mod action;
mod ast;
mod eval;
mod lex;
mod parse;

use crate::message::BrokerMessage;
pub use action::SqlRuleAction;
use ast::Expr;
use lex::{Tok, lex};
use parse::Parser;

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
        let mut parser = Parser::new(tokens);
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

fn err<T>(offset: usize, message: impl Into<String>) -> Result<T, SqlError> {
    Err(SqlError {
        offset,
        message: message.into(),
    })
}

#[cfg(test)]
mod tests;

//! The parsed expression: literals, operands, comparisons and patterns.

use super::lex::CmpOp;

#[derive(Debug, Clone)]
pub(super) enum Literal {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SysProp {
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
pub(super) enum Operand {
    Literal(Literal),
    Sys(SysProp),
    User(String),
}

#[derive(Debug, Clone)]
pub(super) enum Expr {
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
pub(super) enum PatternItem {
    Any,
    One,
    Char(char),
}

//! The lexer: an expression's text into tokens with their byte offsets.

use super::{SqlError, err};

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    Str(String),
    Int(i64),
    Float(f64),
    LParen,
    RParen,
    Comma,
    Semicolon,
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
    pub(super) fn describe(&self) -> String {
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
pub(super) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

#[derive(Debug, Clone)]
pub(super) struct Token {
    pub(super) kind: Tok,
    pub(super) offset: usize,
}

/// Lexes `text` into tokens ending with [`Tok::Eof`].
pub(super) fn lex(text: &str) -> Result<Vec<Token>, SqlError> {
    let mut lexer = Lexer {
        text,
        bytes: text.as_bytes(),
        i: 0,
    };
    let mut tokens = Vec::new();
    while let Some(&c) = lexer.bytes.get(lexer.i) {
        if matches!(c, b' ' | b'\t' | b'\r' | b'\n') {
            lexer.i += 1;
            continue;
        }
        let start = lexer.i;
        let kind = lexer.token(c)?;
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

/// The lexer's position in the expression.
struct Lexer<'t> {
    text: &'t str,
    bytes: &'t [u8],
    i: usize,
}

impl Lexer<'_> {
    /// The token starting with `c` at the current position.
    fn token(&mut self, c: u8) -> Result<Tok, SqlError> {
        match c {
            b'\'' => self.string(),
            b'[' => self.bracketed(),
            b'0'..=b'9' | b'.' => self.number(),
            c if c.is_ascii_alphabetic() || c == b'_' => Ok(self.word()),
            c => match self.operator(c) {
                Some(tok) => Ok(tok),
                None => {
                    let ch = self.text[self.i..].chars().next().unwrap_or('?');
                    err(self.i, format!("unexpected character {ch:?}"))
                }
            },
        }
    }

    /// Punctuation and comparison operators; `None` for anything else.
    fn operator(&mut self, c: u8) -> Option<Tok> {
        let next = self.bytes.get(self.i + 1).copied();
        let (tok, len) = match (c, next) {
            (b'(', _) => (Tok::LParen, 1),
            (b')', _) => (Tok::RParen, 1),
            (b',', _) => (Tok::Comma, 1),
            (b';', _) => (Tok::Semicolon, 1),
            (b'-', _) => (Tok::Minus, 1),
            (b'=', _) => (Tok::Cmp(CmpOp::Eq), 1),
            (b'!', Some(b'=')) | (b'<', Some(b'>')) => (Tok::Cmp(CmpOp::Ne), 2),
            (b'<', Some(b'=')) => (Tok::Cmp(CmpOp::Le), 2),
            (b'<', _) => (Tok::Cmp(CmpOp::Lt), 1),
            (b'>', Some(b'=')) => (Tok::Cmp(CmpOp::Ge), 2),
            (b'>', _) => (Tok::Cmp(CmpOp::Gt), 1),
            _ => return None,
        };
        self.i += len;
        Some(tok)
    }

    /// A quoted string; `''` inside it is an escaped quote.
    fn string(&mut self) -> Result<Tok, SqlError> {
        let start = self.i;
        let mut value = String::new();
        self.i += 1;
        loop {
            let Some(rel) = self.text[self.i..].find('\'') else {
                return err(start, "unterminated string");
            };
            value.push_str(&self.text[self.i..self.i + rel]);
            self.i += rel + 1;
            if self.bytes.get(self.i) == Some(&b'\'') {
                value.push('\'');
                self.i += 1;
            } else {
                return Ok(Tok::Str(value));
            }
        }
    }

    /// An identifier in brackets, `[any text]`.
    fn bracketed(&mut self) -> Result<Tok, SqlError> {
        let Some(rel) = self.text[self.i + 1..].find(']') else {
            return err(self.i, "unterminated [identifier]");
        };
        let name = self.text[self.i + 1..self.i + 1 + rel].to_owned();
        self.i += rel + 2;
        Ok(Tok::Ident(name))
    }

    fn skip_digits(&mut self) {
        while self.bytes.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
    }

    /// An integer, or a float with a fraction or an exponent.
    fn number(&mut self) -> Result<Tok, SqlError> {
        let start = self.i;
        self.skip_digits();
        let mut float = false;
        if self.bytes.get(self.i) == Some(&b'.') {
            float = true;
            self.i += 1;
            self.skip_digits();
        }
        if matches!(self.bytes.get(self.i), Some(b'e' | b'E')) {
            float = true;
            self.i += 1;
            if matches!(self.bytes.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.skip_digits();
        }
        let lit = &self.text[start..self.i];
        let parsed = if float {
            lit.parse::<f64>().ok().map(Tok::Float)
        } else {
            lit.parse::<i64>().ok().map(Tok::Int)
        };
        parsed.map_or_else(|| err(start, format!("invalid number {lit:?}")), Ok)
    }

    /// A keyword (case-insensitive) or a plain identifier (`name`, `sys.Label`, `user.name`).
    fn word(&mut self) -> Tok {
        let start = self.i;
        while self
            .bytes
            .get(self.i)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
        {
            self.i += 1;
        }
        let word = &self.text[start..self.i];
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
}

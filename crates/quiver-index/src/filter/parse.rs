//! The string form of a filter: a lexer (text into tokens) and a recursive
//! descent parser (`or` of `and`s of unary conditions) with bounded nesting.

use super::ast::{CompareOp, Filter, Literal};
use super::{MAX_FILTER_DEPTH, invalid};
use crate::error::IndexResult;

impl Filter {
    /// Parses the string form, e.g. `lang = "en" and (year >= 2020 or tag in ["a", "b"])`.
    pub fn parse(text: &str) -> IndexResult<Filter> {
        let tokens = tokenize(text)?;
        let mut parser = Parser {
            tokens,
            position: 0,
            depth: 0,
        };
        let filter = parser.or()?;
        if let Some(token) = parser.tokens.get(parser.position) {
            return Err(invalid(format!(
                "filter: unexpected {} at position {}",
                token.describe(),
                token.offset
            )));
        }
        Ok(filter)
    }
}

/// Returns the operator a symbol names (`=` and `==` are the same, as are
/// `!=` and `<>`).
pub(super) fn parse_op(symbol: &str) -> Option<CompareOp> {
    Some(match symbol {
        "=" | "==" => CompareOp::Eq,
        "!=" | "<>" => CompareOp::Ne,
        "<" => CompareOp::Lt,
        "<=" => CompareOp::Le,
        ">" => CompareOp::Gt,
        ">=" => CompareOp::Ge,
        _ => return None,
    })
}

#[derive(Clone, Debug, PartialEq)]
enum TokenKind {
    Ident(String),
    Literal(Literal),
    Op(CompareOp),
    Open,
    Close,
    OpenList,
    CloseList,
    Comma,
}

#[derive(Clone, Debug)]
struct Token {
    kind: TokenKind,
    offset: usize,
}

impl Token {
    fn describe(&self) -> String {
        match &self.kind {
            TokenKind::Ident(name) => format!("{name:?}"),
            TokenKind::Literal(literal) => literal.to_string(),
            TokenKind::Op(op) => format!("{:?}", op.symbol()),
            TokenKind::Open => "\"(\"".into(),
            TokenKind::Close => "\")\"".into(),
            TokenKind::OpenList => "\"[\"".into(),
            TokenKind::CloseList => "\"]\"".into(),
            TokenKind::Comma => "\",\"".into(),
        }
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(&self.kind, TokenKind::Ident(name) if name.eq_ignore_ascii_case(word))
    }
}

fn tokenize(text: &str) -> IndexResult<Vec<Token>> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut position = 0;
    while position < bytes.len() {
        let start = position;
        let byte = bytes[position];
        let kind = match byte {
            b' ' | b'\t' | b'\n' | b'\r' => {
                position += 1;
                continue;
            }
            b'(' => TokenKind::Open,
            b')' => TokenKind::Close,
            b'[' => TokenKind::OpenList,
            b']' => TokenKind::CloseList,
            b',' => TokenKind::Comma,
            b'=' | b'!' | b'<' | b'>' => {
                let two = text.get(position..position + 2).unwrap_or("");
                let (op, length) = match parse_op(two) {
                    Some(op) => (op, 2),
                    None => match parse_op(&text[position..position + 1]) {
                        Some(op) => (op, 1),
                        None => {
                            return Err(invalid(format!(
                                "filter: unknown operator at position {position}"
                            )));
                        }
                    },
                };
                position += length;
                tokens.push(Token {
                    kind: TokenKind::Op(op),
                    offset: start,
                });
                continue;
            }
            b'"' | b'\'' => {
                let quote = byte;
                let mut value = String::new();
                position += 1;
                loop {
                    let Some(&next) = bytes.get(position) else {
                        return Err(invalid(format!(
                            "filter: string starting at position {start} is not closed"
                        )));
                    };
                    if next == quote {
                        position += 1;
                        break;
                    }
                    if next == b'\\' {
                        let Some(escaped) = text[position + 1..].chars().next() else {
                            return Err(invalid("filter: dangling backslash"));
                        };
                        value.push(escaped);
                        position += 1 + escaped.len_utf8();
                        continue;
                    }
                    let character = text[position..].chars().next().expect("inside the text");
                    value.push(character);
                    position += character.len_utf8();
                }
                tokens.push(Token {
                    kind: TokenKind::Literal(Literal::String(value)),
                    offset: start,
                });
                continue;
            }
            b'-' | b'+' | b'0'..=b'9' | b'.' => {
                while position < bytes.len()
                    && matches!(
                        bytes[position],
                        b'0'..=b'9' | b'.' | b'e' | b'E' | b'-' | b'+' | b'_'
                    )
                {
                    position += 1;
                }
                let number = text[start..position].replace('_', "");
                let literal = if let Ok(integer) = number.parse::<i64>() {
                    Literal::Integer(integer)
                } else if let Ok(float) = number.parse::<f64>()
                    && float.is_finite()
                {
                    Literal::Float(float)
                } else {
                    return Err(invalid(format!(
                        "filter: {number:?} at position {start} is not a number"
                    )));
                };
                tokens.push(Token {
                    kind: TokenKind::Literal(literal),
                    offset: start,
                });
                continue;
            }
            byte if byte.is_ascii_alphabetic() || byte == b'_' => {
                while position < bytes.len()
                    && (bytes[position].is_ascii_alphanumeric()
                        || matches!(bytes[position], b'_' | b'.'))
                {
                    position += 1;
                }
                let word = &text[start..position];
                let kind = match word.to_ascii_lowercase().as_str() {
                    "true" => TokenKind::Literal(Literal::Bool(true)),
                    "false" => TokenKind::Literal(Literal::Bool(false)),
                    _ => TokenKind::Ident(word.to_string()),
                };
                tokens.push(Token {
                    kind,
                    offset: start,
                });
                continue;
            }
            _ => {
                let character = text[position..].chars().next().unwrap_or('?');
                return Err(invalid(format!(
                    "filter: unexpected character {character:?} at position {position}"
                )));
            }
        };
        position += 1;
        tokens.push(Token {
            kind,
            offset: start,
        });
    }
    if tokens.is_empty() {
        return Err(invalid("filter is empty"));
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    position: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.position)
    }

    fn next(&mut self, expected: &str) -> IndexResult<Token> {
        let token = self
            .tokens
            .get(self.position)
            .cloned()
            .ok_or_else(|| invalid(format!("filter ends where {expected} was expected")))?;
        self.position += 1;
        Ok(token)
    }

    fn or(&mut self) -> IndexResult<Filter> {
        let mut parts = vec![self.and()?];
        while self.peek().is_some_and(|token| token.is_word("or")) {
            self.position += 1;
            parts.push(self.and()?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Filter::Or(parts)
        })
    }

    fn and(&mut self) -> IndexResult<Filter> {
        let mut parts = vec![self.unary()?];
        while self.peek().is_some_and(|token| token.is_word("and")) {
            self.position += 1;
            parts.push(self.unary()?);
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Filter::And(parts)
        })
    }

    fn unary(&mut self) -> IndexResult<Filter> {
        self.depth += 1;
        if self.depth > MAX_FILTER_DEPTH {
            return Err(invalid(format!(
                "filter is nested deeper than {MAX_FILTER_DEPTH} levels"
            )));
        }
        let token = self.next("a condition")?;
        let result = match &token.kind {
            TokenKind::Ident(_) if token.is_word("not") => Ok(Filter::Not(Box::new(self.unary()?))),
            TokenKind::Open => {
                let inner = self.or()?;
                let close = self.next("\")\"")?;
                if close.kind != TokenKind::Close {
                    return Err(invalid(format!(
                        "filter: expected \")\" at position {}, found {}",
                        close.offset,
                        close.describe()
                    )));
                }
                Ok(inner)
            }
            TokenKind::Ident(field) => self.condition(field.clone()),
            _ => Err(invalid(format!(
                "filter: expected a field name at position {}, found {}",
                token.offset,
                token.describe()
            ))),
        };
        self.depth -= 1;
        result
    }

    fn condition(&mut self, field: String) -> IndexResult<Filter> {
        let token = self.next("an operator")?;
        match &token.kind {
            TokenKind::Op(op) => {
                let value = self.literal()?;
                Ok(Filter::Compare {
                    field,
                    op: *op,
                    value,
                })
            }
            TokenKind::Ident(_) if token.is_word("in") => Ok(Filter::In {
                field,
                values: self.list()?,
                negated: false,
            }),
            TokenKind::Ident(_) if token.is_word("not") => {
                let keyword = self.next("\"in\"")?;
                if !keyword.is_word("in") {
                    return Err(invalid(format!(
                        "filter: expected \"in\" after \"not\" at position {}",
                        keyword.offset
                    )));
                }
                Ok(Filter::In {
                    field,
                    values: self.list()?,
                    negated: true,
                })
            }
            _ => Err(invalid(format!(
                "filter: expected an operator after {field:?} at position {}, found {}",
                token.offset,
                token.describe()
            ))),
        }
    }

    fn literal(&mut self) -> IndexResult<Literal> {
        let token = self.next("a value")?;
        match token.kind {
            TokenKind::Literal(literal) => Ok(literal),
            _ => Err(invalid(format!(
                "filter: expected a value at position {}, found {} (quote strings)",
                token.offset,
                token.describe()
            ))),
        }
    }

    fn list(&mut self) -> IndexResult<Vec<Literal>> {
        let open = self.next("\"[\"")?;
        if open.kind != TokenKind::OpenList {
            return Err(invalid(format!(
                "filter: expected \"[\" at position {}",
                open.offset
            )));
        }
        let mut values = Vec::new();
        // `[]` is an empty list: programs build lists, and one may come out empty
        // (`in []` matches no row, `not in []` every row).
        if self
            .peek()
            .is_some_and(|token| token.kind == TokenKind::CloseList)
        {
            self.position += 1;
            return Ok(values);
        }
        loop {
            values.push(self.literal()?);
            let separator = self.next("\",\" or \"]\"")?;
            match separator.kind {
                TokenKind::Comma => continue,
                TokenKind::CloseList => break,
                _ => {
                    return Err(invalid(format!(
                        "filter: expected \",\" or \"]\" at position {}",
                        separator.offset
                    )));
                }
            }
        }
        Ok(values)
    }
}

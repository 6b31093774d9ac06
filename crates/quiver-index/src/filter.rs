//! Payload filters: an expression tree over the declared payload fields, its
//! readable string form (`color = "red" and price < 10`), its JSON form, and its
//! evaluation into a row bitmap of a segment (or against one JSON payload, for
//! rows not in a segment yet).
//!
//! Semantics: a comparison with a row that has no value for the field is false,
//! except `!=` and `not in`, which are the negations of `=` and `in` (so
//! `a != 1` is exactly `not (a = 1)`). Integers and floats compare numerically.

use std::fmt;

use roaring::RoaringBitmap;
use serde_json::Value;

use crate::error::{IndexError, IndexResult};
use crate::fields::{FieldColumn, FieldKind, FieldSpec};
use crate::reader::Segment;
use crate::source::ByteSource;

/// Deepest nesting of a filter (a guard against hostile inputs).
pub const MAX_FILTER_DEPTH: usize = 32;

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    fn symbol(self) -> &'static str {
        match self {
            CompareOp::Eq => "=",
            CompareOp::Ne => "!=",
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
        }
    }

    fn holds(self, ordering: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            CompareOp::Eq => ordering == Equal,
            CompareOp::Ne => ordering != Equal,
            CompareOp::Lt => ordering == Less,
            CompareOp::Le => ordering != Greater,
            CompareOp::Gt => ordering == Greater,
            CompareOp::Ge => ordering != Less,
        }
    }
}

/// A literal in a filter.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    String(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
}

impl fmt::Display for Literal {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::String(text) => write!(formatter, "{}", Value::String(text.clone())),
            Literal::Integer(value) => write!(formatter, "{value}"),
            Literal::Float(value) => write!(formatter, "{value:?}"),
            Literal::Bool(value) => write!(formatter, "{value}"),
        }
    }
}

impl Literal {
    fn number(&self) -> Option<f64> {
        match self {
            Literal::Integer(value) => Some(*value as f64),
            Literal::Float(value) => Some(*value),
            _ => None,
        }
    }

    fn from_json(value: &Value) -> Option<Literal> {
        match value {
            Value::String(text) => Some(Literal::String(text.clone())),
            Value::Bool(flag) => Some(Literal::Bool(*flag)),
            Value::Number(number) => number
                .as_i64()
                .map(Literal::Integer)
                .or_else(|| number.as_f64().map(Literal::Float)),
            _ => None,
        }
    }

    /// Compares a stored JSON value with this literal (None: not comparable).
    fn compare_json(&self, stored: &Value) -> Option<std::cmp::Ordering> {
        match (stored, self) {
            (Value::String(text), Literal::String(literal)) => Some(text.as_str().cmp(literal)),
            (Value::Bool(flag), Literal::Bool(literal)) => Some(flag.cmp(literal)),
            (Value::Number(number), literal) => {
                if let (Some(stored), Literal::Integer(literal)) = (number.as_i64(), literal) {
                    return Some(stored.cmp(literal));
                }
                number.as_f64()?.partial_cmp(&literal.number()?)
            }
            _ => None,
        }
    }
}

/// A filter expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    /// `field op literal`.
    Compare {
        field: String,
        op: CompareOp,
        value: Literal,
    },
    /// `field in [literals]` (or `not in` when `negated`).
    In {
        field: String,
        values: Vec<Literal>,
        negated: bool,
    },
    /// All must hold.
    And(Vec<Filter>),
    /// At least one must hold.
    Or(Vec<Filter>),
    /// Must not hold.
    Not(Box<Filter>),
}

impl fmt::Display for Filter {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Filter::Compare { field, op, value } => {
                write!(formatter, "{field} {} {value}", op.symbol())
            }
            Filter::In {
                field,
                values,
                negated,
            } => {
                let list: Vec<String> = values.iter().map(ToString::to_string).collect();
                let not = if *negated { "not " } else { "" };
                write!(formatter, "{field} {not}in [{}]", list.join(", "))
            }
            Filter::And(parts) | Filter::Or(parts) => {
                let joiner = if matches!(self, Filter::And(_)) {
                    " and "
                } else {
                    " or "
                };
                let texts: Vec<String> = parts.iter().map(|part| format!("({part})")).collect();
                write!(formatter, "{}", texts.join(joiner))
            }
            Filter::Not(inner) => write!(formatter, "not ({inner})"),
        }
    }
}

fn invalid(message: impl Into<String>) -> IndexError {
    IndexError::InvalidArgument(message.into())
}

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

    /// Reads the JSON form: a string (parsed), or an object
    /// `{"and": [..]}`, `{"or": [..]}`, `{"not": {..}}`,
    /// `{"field": "f", "op": "=", "value": v}`, `{"field": "f", "in": [..]}`,
    /// `{"field": "f", "not_in": [..]}`.
    pub fn from_json(value: &Value) -> IndexResult<Filter> {
        filter_from_json(value, 0)
    }

    /// Checks every field is declared in `schema` with a type its literals fit,
    /// and the nesting is not deeper than [`MAX_FILTER_DEPTH`].
    pub fn check(&self, schema: &[FieldSpec]) -> IndexResult<()> {
        self.check_at(schema, 0)
    }

    fn check_at(&self, schema: &[FieldSpec], depth: usize) -> IndexResult<()> {
        if depth > MAX_FILTER_DEPTH {
            return Err(invalid(format!(
                "filter is nested deeper than {MAX_FILTER_DEPTH} levels"
            )));
        }
        let check_literal = |field: &str, literal: &Literal| -> IndexResult<()> {
            let Some(spec) = schema.iter().find(|spec| spec.name == field) else {
                let declared: Vec<&str> = schema.iter().map(|spec| spec.name.as_str()).collect();
                return Err(invalid(format!(
                    "filter field {field:?} is not in the collection's payload schema (declared: {declared:?})"
                )));
            };
            let fits = matches!(
                (spec.kind, literal),
                (FieldKind::Keyword, Literal::String(_))
                    | (
                        FieldKind::Integer | FieldKind::Float,
                        Literal::Integer(_) | Literal::Float(_)
                    )
                    | (FieldKind::Bool, Literal::Bool(_))
            );
            if !fits {
                return Err(invalid(format!(
                    "filter compares field {field:?} ({:?}) with {literal}",
                    spec.kind
                )));
            }
            Ok(())
        };
        match self {
            Filter::Compare { field, op, value } => {
                check_literal(field, value)?;
                let ordered = matches!(op, CompareOp::Eq | CompareOp::Ne);
                if !ordered && matches!(value, Literal::Bool(_)) {
                    return Err(invalid(format!(
                        "filter: {} is not defined for booleans (field {field:?})",
                        op.symbol()
                    )));
                }
                Ok(())
            }
            Filter::In { field, values, .. } => values
                .iter()
                .try_for_each(|value| check_literal(field, value)),
            Filter::And(parts) | Filter::Or(parts) => parts
                .iter()
                .try_for_each(|part| part.check_at(schema, depth + 1)),
            Filter::Not(inner) => inner.check_at(schema, depth + 1),
        }
    }

    /// Returns true when the JSON `payload` satisfies the filter.
    pub fn matches_payload(&self, payload: Option<&Value>) -> bool {
        let lookup = |field: &str| payload.and_then(|payload| payload.get(field));
        match self {
            Filter::Compare { field, op, value } => match lookup(field) {
                Some(stored) => match value.compare_json(stored) {
                    Some(ordering) => op.holds(ordering),
                    None => *op == CompareOp::Ne,
                },
                None => *op == CompareOp::Ne,
            },
            Filter::In {
                field,
                values,
                negated,
            } => {
                let found = lookup(field).is_some_and(|stored| {
                    values
                        .iter()
                        .any(|value| value.compare_json(stored) == Some(std::cmp::Ordering::Equal))
                });
                found != *negated
            }
            Filter::And(parts) => parts.iter().all(|part| part.matches_payload(payload)),
            Filter::Or(parts) => parts.iter().any(|part| part.matches_payload(payload)),
            Filter::Not(inner) => !inner.matches_payload(payload),
        }
    }

    /// Returns the rows of `segment` that satisfy the filter.
    pub fn rows<S: ByteSource>(&self, segment: &Segment<S>) -> IndexResult<RoaringBitmap> {
        let rows = segment.rows() as u32;
        let mut columns = Vec::new();
        self.evaluate(segment, rows, &mut columns)
    }

    fn evaluate<S: ByteSource>(
        &self,
        segment: &Segment<S>,
        rows: u32,
        columns: &mut Vec<(String, Option<FieldColumn>)>,
    ) -> IndexResult<RoaringBitmap> {
        let all = || RoaringBitmap::from_sorted_iter(0..rows).expect("sorted");
        match self {
            Filter::Compare { field, op, value } => {
                let column = column_of(segment, field, columns)?;
                let matched = match column {
                    Some(column) => compare_column(column, rows, *op, value),
                    None => RoaringBitmap::new(),
                };
                Ok(if *op == CompareOp::Ne {
                    // Rows without a value are "not equal" too.
                    let mut equal = match column {
                        Some(column) => compare_column(column, rows, CompareOp::Eq, value),
                        None => RoaringBitmap::new(),
                    };
                    equal ^= all();
                    equal
                } else {
                    matched
                })
            }
            Filter::In {
                field,
                values,
                negated,
            } => {
                let column = column_of(segment, field, columns)?;
                let mut found = RoaringBitmap::new();
                if let Some(column) = column {
                    for value in values {
                        found |= compare_column(column, rows, CompareOp::Eq, value);
                    }
                }
                if *negated {
                    found ^= all();
                }
                Ok(found)
            }
            Filter::And(parts) => {
                let mut result = all();
                for part in parts {
                    result &= part.evaluate(segment, rows, columns)?;
                    if result.is_empty() {
                        break;
                    }
                }
                Ok(result)
            }
            Filter::Or(parts) => {
                let mut result = RoaringBitmap::new();
                for part in parts {
                    result |= part.evaluate(segment, rows, columns)?;
                }
                Ok(result)
            }
            Filter::Not(inner) => {
                let mut result = inner.evaluate(segment, rows, columns)?;
                result ^= all();
                Ok(result)
            }
        }
    }
}

/// Decodes each field's column once per evaluation.
fn column_of<'c, S: ByteSource>(
    segment: &Segment<S>,
    field: &str,
    columns: &'c mut Vec<(String, Option<FieldColumn>)>,
) -> IndexResult<Option<&'c FieldColumn>> {
    let position = match columns.iter().position(|(name, _)| name == field) {
        Some(position) => position,
        None => {
            columns.push((field.to_string(), segment.field_column(field)?));
            columns.len() - 1
        }
    };
    Ok(columns[position].1.as_ref())
}

fn present(bits: &[u64], row: usize) -> bool {
    bits.get(row / 64)
        .is_some_and(|word| word >> (row % 64) & 1 == 1)
}

/// Rows whose value satisfies `value op literal` (rows without a value never do).
fn compare_column(
    column: &FieldColumn,
    rows: u32,
    op: CompareOp,
    literal: &Literal,
) -> RoaringBitmap {
    let rows = rows as usize;
    let mut matched = RoaringBitmap::new();
    match column {
        FieldColumn::Keyword {
            dictionary,
            codes,
            present: bits,
        } => {
            let Literal::String(text) = literal else {
                return matched;
            };
            // The dictionary is sorted: decide per code, then scan codes.
            let accepted: Vec<bool> = dictionary
                .iter()
                .map(|entry| op.holds(entry.as_str().cmp(text)))
                .collect();
            for (row, &code) in codes.iter().enumerate().take(rows) {
                if present(bits, row) && accepted[code as usize] {
                    matched.insert(row as u32);
                }
            }
        }
        FieldColumn::Integer {
            values,
            present: bits,
        } => {
            for (row, &value) in values.iter().enumerate().take(rows) {
                if !present(bits, row) {
                    continue;
                }
                let ordering = match literal {
                    Literal::Integer(literal) => Some(value.cmp(literal)),
                    Literal::Float(literal) => (value as f64).partial_cmp(literal),
                    _ => None,
                };
                if ordering.is_some_and(|ordering| op.holds(ordering)) {
                    matched.insert(row as u32);
                }
            }
        }
        FieldColumn::Float {
            values,
            present: bits,
        } => {
            let Some(literal) = literal.number() else {
                return matched;
            };
            for (row, value) in values.iter().enumerate().take(rows) {
                if present(bits, row)
                    && value
                        .partial_cmp(&literal)
                        .is_some_and(|ordering| op.holds(ordering))
                {
                    matched.insert(row as u32);
                }
            }
        }
        FieldColumn::Bool {
            values,
            present: bits,
        } => {
            let Literal::Bool(literal) = literal else {
                return matched;
            };
            for (row, value) in values.iter().enumerate().take(rows) {
                if present(bits, row) && op.holds(value.cmp(literal)) {
                    matched.insert(row as u32);
                }
            }
        }
    }
    matched
}

fn filter_from_json(value: &Value, depth: usize) -> IndexResult<Filter> {
    if depth > MAX_FILTER_DEPTH {
        return Err(invalid(format!(
            "filter is nested deeper than {MAX_FILTER_DEPTH} levels"
        )));
    }
    let object = match value {
        Value::String(text) => return Filter::parse(text),
        Value::Object(object) => object,
        other => {
            return Err(invalid(format!(
                "filter must be a string or an object, got {other}"
            )));
        }
    };
    let list = |key: &str| -> IndexResult<Vec<Filter>> {
        let Some(Value::Array(items)) = object.get(key) else {
            return Err(invalid(format!("filter: {key:?} needs a list of filters")));
        };
        items
            .iter()
            .map(|item| filter_from_json(item, depth + 1))
            .collect()
    };
    if object.contains_key("and") {
        return Ok(Filter::And(list("and")?));
    }
    if object.contains_key("or") {
        return Ok(Filter::Or(list("or")?));
    }
    if let Some(inner) = object.get("not") {
        return Ok(Filter::Not(Box::new(filter_from_json(inner, depth + 1)?)));
    }
    let Some(Value::String(field)) = object.get("field") else {
        return Err(invalid(
            "filter object needs \"and\", \"or\", \"not\" or \"field\"",
        ));
    };
    let literals = |key: &str| -> IndexResult<Option<Vec<Literal>>> {
        match object.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    Literal::from_json(item).ok_or_else(|| {
                        invalid(format!("filter: {item} is not a string, number or bool"))
                    })
                })
                .collect::<IndexResult<Vec<_>>>()
                .map(Some),
            Some(other) => Err(invalid(format!(
                "filter: {key:?} needs a list, got {other}"
            ))),
        }
    };
    if let Some(values) = literals("in")? {
        return Ok(Filter::In {
            field: field.clone(),
            values,
            negated: false,
        });
    }
    if let Some(values) = literals("not_in")? {
        return Ok(Filter::In {
            field: field.clone(),
            values,
            negated: true,
        });
    }
    let op = match object.get("op").and_then(Value::as_str) {
        Some(symbol) => parse_op(symbol)
            .ok_or_else(|| invalid(format!("filter: unknown operator {symbol:?}")))?,
        None => CompareOp::Eq,
    };
    let value = object
        .get("value")
        .and_then(Literal::from_json)
        .ok_or_else(|| {
            invalid(format!(
                "filter on {field:?} needs a \"value\" (string, number or bool)"
            ))
        })?;
    Ok(Filter::Compare {
        field: field.clone(),
        op,
        value,
    })
}

fn parse_op(symbol: &str) -> Option<CompareOp> {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Vec<FieldSpec> {
        vec![
            FieldSpec {
                name: "color".into(),
                kind: FieldKind::Keyword,
            },
            FieldSpec {
                name: "price".into(),
                kind: FieldKind::Integer,
            },
            FieldSpec {
                name: "weight".into(),
                kind: FieldKind::Float,
            },
            FieldSpec {
                name: "sale".into(),
                kind: FieldKind::Bool,
            },
        ]
    }

    #[test]
    fn parses_the_string_form() {
        let filter = Filter::parse(
            r#"color = "red" and (price < 10 or weight >= 2.5) and not sale = true and color not in ['x', "y"]"#,
        )
        .unwrap();
        filter.check(&schema()).unwrap();
        let Filter::And(parts) = &filter else {
            panic!("{filter:?}")
        };
        assert_eq!(parts.len(), 4);
        // The display form parses back to the same tree.
        assert_eq!(Filter::parse(&filter.to_string()).unwrap(), filter);
    }

    #[test]
    fn errors_name_the_problem() {
        for (text, message) in [
            ("", "empty"),
            ("color =", "ends where a value"),
            ("color = red", "quote strings"),
            ("color ~ 1", "unexpected character"),
            ("(color = \"a\"", "\")\""),
            ("color = \"a", "not closed"),
            ("color in [1, ]", "expected a value"),
            ("color = \"a\" price = 1", "unexpected \"price\""),
        ] {
            let error = Filter::parse(text).unwrap_err().to_string();
            assert!(error.contains(message), "{text:?}: {error}");
        }
        for (text, message) in [
            ("size = 1", "not in the collection's payload schema"),
            ("price = \"cheap\"", "compares field \"price\""),
            ("sale < true", "not defined for booleans"),
        ] {
            let error = Filter::parse(text)
                .unwrap()
                .check(&schema())
                .unwrap_err()
                .to_string();
            assert!(error.contains(message), "{text:?}: {error}");
        }
        let deep = format!("{}price = 1{}", "(".repeat(40), ")".repeat(40));
        assert!(
            Filter::parse(&deep)
                .unwrap_err()
                .to_string()
                .contains("deeper")
        );
    }

    #[test]
    fn json_form_matches_string_form() {
        let from_json = Filter::from_json(&json!({
            "and": [
                {"field": "color", "value": "red"},
                {"or": [{"field": "price", "op": "<", "value": 10},
                        {"field": "weight", "op": ">=", "value": 2.5}]},
                {"not": {"field": "sale", "value": true}},
                {"field": "color", "not_in": ["x", "y"]}
            ]
        }))
        .unwrap();
        let from_text = Filter::parse(
            r#"color = "red" and (price < 10 or weight >= 2.5) and not sale = true and color not in ["x", "y"]"#,
        )
        .unwrap();
        assert_eq!(from_json, from_text);
        assert!(Filter::from_json(&json!([1])).is_err());
        assert!(Filter::from_json(&json!({"field": "a", "op": "~", "value": 1})).is_err());
    }

    #[test]
    fn payload_semantics_treat_missing_values_as_not_equal() {
        let filter = Filter::parse(r#"color != "red""#).unwrap();
        assert!(filter.matches_payload(None));
        assert!(filter.matches_payload(Some(&json!({"price": 1}))));
        assert!(!filter.matches_payload(Some(&json!({"color": "red"}))));
        let filter = Filter::parse("price >= 2 and price < 5.5").unwrap();
        assert!(filter.matches_payload(Some(&json!({"price": 5}))));
        assert!(!filter.matches_payload(Some(&json!({"price": 6}))));
        assert!(!filter.matches_payload(Some(&json!({"price": "5"}))));
        let filter = Filter::parse("price not in [1, 2]").unwrap();
        assert!(filter.matches_payload(Some(&json!({"price": 3}))));
        assert!(filter.matches_payload(None));
        assert!(!filter.matches_payload(Some(&json!({"price": 2}))));
    }
}

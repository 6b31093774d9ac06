//! Evaluating a filter: against one JSON payload (rows not in a segment yet),
//! or over a segment's field columns into a row bitmap.

use std::fmt;

use roaring::RoaringBitmap;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::ast::{CompareOp, Filter, Literal};
use crate::error::{IndexError, IndexResult};
use crate::fields::FieldColumn;
use crate::reader::Segment;
use crate::source::ByteSource;

impl CompareOp {
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

impl Literal {
    fn number(&self) -> Option<f64> {
        match self {
            Literal::Integer(value) => Some(*value as f64),
            Literal::Float(value) => Some(*value),
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

impl Filter {
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
    ///
    /// A field the segment has a column for (declared in the payload schema
    /// when it was written) is read from that column; any other field from the
    /// rows' stored payloads, scanned once per evaluation, with the same
    /// semantics as [`Filter::matches_payload`] — so a row matches the same
    /// filter before and after it is flushed into a segment.
    pub fn rows<S: ByteSource>(&self, segment: &Segment<S>) -> IndexResult<RoaringBitmap> {
        let rows = segment.rows() as u32;
        let mut columns = Vec::new();
        self.evaluate(segment, rows, &mut columns)
    }

    fn evaluate<S: ByteSource>(
        &self,
        segment: &Segment<S>,
        rows: u32,
        columns: &mut Vec<(String, Column)>,
    ) -> IndexResult<RoaringBitmap> {
        let all = || RoaringBitmap::from_sorted_iter(0..rows).expect("sorted");
        match self {
            Filter::Compare { field, op, value } => {
                let column = column_of(segment, field, columns)?;
                Ok(if *op == CompareOp::Ne {
                    // Rows without a value are "not equal" too.
                    let mut equal = column.compare(rows, CompareOp::Eq, value);
                    equal ^= all();
                    equal
                } else {
                    column.compare(rows, *op, value)
                })
            }
            Filter::In {
                field,
                values,
                negated,
            } => {
                let column = column_of(segment, field, columns)?;
                let mut found = RoaringBitmap::new();
                for value in values {
                    found |= column.compare(rows, CompareOp::Eq, value);
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

/// One field's values over a segment's rows, as a filter reads them.
enum Column {
    /// The segment's column of a declared field.
    Declared(FieldColumn),
    /// A field without a column: each row's value read out of its payload
    /// (rows without a payload or without the key have none).
    Scanned(Vec<(u32, Value)>),
}

impl Column {
    /// Rows whose value satisfies `value op literal` (rows without one never do).
    fn compare(&self, rows: u32, op: CompareOp, literal: &Literal) -> RoaringBitmap {
        match self {
            Column::Declared(column) => compare_column(column, rows, op, literal),
            Column::Scanned(values) => values
                .iter()
                .filter(|(_, stored)| {
                    literal
                        .compare_json(stored)
                        .is_some_and(|ordering| op.holds(ordering))
                })
                .map(|&(row, _)| row)
                .collect(),
        }
    }
}

/// Reads each field once per evaluation: its column, or its values scanned out
/// of the payloads when the segment has no column for it.
fn column_of<'c, S: ByteSource>(
    segment: &Segment<S>,
    field: &str,
    columns: &'c mut Vec<(String, Column)>,
) -> IndexResult<&'c Column> {
    let position = match columns.iter().position(|(name, _)| name == field) {
        Some(position) => position,
        None => {
            let column = match segment.field_column(field)? {
                Some(column) => Column::Declared(column),
                None => Column::Scanned(scan_field(segment, field)?),
            };
            columns.push((field.to_string(), column));
            columns.len() - 1
        }
    };
    Ok(&columns[position].1)
}

/// The rows of `segment` whose payload has a value for top-level key `field`,
/// with that value (`null` counts as none, as for a declared field).
fn scan_field<S: ByteSource>(segment: &Segment<S>, field: &str) -> IndexResult<Vec<(u32, Value)>> {
    let mut values = Vec::new();
    segment.for_each_payload(|row, text| {
        let value = payload_field(text, field).map_err(|_| {
            IndexError::corrupted(
                segment.source.name(),
                format!("payload of row {row} is not a JSON object"),
            )
        })?;
        if let Some(value) = value.filter(|value| !value.is_null()) {
            values.push((row, value));
        }
        Ok(())
    })?;
    Ok(values)
}

/// Reads the value of top-level key `field` out of a JSON object's text without
/// building the rest of it (the last one if the key repeats, as `Value` keeps).
/// `Ok(None)` when the key is absent or the text is not an object.
fn payload_field(text: &[u8], field: &str) -> serde_json::Result<Option<Value>> {
    struct KeyIs<'f>(&'f str);
    impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
        type Value = bool;
        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
            deserializer.deserialize_str(self)
        }
    }
    impl<'de> Visitor<'de> for KeyIs<'_> {
        type Value = bool;
        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("a key")
        }
        fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
            Ok(key == self.0)
        }
    }
    struct FieldOf<'f>(&'f str);
    impl<'de> Visitor<'de> for FieldOf<'_> {
        type Value = Option<Value>;
        fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            formatter.write_str("a JSON payload")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Value>, A::Error> {
            let mut found = None;
            while let Some(wanted) = map.next_key_seed(KeyIs(self.0))? {
                if wanted {
                    found = Some(map.next_value::<Value>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
        // Anything but an object has no keys.
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Value>, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Option<Value>, E> {
            Ok(None)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<Value>, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<Value>, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Option<Value>, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<Value>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<Value>, E> {
            Ok(None)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    let value = deserializer.deserialize_any(FieldOf(field))?;
    deserializer.end()?;
    Ok(value)
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

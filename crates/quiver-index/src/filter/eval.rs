//! Evaluating a filter: against one JSON payload (rows not in a segment yet),
//! or over a segment's field columns into a row bitmap.

use roaring::RoaringBitmap;
use serde_json::Value;

use super::ast::{CompareOp, Filter, Literal};
use crate::error::IndexResult;
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

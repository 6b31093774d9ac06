//! Evaluating a filter: against one JSON payload (rows not in a segment yet),
//! or over a segment's field columns into a row bitmap.

use std::borrow::Borrow;
use std::fmt;

use roaring::RoaringBitmap;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::ast::{CompareOp, Filter, Literal};
use crate::error::{IndexError, IndexResult};
use crate::fields::{FieldColumn, payload_value};
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
        let lookup = |field: &str| payload.and_then(|payload| payload_value(payload, field));
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
    /// rows' stored payloads ([`Segment::field_values`]), with the same
    /// semantics as [`Filter::matches_payload`] — so a row matches the same
    /// filter before and after it is flushed into a segment.
    pub fn rows<S: ByteSource>(&self, segment: &Segment<S>) -> IndexResult<RoaringBitmap> {
        self.rows_with(segment.rows() as u32, |field| segment.field_values(field))
    }

    /// Returns the rows (of `rows`) that satisfy the filter, reading each of
    /// its [`Filter::fields`]' values once with `read` — a caller that keeps
    /// [`Segment::field_values`] between filters passes its cache's.
    pub fn rows_with<V: Borrow<FieldValues>, E>(
        &self,
        rows: u32,
        mut read: impl FnMut(&str) -> Result<V, E>,
    ) -> Result<RoaringBitmap, E> {
        let mut values = Vec::new();
        for field in self.fields() {
            values.push((field, read(field)?));
        }
        Ok(self.rows_of(rows, &|field| {
            values
                .iter()
                .find(|(name, _)| *name == field)
                .map(|(_, values)| values.borrow())
        }))
    }

    /// The distinct fields the filter reads, in order of appearance.
    pub fn fields(&self) -> Vec<&str> {
        fn collect<'f>(filter: &'f Filter, out: &mut Vec<&'f str>) {
            match filter {
                // An empty list reads nothing: its answer is known without the values.
                Filter::In { values, .. } if values.is_empty() => {}
                Filter::Compare { field, .. } | Filter::In { field, .. } => {
                    if !out.contains(&field.as_str()) {
                        out.push(field);
                    }
                }
                Filter::And(parts) | Filter::Or(parts) => {
                    parts.iter().for_each(|part| collect(part, out))
                }
                Filter::Not(inner) => collect(inner, out),
            }
        }
        let mut out = Vec::new();
        collect(self, &mut out);
        out
    }

    /// Returns the rows (of `rows`) that satisfy the filter, given each of its
    /// [`Filter::fields`]' values over those rows (`None`: no row has one) —
    /// for a caller that keeps [`Segment::field_values`] between filters.
    pub fn rows_of<'v>(
        &self,
        rows: u32,
        values: &dyn Fn(&str) -> Option<&'v FieldValues>,
    ) -> RoaringBitmap {
        let all = || RoaringBitmap::from_sorted_iter(0..rows).expect("sorted");
        let compare = |field: &str, op: CompareOp, literal: &Literal| {
            values(field).map_or_else(RoaringBitmap::new, |values| {
                values.compare(rows, op, literal)
            })
        };
        match self {
            Filter::Compare { field, op, value } => {
                if *op == CompareOp::Ne {
                    // Rows without a value are "not equal" too.
                    let mut equal = compare(field, CompareOp::Eq, value);
                    equal ^= all();
                    equal
                } else {
                    compare(field, *op, value)
                }
            }
            Filter::In {
                field,
                values: literals,
                negated,
            } => {
                let mut found = RoaringBitmap::new();
                for literal in literals {
                    found |= compare(field, CompareOp::Eq, literal);
                }
                if *negated {
                    found ^= all();
                }
                found
            }
            Filter::And(parts) => {
                let mut result = all();
                for part in parts {
                    result &= part.rows_of(rows, values);
                    if result.is_empty() {
                        break;
                    }
                }
                result
            }
            Filter::Or(parts) => {
                let mut result = RoaringBitmap::new();
                for part in parts {
                    result |= part.rows_of(rows, values);
                }
                result
            }
            Filter::Not(inner) => {
                let mut result = inner.rows_of(rows, values);
                result ^= all();
                result
            }
        }
    }
}

/// One payload field's values over the rows of a segment, as filters read them:
/// the segment's column of a declared field, or — for a field it has no column
/// for — typed columns built from the stored payloads, one per JSON type the
/// field holds (keywords, integers, other numbers, booleans; `null`, arrays and
/// objects count as no value). What a searcher caches per segment and field.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldValues {
    columns: Vec<FieldColumn>,
    /// Whether they were read out of the payloads (the field has no column).
    scanned: bool,
}

impl FieldValues {
    /// Whether the values were scanned out of the payloads (no column).
    pub fn scanned(&self) -> bool {
        self.scanned
    }

    /// Heap bytes held (for a cache's weigher).
    pub fn weight(&self) -> usize {
        self.columns
            .iter()
            .map(|column| match column {
                FieldColumn::Keyword {
                    dictionary,
                    codes,
                    present,
                } => {
                    dictionary.iter().map(|word| word.len() + 24).sum::<usize>()
                        + codes.len() * 4
                        + present.len() * 8
                }
                FieldColumn::Integer { values, present } => values.len() * 8 + present.len() * 8,
                FieldColumn::Float { values, present } => values.len() * 8 + present.len() * 8,
                FieldColumn::Bool { values, present } => values.len() + present.len() * 8,
            })
            .sum::<usize>()
            + 64
    }

    /// Rows whose value satisfies `value op literal` (rows without one never do).
    fn compare(&self, rows: u32, op: CompareOp, literal: &Literal) -> RoaringBitmap {
        let mut matched = RoaringBitmap::new();
        for column in &self.columns {
            matched |= compare_column(column, rows, op, literal);
        }
        matched
    }
}

impl<S: ByteSource> Segment<S> {
    /// Returns field `name`'s values over this segment's rows: its column when
    /// the segment has one, else read out of every row's stored payload (one
    /// pass over the payloads, [`Segment::for_each_payload`]).
    pub fn field_values(&self, name: &str) -> IndexResult<FieldValues> {
        if let Some(column) = self.field_column(name)? {
            return Ok(FieldValues {
                columns: vec![column],
                scanned: false,
            });
        }
        let rows = self.rows() as usize;
        let words = rows.div_ceil(64);
        let mut keywords: Vec<(u32, String)> = Vec::new();
        let (mut integers, mut integers_present) = (Vec::new(), Vec::new());
        let (mut floats, mut floats_present) = (Vec::new(), Vec::new());
        let (mut bools, mut bools_present) = (Vec::new(), Vec::new());
        let set = |present: &mut Vec<u64>, row: u32| {
            present.resize(words, 0);
            present[row as usize / 64] |= 1 << (row % 64);
        };
        self.for_each_payload(|row, text| {
            let value = payload_field(text, name).map_err(|_| {
                IndexError::corrupted(
                    self.source.name(),
                    format!("payload of row {row} is not JSON"),
                )
            })?;
            match value {
                Some(Value::String(text)) => keywords.push((row, text)),
                Some(Value::Bool(flag)) => {
                    bools.resize(rows, false);
                    bools[row as usize] = flag;
                    set(&mut bools_present, row);
                }
                Some(Value::Number(number)) => match number.as_i64() {
                    Some(integer) => {
                        integers.resize(rows, 0);
                        integers[row as usize] = integer;
                        set(&mut integers_present, row);
                    }
                    None => {
                        floats.resize(rows, 0.0);
                        floats[row as usize] = number.as_f64().unwrap_or(f64::NAN);
                        set(&mut floats_present, row);
                    }
                },
                _ => {}
            }
            Ok(())
        })?;
        let mut columns = Vec::new();
        if !keywords.is_empty() {
            let mut dictionary: Vec<String> =
                keywords.iter().map(|(_, text)| text.clone()).collect();
            dictionary.sort_unstable();
            dictionary.dedup();
            let mut codes = vec![0u32; rows];
            let mut present = Vec::new();
            for (row, text) in &keywords {
                codes[*row as usize] =
                    dictionary.binary_search(text).expect("in dictionary") as u32;
                set(&mut present, *row);
            }
            columns.push(FieldColumn::Keyword {
                dictionary,
                codes,
                present,
            });
        }
        if !integers_present.is_empty() {
            columns.push(FieldColumn::Integer {
                values: integers,
                present: integers_present,
            });
        }
        if !floats_present.is_empty() {
            columns.push(FieldColumn::Float {
                values: floats,
                present: floats_present,
            });
        }
        if !bools_present.is_empty() {
            columns.push(FieldColumn::Bool {
                values: bools,
                present: bools_present,
            });
        }
        Ok(FieldValues {
            columns,
            scanned: true,
        })
    }
}

/// Reads the value of top-level key `field` out of a JSON object's text without
/// building the rest of it (the last one if the key repeats, as `Value` keeps);
/// a dotted name is read as [`payload_value`] does, from the whole payload.
/// `Ok(None)` when there is no such value or the text is not an object.
fn payload_field(text: &[u8], field: &str) -> serde_json::Result<Option<Value>> {
    if field.contains('.') {
        // A path into nested objects, unless a top-level key has the name.
        let payload: Value = serde_json::from_slice(text)?;
        return Ok(payload_value(&payload, field).cloned());
    }
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

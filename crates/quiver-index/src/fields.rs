//! Filterable payload fields: the schema, and the column encoding in a segment.
//!
//! Section layout: u64 directory length, the JSON directory (padded to 8 bytes),
//! then per field a validity bitmap (u64 words, bit set = value present) and the
//! values: i64 (integer), f64 (float), u8 (bool), or u32 dictionary codes plus a
//! sorted dictionary of `(count + 1)` u32 offsets and the UTF-8 bytes (keyword).

use serde::{Deserialize, Serialize};

use crate::error::{IndexError, IndexResult};

pub use quiver_model::FieldKind;

/// One declared filterable field.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Payload key holding the value.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub kind: FieldKind,
}

/// A decoded column of one field over all rows of a segment.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldColumn {
    /// Keyword values as dictionary codes into a sorted dictionary.
    Keyword {
        dictionary: Vec<String>,
        codes: Vec<u32>,
        present: Vec<u64>,
    },
    /// Integer values.
    Integer { values: Vec<i64>, present: Vec<u64> },
    /// Float values.
    Float { values: Vec<f64>, present: Vec<u64> },
    /// Bool values.
    Bool {
        values: Vec<bool>,
        present: Vec<u64>,
    },
}

/// One field's value, as read back for a row.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    Keyword(String),
    Integer(i64),
    Float(f64),
    Bool(bool),
}

impl FieldColumn {
    fn present(&self) -> &[u64] {
        match self {
            FieldColumn::Keyword { present, .. }
            | FieldColumn::Integer { present, .. }
            | FieldColumn::Float { present, .. }
            | FieldColumn::Bool { present, .. } => present,
        }
    }

    /// Returns the value of `row`, or `None` when the row has no value.
    pub fn value(&self, row: usize) -> Option<FieldValue> {
        if self.present().get(row / 64)? >> (row % 64) & 1 == 0 {
            return None;
        }
        Some(match self {
            FieldColumn::Keyword {
                dictionary, codes, ..
            } => FieldValue::Keyword(dictionary[codes[row] as usize].clone()),
            FieldColumn::Integer { values, .. } => FieldValue::Integer(values[row]),
            FieldColumn::Float { values, .. } => FieldValue::Float(values[row]),
            FieldColumn::Bool { values, .. } => FieldValue::Bool(values[row]),
        })
    }
}

/// The value a filter reads for `field` in `payload`: its top-level key of that
/// name, or — when there is none and the name has dots — the value at that path
/// of nested objects (`meta.lang` is `payload["meta"]["lang"]`).
pub(crate) fn payload_value<'p>(
    payload: &'p serde_json::Value,
    field: &str,
) -> Option<&'p serde_json::Value> {
    if let Some(value) = payload.get(field) {
        return Some(value);
    }
    if !field.contains('.') {
        return None;
    }
    field
        .split('.')
        .try_fold(payload, |value, part| value.get(part))
}

/// Extracts the declared field values of one payload, checking their types.
pub(crate) fn extract_values(
    fields: &[FieldSpec],
    row: usize,
    payload: Option<&serde_json::Value>,
) -> IndexResult<Vec<Option<FieldValue>>> {
    fields
        .iter()
        .map(|field| {
            let Some(value) = payload.and_then(|p| payload_value(p, &field.name)) else {
                return Ok(None);
            };
            if value.is_null() {
                return Ok(None);
            }
            let converted = match field.kind {
                FieldKind::Keyword => value.as_str().map(|s| FieldValue::Keyword(s.to_string())),
                FieldKind::Integer => value.as_i64().map(FieldValue::Integer),
                FieldKind::Float => value.as_f64().map(FieldValue::Float),
                FieldKind::Bool => value.as_bool().map(FieldValue::Bool),
            };
            converted.map(Some).ok_or_else(|| {
                IndexError::InvalidArgument(format!(
                    "payload field {:?} of row {row} is {value}, but the schema declares it {:?}",
                    field.name, field.kind
                ))
            })
        })
        .collect()
}

#[derive(Serialize, Deserialize)]
struct ColumnDirectory {
    name: String,
    kind: FieldKind,
    present: (u64, u64),
    values: (u64, u64),
    #[serde(default)]
    dictionary_offsets: (u64, u64),
    #[serde(default)]
    dictionary_bytes: (u64, u64),
}

fn pad8(bytes: &mut Vec<u8>) {
    while !bytes.len().is_multiple_of(8) {
        bytes.push(0);
    }
}

fn push_part(data: &mut Vec<u8>, part: &[u8]) -> (u64, u64) {
    pad8(data);
    let offset = data.len() as u64;
    data.extend_from_slice(part);
    (offset, part.len() as u64)
}

/// Encodes the field columns; `values[row][field]` in row order.
pub(crate) fn encode_columns(fields: &[FieldSpec], values: &[Vec<Option<FieldValue>>]) -> Vec<u8> {
    let rows = values.len();
    let mut data = Vec::new();
    let mut directory = Vec::new();
    for (field_index, field) in fields.iter().enumerate() {
        let mut present = vec![0u64; rows.div_ceil(64)];
        for (row, row_values) in values.iter().enumerate() {
            if row_values[field_index].is_some() {
                present[row / 64] |= 1 << (row % 64);
            }
        }
        let present_range = push_part(&mut data, bytemuck::cast_slice(&present));
        let mut entry = ColumnDirectory {
            name: field.name.clone(),
            kind: field.kind,
            present: present_range,
            values: (0, 0),
            dictionary_offsets: (0, 0),
            dictionary_bytes: (0, 0),
        };
        let column = values
            .iter()
            .map(|row_values| row_values[field_index].as_ref());
        match field.kind {
            FieldKind::Integer => {
                let ints: Vec<i64> = column
                    .map(|v| {
                        if let Some(FieldValue::Integer(i)) = v {
                            *i
                        } else {
                            0
                        }
                    })
                    .collect();
                entry.values = push_part(&mut data, bytemuck::cast_slice(&ints));
            }
            FieldKind::Float => {
                let floats: Vec<f64> = column
                    .map(|v| {
                        if let Some(FieldValue::Float(f)) = v {
                            *f
                        } else {
                            0.0
                        }
                    })
                    .collect();
                entry.values = push_part(&mut data, bytemuck::cast_slice(&floats));
            }
            FieldKind::Bool => {
                let bools: Vec<u8> = column
                    .map(|v| matches!(v, Some(FieldValue::Bool(true))) as u8)
                    .collect();
                entry.values = push_part(&mut data, &bools);
            }
            FieldKind::Keyword => {
                let strings: Vec<&str> = column
                    .map(|v| {
                        if let Some(FieldValue::Keyword(s)) = v {
                            s.as_str()
                        } else {
                            ""
                        }
                    })
                    .collect();
                let mut dictionary: Vec<&str> = strings.clone();
                dictionary.sort_unstable();
                dictionary.dedup();
                let codes: Vec<u32> = strings
                    .iter()
                    .map(|s| dictionary.binary_search(s).expect("in dictionary") as u32)
                    .collect();
                let mut offsets = Vec::with_capacity(dictionary.len() + 1);
                let mut bytes = Vec::new();
                offsets.push(0u32);
                for word in &dictionary {
                    bytes.extend_from_slice(word.as_bytes());
                    offsets.push(bytes.len() as u32);
                }
                entry.values = push_part(&mut data, bytemuck::cast_slice(&codes));
                entry.dictionary_offsets = push_part(&mut data, bytemuck::cast_slice(&offsets));
                entry.dictionary_bytes = push_part(&mut data, &bytes);
            }
        }
        directory.push(entry);
    }
    let mut json = serde_json::to_vec(&directory).expect("directory serialises");
    pad8(&mut json);
    let mut section = Vec::with_capacity(8 + json.len() + data.len());
    section.extend_from_slice(&(json.len() as u64).to_le_bytes());
    section.extend_from_slice(&json);
    // Directory offsets are relative to the data area, which starts here.
    section.extend_from_slice(&data);
    section
}

/// Decodes the column of field `name` from the fields section.
pub(crate) fn decode_column(
    object: &str,
    section: &[u8],
    name: &str,
    rows: usize,
) -> IndexResult<Option<FieldColumn>> {
    let corrupted =
        |reason: &str| IndexError::corrupted(object, format!("fields section: {reason}"));
    if section.len() < 8 {
        return Err(corrupted("too short"));
    }
    let json_length = u64::from_le_bytes(section[..8].try_into().expect("8 bytes")) as usize;
    let json = section
        .get(8..8 + json_length)
        .ok_or_else(|| corrupted("directory truncated"))?;
    let json_end = json.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let directory: Vec<ColumnDirectory> =
        serde_json::from_slice(&json[..json_end]).map_err(|_| corrupted("bad directory"))?;
    let data = &section[8 + json_length..];
    let Some(entry) = directory.into_iter().find(|entry| entry.name == name) else {
        return Ok(None);
    };
    let part = |(offset, length): (u64, u64)| -> IndexResult<&[u8]> {
        data.get(offset as usize..(offset + length) as usize)
            .ok_or_else(|| corrupted("part out of range"))
    };
    let present: Vec<u64> = bytemuck::pod_collect_to_vec(part(entry.present)?);
    if present.len() != rows.div_ceil(64) {
        return Err(corrupted("presence bitmap has the wrong length"));
    }
    let values = part(entry.values)?;
    let expect_len = |bytes: &[u8], width: usize| {
        if bytes.len() == rows * width {
            Ok(())
        } else {
            Err(corrupted("column has the wrong length"))
        }
    };
    let column = match entry.kind {
        FieldKind::Integer => {
            expect_len(values, 8)?;
            FieldColumn::Integer {
                values: bytemuck::pod_collect_to_vec(values),
                present,
            }
        }
        FieldKind::Float => {
            expect_len(values, 8)?;
            FieldColumn::Float {
                values: bytemuck::pod_collect_to_vec(values),
                present,
            }
        }
        FieldKind::Bool => {
            expect_len(values, 1)?;
            FieldColumn::Bool {
                values: values.iter().map(|&b| b != 0).collect(),
                present,
            }
        }
        FieldKind::Keyword => {
            expect_len(values, 4)?;
            let codes: Vec<u32> = bytemuck::pod_collect_to_vec(values);
            let offsets: Vec<u32> = bytemuck::pod_collect_to_vec(part(entry.dictionary_offsets)?);
            let bytes = part(entry.dictionary_bytes)?;
            let mut dictionary = Vec::with_capacity(offsets.len().saturating_sub(1));
            for pair in offsets.windows(2) {
                let word = bytes
                    .get(pair[0] as usize..pair[1] as usize)
                    .and_then(|w| std::str::from_utf8(w).ok())
                    .ok_or_else(|| corrupted("bad keyword dictionary"))?;
                dictionary.push(word.to_string());
            }
            if codes
                .iter()
                .any(|&code| code as usize >= dictionary.len().max(1))
            {
                return Err(corrupted("keyword code outside the dictionary"));
            }
            if dictionary.is_empty() {
                dictionary.push(String::new());
            }
            FieldColumn::Keyword {
                dictionary,
                codes,
                present,
            }
        }
    };
    Ok(Some(column))
}

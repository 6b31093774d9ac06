//! The JSON form of a filter, decoded with serde: a string (the string form),
//! or an object that is exactly one of
//! `{"and": [..]}`, `{"or": [..]}`, `{"not": f}`, `{"field": "f", "op": "=", "value": v}`,
//! `{"field": "f", "in": [..]}`, `{"field": "f", "not_in": [..]}`.
//! Unknown keys and objects that mix two forms (`and` beside `or`, `in` beside
//! `value`) are refused with the key named, never silently dropped.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::{Value, json};

use super::ast::{CompareOp, Filter, Literal};
use super::parse::parse_op;
use super::{MAX_FILTER_DEPTH, invalid};
use crate::error::IndexResult;

impl Filter {
    /// Reads the JSON form: a string (parsed), or an object
    /// `{"and": [..]}`, `{"or": [..]}`, `{"not": {..}}`,
    /// `{"field": "f", "op": "=", "value": v}`, `{"field": "f", "in": [..]}`,
    /// `{"field": "f", "not_in": [..]}`. An unknown key, or keys of two forms in one
    /// object, is an invalid argument naming the key.
    pub fn from_json(value: &Value) -> IndexResult<Filter> {
        let tree: JsonFilter = serde_path_to_error::deserialize(value).map_err(|error| {
            let path = error.path().to_string();
            let inner = error.into_inner();
            if path.is_empty() || path == "." {
                invalid(format!("filter: {inner}"))
            } else {
                invalid(format!("filter: `{path}`: {inner}"))
            }
        })?;
        tree.into_filter(0)
    }

    /// Returns the JSON form of the filter (objects only, no string leaves):
    /// what [`Filter::from_json`] reads back as the same tree.
    pub fn to_json(&self) -> Value {
        let literal = |literal: &Literal| match literal {
            Literal::String(text) => Value::String(text.clone()),
            Literal::Integer(value) => Value::from(*value),
            Literal::Float(value) => Value::from(*value),
            Literal::Bool(value) => Value::Bool(*value),
        };
        match self {
            Filter::Compare { field, op, value } => json!({
                "field": field,
                "op": op.symbol(),
                "value": literal(value),
            }),
            Filter::In {
                field,
                values,
                negated,
            } => {
                let key = if *negated { "not_in" } else { "in" };
                json!({"field": field, key: values.iter().map(literal).collect::<Vec<_>>()})
            }
            Filter::And(parts) => {
                json!({"and": parts.iter().map(Filter::to_json).collect::<Vec<_>>()})
            }
            Filter::Or(parts) => {
                json!({"or": parts.iter().map(Filter::to_json).collect::<Vec<_>>()})
            }
            Filter::Not(inner) => json!({"not": inner.to_json()}),
        }
    }

    /// Returns the text a gateway sends a searcher: the string form when it reads
    /// back as the same tree, else the JSON form — a JSON filter's field name need
    /// not be one the string form can spell (`my-field`, `not`), nor its lists of
    /// conditions non-empty (`{"or": []}` has no string form).
    pub fn to_wire(&self) -> String {
        let text = self.to_string();
        match Filter::parse(&text) {
            Ok(read_back) if read_back == *self => text,
            _ => self.to_json().to_string(),
        }
    }

    /// Reads what [`Filter::to_wire`] wrote: JSON when it starts with `{`, else
    /// the string form.
    pub fn from_wire(text: &str) -> IndexResult<Filter> {
        if !text.trim_start().starts_with('{') {
            return Filter::parse(text);
        }
        let value: Value = serde_json::from_str(text)
            .map_err(|error| invalid(format!("filter is not valid JSON: {error}")))?;
        Filter::from_json(&value)
    }
}

/// A filter as JSON holds it: the string form or an object.
#[derive(Debug)]
enum JsonFilter {
    Text(String),
    Object(Box<FilterObject>),
}

/// Decoded by hand (not `untagged`) so that the errors inside an object (an
/// unknown key) reach the user instead of "did not match any variant".
impl<'de> Deserialize<'de> for JsonFilter {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct JsonFilterVisitor;

        impl<'de> Visitor<'de> for JsonFilterVisitor {
            type Value = JsonFilter;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a filter string or a filter object")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<JsonFilter, E> {
                Ok(JsonFilter::Text(text.to_string()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<JsonFilter, E> {
                Ok(JsonFilter::Text(text))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<JsonFilter, A::Error> {
                FilterObject::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|object| JsonFilter::Object(Box::new(object)))
            }
        }

        deserializer.deserialize_any(JsonFilterVisitor)
    }
}

/// Every key a filter object may have; which combinations are allowed is
/// checked in [`FilterObject::into_filter`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterObject {
    #[serde(default)]
    and: Option<Vec<JsonFilter>>,
    #[serde(default)]
    or: Option<Vec<JsonFilter>>,
    #[serde(default)]
    not: Option<JsonFilter>,
    #[serde(default)]
    field: Option<String>,
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    value: Option<Value>,
    #[serde(default, rename = "in")]
    in_values: Option<Vec<Value>>,
    #[serde(default)]
    not_in: Option<Vec<Value>>,
}

impl JsonFilter {
    fn into_filter(self, depth: usize) -> IndexResult<Filter> {
        if depth > MAX_FILTER_DEPTH {
            return Err(invalid(format!(
                "filter is nested deeper than {MAX_FILTER_DEPTH} levels"
            )));
        }
        match self {
            JsonFilter::Text(text) => Filter::parse(&text),
            JsonFilter::Object(object) => object.into_filter(depth),
        }
    }
}

fn literal_of(value: &Value) -> Option<Literal> {
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

fn literals_of(values: &[Value]) -> IndexResult<Vec<Literal>> {
    values
        .iter()
        .map(|item| {
            literal_of(item)
                .ok_or_else(|| invalid(format!("filter: {item} is not a string, number or bool")))
        })
        .collect()
}

impl FilterObject {
    /// Returns the keys present, in a fixed order.
    fn keys(&self) -> Vec<&'static str> {
        [
            ("and", self.and.is_some()),
            ("or", self.or.is_some()),
            ("not", self.not.is_some()),
            ("field", self.field.is_some()),
            ("op", self.op.is_some()),
            ("value", self.value.is_some()),
            ("in", self.in_values.is_some()),
            ("not_in", self.not_in.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, present)| present.then_some(key))
        .collect()
    }

    fn into_filter(self, depth: usize) -> IndexResult<Filter> {
        let keys = self.keys();
        // One form per object: the first key of the form says which, any key of
        // another form is refused by name.
        let form = keys
            .iter()
            .copied()
            .find(|key| matches!(*key, "and" | "or" | "not" | "field"));
        let Some(form) = form else {
            return Err(invalid(match keys.first() {
                Some(key) => format!(
                    "filter: {key:?} needs a \"field\" to apply to (an object is {{\"and\"}}, {{\"or\"}}, {{\"not\"}} or a condition on {{\"field\"}})"
                ),
                None => "filter object needs \"and\", \"or\", \"not\" or \"field\"".to_string(),
            }));
        };
        let allowed: &[&str] = match form {
            "field" => &["field", "op", "value", "in", "not_in"],
            _ => &[],
        };
        if let Some(extra) = keys
            .iter()
            .find(|key| **key != form && !allowed.contains(key))
        {
            return Err(invalid(format!(
                "filter: an object with {form:?} cannot also have {extra:?}; nest them, e.g. {{\"and\": [{{…}}, {{\"or\": […]}}]}}"
            )));
        }
        let children = |items: Vec<JsonFilter>| -> IndexResult<Vec<Filter>> {
            items
                .into_iter()
                .map(|item| item.into_filter(depth + 1))
                .collect()
        };
        match self {
            FilterObject {
                and: Some(items), ..
            } => Ok(Filter::And(children(items)?)),
            FilterObject {
                or: Some(items), ..
            } => Ok(Filter::Or(children(items)?)),
            FilterObject {
                not: Some(inner), ..
            } => Ok(Filter::Not(Box::new(inner.into_filter(depth + 1)?))),
            FilterObject {
                field: Some(field),
                op,
                value,
                in_values,
                not_in,
                ..
            } => condition(field, op, value, in_values, not_in),
            _ => Err(invalid(
                "filter object needs \"and\", \"or\", \"not\" or \"field\"",
            )),
        }
    }
}

/// Builds a condition on `field`: `in`, `not_in`, or `op` (default `=`) with `value`.
fn condition(
    field: String,
    op: Option<String>,
    value: Option<Value>,
    in_values: Option<Vec<Value>>,
    not_in: Option<Vec<Value>>,
) -> IndexResult<Filter> {
    let list = match (&in_values, &not_in) {
        (Some(_), Some(_)) => {
            return Err(invalid(format!(
                "filter on {field:?} has both \"in\" and \"not_in\"; use one"
            )));
        }
        (Some(values), None) => Some((values, false)),
        (None, Some(values)) => Some((values, true)),
        (None, None) => None,
    };
    if let Some((values, negated)) = list {
        let key = if negated { "not_in" } else { "in" };
        if let Some(extra) = [("op", op.is_some()), ("value", value.is_some())]
            .into_iter()
            .find_map(|(name, present)| present.then_some(name))
        {
            return Err(invalid(format!(
                "filter on {field:?} has both {key:?} and {extra:?}; a condition is \"in\", \"not_in\" or \"op\" with \"value\""
            )));
        }
        return Ok(Filter::In {
            field,
            values: literals_of(values)?,
            negated,
        });
    }
    let op = match op.as_deref() {
        Some(symbol) => parse_op(symbol)
            .ok_or_else(|| invalid(format!("filter: unknown operator {symbol:?}")))?,
        None => CompareOp::Eq,
    };
    let value = value.as_ref().and_then(literal_of).ok_or_else(|| {
        invalid(format!(
            "filter on {field:?} needs a \"value\" (string, number or bool)"
        ))
    })?;
    Ok(Filter::Compare { field, op, value })
}

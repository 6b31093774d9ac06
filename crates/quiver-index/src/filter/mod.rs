//! Payload filters: an expression tree over payload fields, its
//! readable string form (`color = "red" and price < 10`), its JSON form, and its
//! evaluation into a row bitmap of a segment (or against one JSON payload, for
//! rows not in a segment yet).
//!
//! - `ast`: the tree ([`Filter`], [`CompareOp`], [`Literal`]) and its string form
//!   out (`Display`);
//! - `parse`: the string form in (lexer and parser);
//! - `json`: the JSON form in (serde, unknown keys refused);
//! - `check`: the tree against a collection's payload schema;
//! - `eval`: the tree against a payload or over a segment's columns.
//!
//! Semantics: a comparison with a row that has no value for the field is false,
//! except `!=` and `not in`, which are the negations of `=` and `in` (so
//! `a != 1` is exactly `not (a = 1)`). Integers and floats compare numerically.

mod ast;
mod check;
mod eval;
mod json;
mod parse;

pub use ast::{CompareOp, Filter, Literal};
pub use eval::FieldValues;

use crate::error::IndexError;

/// Deepest nesting of a filter (a guard against hostile inputs).
pub const MAX_FILTER_DEPTH: usize = 32;

fn invalid(message: impl Into<String>) -> IndexError {
    IndexError::InvalidArgument(message.into())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fields::{FieldKind, FieldSpec};

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
        // A field the schema does not declare is read from the payloads: any
        // literal fits it.
        for text in [
            "size = 1",
            "size = \"large\" or price = 2",
            "size in [1, \"a\", true]",
        ] {
            Filter::parse(text).unwrap().check(&schema()).unwrap();
        }
        for (text, message) in [
            ("price = \"cheap\"", "compares field \"price\""),
            ("size < false", "not defined for booleans"),
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
    fn an_empty_in_list_matches_nothing_and_an_empty_not_in_list_everything() {
        let payloads = [
            None,
            Some(json!({"lang": "en"})),
            Some(json!({"lang": "de", "price": 3})),
        ];
        for (from_text, from_json, negated) in [
            ("lang in []", json!({"field": "lang", "in": []}), false),
            (
                "lang not in [ ]",
                json!({"field": "lang", "not_in": []}),
                true,
            ),
        ] {
            let filter = Filter::parse(from_text).unwrap();
            assert_eq!(Filter::from_json(&from_json).unwrap(), filter);
            assert_eq!(
                filter,
                Filter::In {
                    field: "lang".into(),
                    values: Vec::new(),
                    negated,
                }
            );
            filter.check(&schema()).unwrap();
            // The string form the gateway sends the searchers reads back.
            assert_eq!(Filter::parse(&filter.to_string()).unwrap(), filter);
            for payload in &payloads {
                assert_eq!(
                    filter.matches_payload(payload.as_ref()),
                    negated,
                    "{filter}"
                );
            }
            // Over a segment's rows, without reading the field's values.
            let rows = filter.rows_with(5, |field| -> Result<FieldValues, String> {
                Err(format!("read {field}"))
            });
            assert_eq!(rows.unwrap().len(), if negated { 5 } else { 0 });
        }
        // A list with a value in it still needs the value before the "]".
        let error = Filter::parse("lang in [\"en\", ]").unwrap_err();
        assert!(error.to_string().contains("expected a value"), "{error}");
    }

    #[test]
    fn a_json_filter_the_string_form_cannot_spell_reaches_the_searchers_as_json() {
        for filter in [
            json!({"field": "lang", "in": []}),
            json!({"field": "my-field", "value": "a"}),
            json!({"field": "not", "op": "!=", "value": 1}),
            json!({"field": "true", "not_in": [1.5, false]}),
            json!({"field": "note", "value": "line\nbreak\t\u{1}"}),
            json!({"or": []}),
            json!({"and": []}),
            json!({"not": {"and": [{"or": []}, {"field": "é", "value": 2.0}]}}),
        ] {
            let parsed = Filter::from_json(&filter).unwrap();
            let wire = parsed.to_wire();
            assert_eq!(
                Filter::from_wire(&wire).unwrap(),
                parsed,
                "{filter} as {wire}"
            );
            assert_eq!(Filter::from_json(&parsed.to_json()).unwrap(), parsed);
        }
        // A filter the string form spells goes as the string form.
        let plain = Filter::parse(r#"lang = "en" and tag not in ["a", 'b'] and x in []"#).unwrap();
        assert_eq!(plain.to_wire(), plain.to_string());
        // Two filters never share a wire text (a searcher caches rows by it),
        // though some share a string form.
        let (all, none) = (Filter::And(Vec::new()), Filter::Or(Vec::new()));
        assert_eq!(all.to_string(), none.to_string());
        assert_ne!(all.to_wire(), none.to_wire());
        assert!(none.to_wire().starts_with('{'));
    }

    #[test]
    fn an_invalid_filter_s_message_leaves_its_code_to_say_invalid_argument() {
        let error =
            Filter::from_json(&json!({"field": "lang", "op": "~", "value": 1})).unwrap_err();
        assert_eq!(error.kind(), crate::error::IndexErrorKind::InvalidArgument);
        assert_eq!(error.message(), "filter: unknown operator \"~\"");
        assert!(error.to_string().starts_with("invalid argument: "));
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
        // A dotted name: a top-level key of that name, else a path into objects.
        let filter = Filter::parse(r#"meta.lang = "en""#).unwrap();
        assert!(filter.matches_payload(Some(&json!({"meta": {"lang": "en"}}))));
        assert!(filter.matches_payload(Some(&json!({"meta.lang": "en", "meta": {"lang": "de"}}))));
        assert!(!filter.matches_payload(Some(&json!({"meta": {"lang": "de"}}))));
        assert!(!filter.matches_payload(Some(&json!({"meta": ["en"]}))));
        let filter = Filter::parse("price not in [1, 2]").unwrap();
        assert!(filter.matches_payload(Some(&json!({"price": 3}))));
        assert!(filter.matches_payload(None));
        assert!(!filter.matches_payload(Some(&json!({"price": 2}))));
    }

    #[test]
    fn json_objects_that_mix_forms_or_carry_unknown_keys_are_refused_by_name() {
        for (filter, named) in [
            (
                json!({"and": [{"field": "price", "value": 1}], "or": [{"field": "price", "value": 2}]}),
                "\"or\"",
            ),
            (
                json!({"or": [], "not": {"field": "sale", "value": true}}),
                "\"not\"",
            ),
            (
                json!({"and": [], "field": "price", "value": 1}),
                "\"field\"",
            ),
            (
                json!({"field": "color", "value": "red", "colour": "blue"}),
                "colour",
            ),
            (json!({"and": [{"field": "price", "valeu": 1}]}), "valeu"),
            (
                json!({"field": "color", "in": ["a"], "not_in": ["b"]}),
                "not_in",
            ),
            (
                json!({"field": "color", "in": ["a"], "value": "b"}),
                "\"value\"",
            ),
            (json!({"op": "=", "value": 1}), "\"op\""),
            (json!({}), "needs \"and\", \"or\", \"not\" or \"field\""),
            (
                json!({"field": "price", "op": "~", "value": 1}),
                "unknown operator",
            ),
            (json!({"field": "price"}), "needs a \"value\""),
            (json!({"field": "color", "in": "red"}), "in"),
            (json!({"and": {"field": "price", "value": 1}}), "and"),
            (json!(42), "a filter string or a filter object"),
        ] {
            let error = Filter::from_json(&filter).unwrap_err();
            assert!(
                matches!(error, IndexError::InvalidArgument(_)),
                "{filter}: {error:?}"
            );
            let message = error.to_string();
            assert!(message.contains(named), "{filter}: {message}");
        }
    }

    #[test]
    fn json_errors_say_where_in_the_tree_they_are() {
        let error = Filter::from_json(&json!({"and": [
            {"field": "price", "value": 1},
            {"or": [{"field": "color", "value": "red", "extra": true}]}
        ]}))
        .unwrap_err()
        .to_string();
        assert!(error.contains("and[1].or[0]"), "{error}");
        assert!(error.contains("extra"), "{error}");
    }

    #[test]
    fn json_nesting_is_bounded() {
        let mut filter = json!({"field": "price", "value": 1});
        for _ in 0..(MAX_FILTER_DEPTH + 2) {
            filter = json!({"not": filter});
        }
        let error = Filter::from_json(&filter).unwrap_err().to_string();
        assert!(error.contains("deeper"), "{error}");
        let string_leaf = json!({"or": ["price = 1", {"field": "sale", "value": false}]});
        let parsed = Filter::from_json(&string_leaf).unwrap();
        assert_eq!(parsed, Filter::parse("price = 1 or sale = false").unwrap());
    }
}

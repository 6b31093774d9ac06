//! Checking a filter against a collection's payload schema: every literal
//! compared with a declared field of that field's type, the nesting bounded.
//! Fields the schema does not declare are allowed: they are read from the
//! stored payloads (see [`Filter::rows`]).

use super::ast::{CompareOp, Filter, Literal};
use super::{MAX_FILTER_DEPTH, invalid};
use crate::error::IndexResult;
use crate::fields::{FieldKind, FieldSpec};

impl Filter {
    /// Checks every field declared in `schema` is compared with literals of its
    /// type, and the nesting is not deeper than [`MAX_FILTER_DEPTH`]. A field
    /// `schema` does not declare may hold anything, so any literal fits it.
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
                return Ok(());
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
}

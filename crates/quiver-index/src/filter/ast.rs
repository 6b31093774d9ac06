//! The filter expression tree and its string form (`Display` writes what
//! [`Filter::parse`] reads back).

use std::fmt;

use serde_json::Value;

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
    pub(super) fn symbol(self) -> &'static str {
        match self {
            CompareOp::Eq => "=",
            CompareOp::Ne => "!=",
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
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

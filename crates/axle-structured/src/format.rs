//! What a request's output must be, and its translation to llguidance's grammar.
use crate::StructuredError;
use llguidance::api::TopLevelGrammar;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A constraint on a request's whole output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputConstraint {
    /// Any JSON object.
    JsonObject,
    /// JSON valid for a JSON schema.
    JsonSchema {
        /// The schema.
        schema: Value,
    },
    /// Text matching a regular expression (Rust `regex` syntax, whole output).
    Regex {
        /// The pattern.
        pattern: String,
    },
    /// Text of a grammar in llguidance's Lark dialect (`%json {...}` embeds a JSON schema).
    Grammar {
        /// The grammar.
        lark: String,
    },
}

/// The JSON layout every schema compiles to unless it says otherwise (`x-guidance`): one line,
/// with a space after `,` and `:`. No free whitespace, so a small model cannot fill its budget
/// with newlines, and the forced separators come without sampling.
pub(crate) fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with [`json_layout`] added, unless it sets its own.
pub(crate) fn with_layout(schema: &Value) -> Result<Value, StructuredError> {
    match schema {
        Value::Object(m) => {
            let mut m = m.clone();
            m.entry("x-guidance").or_insert_with(json_layout);
            Ok(Value::Object(m))
        }
        Value::Bool(true) => Ok(json!({"x-guidance": json_layout()})),
        _ => Err(StructuredError::Invalid(
            "a JSON schema must be an object".into(),
        )),
    }
}

impl OutputConstraint {
    /// The llguidance grammar.
    pub(crate) fn grammar(&self) -> Result<TopLevelGrammar, StructuredError> {
        Ok(match self {
            OutputConstraint::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(&json!({"type": "object"}))?)
            }
            OutputConstraint::JsonSchema { schema } => {
                TopLevelGrammar::from_json_schema(with_layout(schema)?)
            }
            OutputConstraint::Regex { pattern } => TopLevelGrammar::from_regex(pattern),
            OutputConstraint::Grammar { lark } => TopLevelGrammar::from_lark(lark.clone()),
        })
    }
}

/// `response_format` as the server and the Python package take it: OpenAI's `text`,
/// `json_object` and `json_schema`, and Axle's `regex` and `grammar` (a Lark grammar in
/// llguidance's dialect).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON for a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
    /// Text matching a regular expression.
    Regex {
        /// The pattern.
        regex: String,
    },
    /// Text of a Lark grammar.
    Grammar {
        /// The grammar.
        grammar: String,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name.
    pub name: String,
    /// What it is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The schema (default: any JSON value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// OpenAI's strict mode; Axle always follows the schema exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// The SDK's constraint (None for text).
    pub fn constraint(&self) -> Option<OutputConstraint> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(OutputConstraint::JsonObject),
            ResponseFormat::JsonSchema { json_schema } => Some(OutputConstraint::JsonSchema {
                schema: json_schema
                    .schema
                    .clone()
                    .unwrap_or_else(|| serde_json::json!({})),
            }),
            ResponseFormat::Regex { regex } => Some(OutputConstraint::Regex {
                pattern: regex.clone(),
            }),
            ResponseFormat::Grammar { grammar } => Some(OutputConstraint::Grammar {
                lark: grammar.clone(),
            }),
        }
    }
}

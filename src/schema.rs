//! The contract's JSON Schemas (draft 2020-12), generated from the Rust types (`schemars`), never written by
//! hand: what a frontend or a producer in another language can check messages against and generate its
//! types from.
//!
//! - `output-message.schema.json`: [`OutputMessage`], with the props of every built-in type (a whole
//!   message of a built-in type, not a delta, must match its type's props; a custom type's props are any
//!   object) and the `data` of each lifecycle event ([`StreamStart`] … [`BlockEnd`]).
//! - `outcome.schema.json`: [`Outcome`], how a stream ended (`POST /v1/streams/{id}/end`, snapshots).
//! - `error.schema.json`: the error envelope every HTTP error and every OpenAI-format stream error carries.
//!
//! `agentmux schemas --out docs/schemas` writes them; `tests/schemas.rs` fails when the committed files
//! differ from what this generates, and checks every fixture's messages against them.
//!
//! ```
//! let schemas = agentmux::schema::schemas();
//! let (name, message) = &schemas[0];
//! assert_eq!(name, "output-message.schema.json");
//! assert_eq!(message["title"], "OutputMessage");
//! ```

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value, json};

use crate::adapter::ApiError;
use crate::output::{
    ActionProps, AudioProps, BlockEnd, BlockStart, BuiltinProps, ErrorProps, EventProps, FileProps, ImageProps,
    LifecycleEvent, LoadingProps, MessageEnd, MessageStart, Outcome, OutputMessage, StreamEnd, StreamStart, TextProps,
    ThinkingProps, ToolCallProps, ToolResultProps, VideoProps,
};

/// Every schema, by file name, output message first.
pub fn schemas() -> Vec<(String, Value)> {
    vec![
        ("output-message.schema.json".to_owned(), output_message()),
        ("outcome.schema.json".to_owned(), standalone::<Outcome>("Outcome", |_, schema| schema)),
        ("error.schema.json".to_owned(), error_envelope()),
    ]
}

fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12().into_generator()
}

/// `T`'s schema as a document of its own: `$schema`, its definitions under `$defs`, and `extend` applied.
fn standalone<T: JsonSchema>(title: &str, extend: impl FnOnce(&mut SchemaGenerator, Value) -> Value) -> Value {
    let mut generator = generator();
    let root = generator.root_schema_for::<T>();
    let extended = extend(&mut generator, root.to_value());
    let definitions = generator.take_definitions(true);
    let Value::Object(mut fields) = extended else { return extended };
    // `$schema` and the title first, then the schema, then its definitions.
    let mut root = Map::new();
    root.insert("$schema".into(), fields.remove("$schema").unwrap_or(Value::Null));
    root.insert("title".into(), title.into());
    let mut defs = match fields.remove("$defs") {
        Some(Value::Object(defs)) => defs,
        _ => Map::new(),
    };
    root.extend(fields);
    defs.extend(definitions);
    if !defs.is_empty() {
        root.insert("$defs".into(), Value::Object(defs));
    }
    Value::Object(root)
}

/// A built-in type's name and its props' schema (a reference into `$defs`).
fn builtin<P: BuiltinProps + JsonSchema>(generator: &mut SchemaGenerator) -> (&'static str, Schema) {
    (P::TYPE, generator.subschema_for::<P>())
}

/// A lifecycle event's name and its data's schema.
fn lifecycle<E: LifecycleEvent>(generator: &mut SchemaGenerator) -> (&'static str, Schema) {
    (E::NAME, generator.subschema_for::<E>())
}

/// The built-in types' props, each with its type's name.
fn builtin_props(generator: &mut SchemaGenerator) -> Vec<(&'static str, Schema)> {
    vec![
        builtin::<TextProps>(generator),
        builtin::<ThinkingProps>(generator),
        builtin::<LoadingProps>(generator),
        builtin::<ToolCallProps>(generator),
        builtin::<ToolResultProps>(generator),
        builtin::<ErrorProps>(generator),
        builtin::<ImageProps>(generator),
        builtin::<AudioProps>(generator),
        builtin::<VideoProps>(generator),
        builtin::<FileProps>(generator),
        builtin::<ActionProps>(generator),
        builtin::<EventProps>(generator),
    ]
}

fn output_message() -> Value {
    standalone::<OutputMessage>("OutputMessage", |generator, mut root| {
        // A whole message (not a delta, which carries only part of its props) of a built-in type has that
        // type's props; an `event` the stream adds has its lifecycle data.
        let whole = |kind: &str| json!({"type": {"const": kind}, "delta": {"const": false}});
        let mut rules: Vec<Value> = builtin_props(generator)
            .into_iter()
            .map(|(kind, props)| {
                json!({
                    "if": {"properties": whole(kind), "required": ["type"]},
                    "then": {"properties": {"props": props}},
                })
            })
            .collect();
        let events = [
            lifecycle::<StreamStart>(generator),
            lifecycle::<StreamEnd>(generator),
            lifecycle::<MessageStart>(generator),
            lifecycle::<MessageEnd>(generator),
            lifecycle::<BlockStart>(generator),
            lifecycle::<BlockEnd>(generator),
        ];
        for (name, data) in events {
            let mut condition = whole(EventProps::TYPE);
            condition["props"] = json!({"properties": {"event": {"const": name}}, "required": ["event"]});
            rules.push(json!({
                "if": {"properties": condition, "required": ["type", "props"]},
                "then": {"properties": {"props": {"properties": {"data": data}, "required": ["data"]}}},
            }));
        }
        if let Value::Object(root) = &mut root {
            root.insert("allOf".into(), Value::Array(rules));
        }
        root
    })
}

fn error_envelope() -> Value {
    standalone::<ApiError>("ErrorEnvelope", |_, error| {
        let mut envelope = json!({
            "$schema": error.get("$schema").cloned().unwrap_or(Value::Null),
            "description": "Every HTTP error's body, and an OpenAI-format stream's error event.",
            "type": "object",
            "properties": {"error": {"$ref": "#/$defs/ApiError"}},
            "required": ["error"],
        });
        let mut error = error;
        if let Value::Object(error) = &mut error {
            error.remove("$schema");
        }
        envelope["$defs"] = json!({"ApiError": error});
        envelope
    })
}

/// The schemas' text as committed: pretty JSON and a newline.
pub fn render(schema: &Value) -> String {
    let mut text = serde_json::to_string_pretty(schema).unwrap_or_default();
    text.push('\n');
    text
}

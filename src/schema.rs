//! The contract's JSON Schemas (draft 2020-12), generated from the Rust types (`schemars`), never written by
//! hand: what a frontend or a producer in another language checks messages against and generates its types
//! from, and the components of the OpenAPI document (`http/api/openapi.rs`).
//!
//! - `output-message.schema.json`: [`OutputMessage`], with the props of every built-in type (a whole
//!   message of a built-in type, not a delta, must match its type's props; a custom type's props are any
//!   object) and the `data` of each lifecycle event ([`StreamStart`] … [`BlockEnd`]).
//! - `outcome.schema.json`: [`Outcome`], how a stream ended (`POST /v1/streams/{id}/end`, snapshots).
//! - `error.schema.json`: the error envelope every HTTP error and every OpenAI-format stream error carries.
//!
//! `agentmux schemas --out docs/schemas` writes them; `tests/schemas.rs` fails when the committed files
//! differ from what this generates, and checks fixtures, a live stream and real errors against them.
//!
//! ```
//! let schemas = agentmux::schema::schemas();
//! let (name, message) = &schemas[0];
//! assert_eq!(name, "output-message.schema.json");
//! assert_eq!(message["$ref"], "#/$defs/OutputMessage");
//! ```

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value, json};

use crate::adapter::Envelope;
use crate::output::{
    ActionProps, AudioProps, BlockEnd, BlockStart, BuiltinProps, ErrorProps, EventProps, FileProps, ImageProps,
    LifecycleEvent, LoadingProps, MessageEnd, MessageStart, Outcome, OutputMessage, StreamEnd, StreamStart, TextProps,
    ThinkingProps, ToolCallProps, ToolResultProps, VideoProps,
};

/// Every schema file, by name, output message first.
pub fn schemas() -> Vec<(String, Value)> {
    vec![
        ("output-message.schema.json".to_owned(), document("OutputMessage", message)),
        ("outcome.schema.json".to_owned(), document("Outcome", |g| g.subschema_for::<Outcome>())),
        ("error.schema.json".to_owned(), document("ErrorEnvelope", error)),
    ]
}

/// The schemas' text as committed: pretty JSON and a newline.
pub fn render(schema: &Value) -> String {
    let mut text = serde_json::to_string_pretty(schema).unwrap_or_default();
    text.push('\n');
    text
}

/// A generator whose definitions are referred to under `path` (`/$defs`, `/components/schemas`).
pub(crate) fn generator(path: &'static str) -> SchemaGenerator {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = path.into();
    settings.into_generator()
}

/// A schema document of its own: `$schema`, a title, a reference to what `define` defines, and the
/// definitions it needed.
fn document(title: &str, define: impl FnOnce(&mut SchemaGenerator) -> Schema) -> Value {
    let mut generator = generator("/$defs");
    let reference = define(&mut generator);
    let mut root = Map::new();
    root.insert("$schema".into(), "https://json-schema.org/draft/2020-12/schema".into());
    root.insert("title".into(), title.into());
    if let Value::Object(reference) = reference.to_value() {
        root.extend(reference);
    }
    root.insert("$defs".into(), Value::Object(generator.take_definitions(true)));
    Value::Object(root)
}

/// A built-in type's name and its props' schema (a reference into the definitions).
fn builtin<P: BuiltinProps + JsonSchema>(generator: &mut SchemaGenerator) -> (&'static str, Schema) {
    (P::TYPE, generator.subschema_for::<P>())
}

/// A lifecycle event's name and its data's schema.
fn lifecycle<E: LifecycleEvent>(generator: &mut SchemaGenerator) -> (&'static str, Schema) {
    (E::NAME, generator.subschema_for::<E>())
}

/// Defines [`OutputMessage`] in `generator`, with its rules: a whole message (not a delta, which carries
/// only part of its props) of a built-in type has that type's props, and an `event` the stream adds has its
/// lifecycle data. Returns the reference to it.
pub(crate) fn message(generator: &mut SchemaGenerator) -> Schema {
    let reference = generator.subschema_for::<OutputMessage>();
    let props = [
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
    ];
    let events = [
        lifecycle::<StreamStart>(generator),
        lifecycle::<StreamEnd>(generator),
        lifecycle::<MessageStart>(generator),
        lifecycle::<MessageEnd>(generator),
        lifecycle::<BlockStart>(generator),
        lifecycle::<BlockEnd>(generator),
    ];
    let whole = |kind: &str| json!({"type": {"const": kind}, "delta": {"const": false}});
    let mut rules: Vec<Value> = props
        .into_iter()
        .map(|(kind, props)| {
            json!({"if": {"properties": whole(kind), "required": ["type"]}, "then": {"properties": {"props": props}}})
        })
        .collect();
    for (name, data) in events {
        let mut condition = whole(EventProps::TYPE);
        condition["props"] = json!({"properties": {"event": {"const": name}}, "required": ["event"]});
        rules.push(json!({
            "if": {"properties": condition, "required": ["type", "props"]},
            "then": {"properties": {"props": {"properties": {"data": data}, "required": ["data"]}}},
        }));
    }
    if let Some(Value::Object(definition)) = generator.definitions_mut().get_mut(OutputMessage::schema_name().as_ref())
    {
        definition.insert("allOf".into(), Value::Array(rules));
    }
    reference
}

/// Defines the error envelope in `generator`; returns the reference to it.
pub(crate) fn error(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<Envelope<'static>>()
}

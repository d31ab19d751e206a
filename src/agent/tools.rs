//! Tools (`docs/design.md`, "Text-mode tools"): what a model may call, each with a JSON Schema for its arguments.
//!
//! - [`Tool`]: a tool the service runs itself, registered in Rust: a name, a description, the schema of its
//!   arguments and an async function. [`Tools`] holds them by name.
//! - [`ToolSet`] (crate-private): the tools of one run: the registered ones, and those the request declares
//!   (`tools`, OpenAI's shape), which the client runs. It says who runs a call, checks a call's arguments
//!   against the schema (compiled once, with a well-kept JSON Schema crate), and lists every tool for the
//!   upstream.
//!
//! A call's arguments are checked when the call is complete: JSON text that parses to an object the schema
//! accepts. An unknown tool is `tool_not_found`; arguments that do not parse or do not fit the schema are
//! `invalid_args`, with the path of the first fault (`/city`).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::Refusal;
use crate::output::ToolError;

type Run = Arc<dyn Fn(Value) -> BoxFuture<'static, Result<Value, ToolError>> + Send + Sync>;

/// A tool the service runs itself.
///
/// ```
/// use agentmux::agent::Tool;
/// use serde_json::json;
///
/// let weather = Tool::new(
///     "get_weather",
///     "The weather in a city now.",
///     json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
///     |args| async move { Ok(json!({"city": args["city"], "temp_c": 18})) },
/// )
/// .unwrap();
/// assert_eq!(weather.name(), "get_weather");
/// ```
#[derive(Clone)]
pub struct Tool {
    name: String,
    description: String,
    parameters: Value,
    schema: Arc<jsonschema::Validator>,
    run: Run,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A schema that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the schema of the tool {tool:?} is not a valid JSON Schema: {reason}")]
pub struct SchemaError {
    /// The tool.
    pub tool: String,
    /// Why.
    pub reason: String,
}

impl Tool {
    /// A tool `name` that `run` answers, with arguments that `parameters` (a JSON Schema) describes.
    pub fn new<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        run: F,
    ) -> Result<Tool, SchemaError>
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        let name = name.into();
        let schema = compile(&name, &parameters)?;
        let run: Run = Arc::new(move |args| Box::pin(run(args)));
        Ok(Tool { name, description: description.into(), parameters, schema: Arc::new(schema), run })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs it with `args` (already checked against its schema).
    pub(crate) fn call(&self, args: Value) -> BoxFuture<'static, Result<Value, ToolError>> {
        (self.run)(args)
    }
}

fn compile(name: &str, parameters: &Value) -> Result<jsonschema::Validator, SchemaError> {
    jsonschema::validator_for(parameters).map_err(|e| SchemaError { tool: name.to_owned(), reason: e.to_string() })
}

/// The tools the service runs itself, by name.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    tools: BTreeMap<String, Tool>,
}

impl Tools {
    /// No tools.
    pub fn new() -> Self {
        Tools::default()
    }

    /// Adds (or replaces) a tool.
    pub fn register(&mut self, tool: Tool) -> &mut Self {
        self.tools.insert(tool.name.clone(), tool);
        self
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

/// A tool the request declares: the client runs it.
#[derive(Debug, Clone)]
pub(crate) struct Declared {
    name: String,
    schema: Option<Arc<jsonschema::Validator>>,
    declaration: Value,
}

/// Who runs a call.
#[derive(Debug, Clone)]
pub(crate) enum Runner<'a> {
    /// The agent, with this tool.
    Agent(&'a Tool),
    /// The client that declared it.
    Client,
}

/// The tools of one run: the registered ones and the request's.
#[derive(Debug, Clone, Default)]
pub(crate) struct ToolSet {
    server: Arc<Tools>,
    declared: Vec<Declared>,
}

impl ToolSet {
    /// The registered tools and those the request's `tools` option declares. A declaration that is not
    /// OpenAI's function shape, has a schema that is not one, or takes a registered tool's name is refused,
    /// naming the field.
    pub(crate) fn new(server: Arc<Tools>, tools: Option<&Value>) -> Result<ToolSet, Refusal> {
        let refuse = |param: String, message: String| Refusal { message, param: Some(param) };
        let mut declared: Vec<Declared> = Vec::new();
        let list = match tools {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(list)) => list.as_slice(),
            Some(_) => return Err(refuse("tools".into(), "tools must be an array".into())),
        };
        for (i, tool) in list.iter().enumerate() {
            let at = |field: &str| format!("tools[{i}]{field}");
            let function = tool.get("function").filter(|f| f.is_object()).ok_or_else(|| {
                refuse(at(".function"), "a tool is {\"type\": \"function\", \"function\": {\"name\", ...}}".into())
            })?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| refuse(at(".function.name"), "a tool needs a name".into()))?;
            crate::output::check_name(&at(".function.name"), name)
                .map_err(|e| refuse(at(".function.name"), e.to_string()))?;
            if server.get(name).is_some() {
                return Err(refuse(at(".function.name"), format!("{name:?} is a tool the service runs itself")));
            }
            if declared.iter().any(|d| d.name == name) {
                return Err(refuse(at(".function.name"), format!("{name:?} is declared twice")));
            }
            let schema = match function.get("parameters") {
                None | Some(Value::Null) => None,
                Some(parameters) => Some(Arc::new(
                    compile(name, parameters).map_err(|e| refuse(at(".function.parameters"), e.to_string()))?,
                )),
            };
            declared.push(Declared { name: name.to_owned(), schema, declaration: tool.clone() });
        }
        Ok(ToolSet { server, declared })
    }

    /// Who runs `name`, or `None` when no tool has that name.
    pub(crate) fn runner(&self, name: &str) -> Option<Runner<'_>> {
        if let Some(tool) = self.server.get(name) {
            return Some(Runner::Agent(tool));
        }
        self.declared.iter().any(|d| d.name == name).then_some(Runner::Client)
    }

    /// True when the run has no tools at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.server.is_empty() && self.declared.is_empty()
    }

    /// Checks a complete call: the tool exists and `arguments` (JSON text) is an object its schema accepts.
    /// Returns the parsed arguments, or the tool result's error: `tool_not_found` or `invalid_args`.
    pub(crate) fn check(&self, name: &str, arguments: &str) -> Result<Value, ToolError> {
        let invalid = |message: String| ToolError { message, code: Some("invalid_args".into()) };
        let schema = match (self.server.get(name), self.declared.iter().find(|d| d.name == name)) {
            (Some(tool), _) => Some(&*tool.schema),
            (None, Some(declared)) => declared.schema.as_deref(),
            (None, None) => {
                return Err(ToolError {
                    message: format!("there is no tool {name:?}"),
                    code: Some("tool_not_found".into()),
                });
            }
        };
        let args: Value = if arguments.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            serde_json::from_str(arguments)
                .map_err(|e| invalid(format!("the arguments of {name} are not JSON: {e}")))?
        };
        if !args.is_object() {
            return Err(invalid(format!("the arguments of {name} must be a JSON object")));
        }
        if let Some(schema) = schema
            && let Err(error) = schema.validate(&args)
        {
            let path = error.instance_path().to_string();
            let at = if path.is_empty() { "the arguments".to_owned() } else { format!("at {path}") };
            return Err(invalid(format!("invalid arguments for {name}, {at}: {error}")));
        }
        Ok(args)
    }

    /// Every tool, as the upstream's `tools`: the request's as declared, then the registered ones.
    pub(crate) fn declarations(&self) -> Vec<Value> {
        let declared = self.declared.iter().map(|d| d.declaration.clone());
        let server = self.server.tools.values().map(|tool| {
            json!({"type": "function", "function": {
                "name": tool.name, "description": tool.description, "parameters": tool.parameters,
            }})
        });
        declared.chain(server).collect()
    }

    /// Every tool by name, description and parameters: what a text-mode prompt lists.
    pub(crate) fn describe(&self) -> Vec<(String, String, Value)> {
        self.declarations()
            .iter()
            .filter_map(|d| d.get("function"))
            .map(|f| {
                let text = |key: &str| f.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
                (text("name"), text("description"), f.get("parameters").cloned().unwrap_or(json!({})))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> ToolSet {
        let mut tools = Tools::new();
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        tools.register(Tool::new("weather", "w", schema, |_| async { Ok(json!(1)) }).unwrap());
        let declared = json!([{"type": "function", "function": {"name": "ls", "parameters":
            {"type": "object", "properties": {"path": {"type": "string"}}, "additionalProperties": false}}}]);
        ToolSet::new(Arc::new(tools), Some(&declared)).unwrap()
    }

    #[test]
    fn calls_are_checked_against_their_schema() {
        let tools = set();
        assert!(matches!(tools.runner("weather"), Some(Runner::Agent(_))));
        assert!(matches!(tools.runner("ls"), Some(Runner::Client)));
        assert!(tools.runner("rm").is_none());
        assert_eq!(tools.check("weather", r#"{"city": "Paris"}"#).unwrap(), json!({"city": "Paris"}));
        assert_eq!(tools.check("ls", "").unwrap(), json!({}));
        let code = |r: Result<Value, ToolError>| r.unwrap_err().code.unwrap();
        assert_eq!(code(tools.check("rm", "{}")), "tool_not_found");
        assert_eq!(code(tools.check("weather", "{}")), "invalid_args");
        assert_eq!(code(tools.check("weather", "{\"city\": ")), "invalid_args");
        assert_eq!(code(tools.check("weather", "[1]")), "invalid_args");
        let error = tools.check("weather", r#"{"city": 3}"#).unwrap_err();
        assert!(error.message.contains("at /city"), "{}", error.message);
        let error = tools.check("ls", r#"{"path": "/", "rm": true}"#).unwrap_err();
        assert_eq!(error.code.as_deref(), Some("invalid_args"), "{}", error.message);
        assert_eq!(tools.declarations().len(), 2);
    }

    #[test]
    fn bad_declarations_are_refused_by_field() {
        let server = Arc::new(Tools::new());
        let param = |tools: Value| ToolSet::new(Arc::clone(&server), Some(&tools)).unwrap_err().param.unwrap();
        assert_eq!(param(json!({})), "tools");
        assert_eq!(param(json!([{"type": "function"}])), "tools[0].function");
        assert_eq!(param(json!([{"function": {"name": ""}}])), "tools[0].function.name");
        assert_eq!(
            param(json!([{"function": {"name": "a", "parameters": {"type": "nonsense"}}}])),
            "tools[0].function.parameters"
        );
        assert_eq!(param(json!([{"function": {"name": "a"}}, {"function": {"name": "a"}}])), "tools[1].function.name");
    }
}

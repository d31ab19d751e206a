//! [`UpstreamAgent`]: a model behind any OpenAI-compatible server (a hosted API, vLLM, Ollama, llama.cpp's
//! `llama-server`, a gateway) or Anthropic's Messages API, streamed into typed messages, with the tool loop
//! (`docs/design.md`, "The tool loop").
//!
//! - `dialect.rs`: the seam between the loop and the API an upstream speaks ([`UpstreamKind`]): the request's
//!   path, credentials and body, the model list, the error body, and the answer's events as the deltas the
//!   loop reads; `openai.rs` (with `request.rs`, the body) is OpenAI's chat completions, `anthropic/` the
//!   Messages API;
//! - `chunks.rs`: the SSE answer as its dialect's deltas, within the first-byte and idle timeouts;
//! - `model_call.rs`: one model call as typed messages (text, thinking, tool calls; text mode through the reply
//!   scanner);
//! - `client.rs`: the HTTP client: rustls with the bundled, the system's and a private CA's roots, the proxy
//!   environment;
//! - `dial.rs`: which step of reaching the upstream failed (DNS, connect, TLS, timeout);
//! - `error.rs`: upstream failures as the status and error a client gets, the key scrubbed.
//!
//! The loop: each round is a block. The model answers; a call to a tool nobody has, or with arguments its
//! schema refuses, is an `error` message (`tool_not_found`, `invalid_args`) that ends the run, and no tool
//! runs. The calls to tools the service runs go concurrently, each within the tool timeout, and each result
//! is a `tool_result`; they join the conversation and the model is asked again. Calls to tools the client
//! declared end the run as OpenAI does (`finish_reason: "tool_calls"`): the client runs them and sends the
//! results in its next request. A model that still calls tools after the last round ends the run with
//! `max_tool_rounds`. A cancel drops the upstream request at once (its connection closes). An upstream that
//! fails before the run has said anything gives the client its status (see `error.rs`); after, the failure
//! is an `error` message, and the run ends with it.

mod anthropic;
mod chunks;
mod client;
mod dial;
mod dialect;
mod error;
mod model_call;
mod openai;
mod request;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::FutureExt;
use serde_json::Value;

use self::dialect::Dialect;
use self::error::UpstreamError;
use self::model_call::{Call, Halt};
use super::{Agent, AgentError, Output, Refusal, Runner, ToolSet, Tools};
use crate::conversation::{ChatMessage, Conversation, ToolCall};
use crate::hub::Limits;
use crate::output::{FinishReason, Outcome, ToolError, Usage};

/// Which API an upstream speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamKind {
    /// OpenAI's chat completions (`POST {base}/chat/completions`, `GET {base}/models`, a bearer key): OpenAI
    /// and every server compatible with it.
    #[default]
    OpenAiChat,
    /// Anthropic's Messages API (`POST {base}/messages`, `x-api-key` and `anthropic-version` headers).
    Anthropic,
}

/// Where the upstream is and how long to wait for it.
#[derive(Clone)]
pub struct UpstreamConfig {
    /// Which API it speaks.
    pub kind: UpstreamKind,
    /// The base URL, ending in `/v1` (`http://127.0.0.1:8081/v1`).
    pub base_url: String,
    /// The API key, sent as the kind takes it (`Authorization: Bearer`, Anthropic's `x-api-key`); never logged,
    /// never in an error.
    pub key: Option<String>,
    /// Headers sent with every request to it (an organization, a project, a gateway's routing header).
    pub headers: Vec<(String, String)>,
    /// The models it serves; `None`: read from its `GET /models` (see [`UpstreamAgent::refresh_models`]).
    pub models: Option<Vec<String>>,
    /// The models that have no native tool calling: they get text-mode instructions instead (`docs/design.md`, "Text-mode tools").
    pub text_mode: Vec<String>,
    /// A private CA the upstream's certificate may chain to (PEM, one or more certificates), trusted beside
    /// the bundled web PKI roots and the system's (`--upstream-ca-file`).
    pub ca_pem: Option<Vec<u8>>,
    /// How long connecting may take (10 s).
    pub connect_timeout: Duration,
    /// How long the first byte of an answer may take, from the request (60 s).
    pub first_byte_timeout: Duration,
    /// How long the answer may pause between chunks (60 s).
    pub idle_timeout: Duration,
    /// How many times the model is asked within one run (25).
    pub max_rounds: usize,
    /// How long one tool may run (60 s).
    pub tool_timeout: Duration,
}

impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("key", &self.key.as_ref().map(|_| "***"))
            .field("models", &self.models)
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

impl UpstreamConfig {
    /// An upstream at `base_url` with the default timeouts and limits.
    pub fn new(base_url: impl Into<String>) -> Self {
        UpstreamConfig {
            kind: UpstreamKind::default(),
            base_url: base_url.into(),
            key: None,
            headers: Vec::new(),
            models: None,
            text_mode: Vec::new(),
            ca_pem: None,
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            max_rounds: 25,
            tool_timeout: Duration::from_secs(60),
        }
    }
}

/// The agent for the models of an upstream.
///
/// ```
/// use agentmux::agent::{Agents, UpstreamAgent, UpstreamConfig};
///
/// let mut config = UpstreamConfig::new("http://127.0.0.1:8081/v1");
/// config.models = Some(vec!["qwen".into()]);
/// let mut agents = Agents::builtin();
/// agents.set_upstream(UpstreamAgent::new(config, Default::default()).unwrap());
/// assert!(agents.names().contains(&"qwen".to_owned()));
/// ```
#[derive(Clone, Debug)]
pub struct UpstreamAgent {
    config: Arc<UpstreamConfig>,
    dialect: Arc<dyn Dialect>,
    client: reqwest::Client,
    /// The model calls' URL, parsed once rather than on every call (on the first token's path); `None` when
    /// the base URL does not parse, so each call fails as reqwest says why.
    call_url: Option<reqwest::Url>,
    tools: Arc<Tools>,
    models: Arc<RwLock<Vec<String>>>,
}

impl UpstreamAgent {
    /// An agent for `config`'s upstream, running `tools` itself; a CA that is not PEM certificates is an error.
    pub fn new(config: UpstreamConfig, tools: Tools) -> Result<Self, String> {
        let client = client::http_client(config.connect_timeout, config.ca_pem.as_deref())?;
        let models = config.models.clone().unwrap_or_default();
        let dialect: Arc<dyn Dialect> = match config.kind {
            UpstreamKind::OpenAiChat => Arc::new(openai::OpenAiChat),
            UpstreamKind::Anthropic => Arc::new(anthropic::Anthropic),
        };
        let call_url = reqwest::Url::parse(&url(&config.base_url, dialect.call_path())).ok();
        Ok(UpstreamAgent {
            dialect,
            config: Arc::new(config),
            client,
            call_url,
            tools: Arc::new(tools),
            models: Arc::new(RwLock::new(models)),
        })
    }

    /// Its base URL, as configured.
    pub fn base_url(&self) -> &str {
        &self.config.base_url
    }

    /// The models it serves, as last known.
    pub fn models(&self) -> Vec<String> {
        self.models.read().map(|m| m.clone()).unwrap_or_default()
    }

    /// Reads the upstream's model list (`GET /models`, each dialect's) into the list it serves, unless the configuration fixed the list.
    pub async fn refresh_models(&self) -> Result<usize, String> {
        if self.config.models.is_some() {
            return Ok(self.models().len());
        }
        let key = self.config.key.as_deref();
        let fail = |e: UpstreamError| e.into_agent_error(key).message;
        let request = self.client.get(self.url(self.dialect.models_path())).timeout(self.config.first_byte_timeout);
        let mut request = self.dialect.authorize(request, key);
        for (name, value) in &self.config.headers {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(|e| fail(self.dial_error(&e)))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| fail(UpstreamError::Connect(e.to_string())))?;
        if !(200..300).contains(&status) {
            let (message, code) = self.dialect.describe_error(&body);
            return Err(fail(UpstreamError::Status { status, message, code, retry_after: None }));
        }
        let list: Value = serde_json::from_slice(&body).map_err(|e| fail(UpstreamError::Protocol(e.to_string())))?;
        let mut names: Vec<String> =
            list["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect();
        names.sort();
        names.dedup();
        let count = names.len();
        if let Ok(mut models) = self.models.write() {
            *models = names;
        }
        Ok(count)
    }

    /// What a request that got no answer ends with; logged with the upstream's host (never its URL's query
    /// nor the key).
    fn dial_error(&self, error: &reqwest::Error) -> UpstreamError {
        let failure = dial::dial_error(error, self.config.connect_timeout);
        let host = url::Url::parse(&self.config.base_url).ok().and_then(|u| u.host_str().map(str::to_owned));
        let (code, reason) = match &failure {
            UpstreamError::Dial { step, why } => (step.code(), why.clone()),
            UpstreamError::Timeout { .. } => ("upstream_timeout", "the connect timeout".to_owned()),
            _ => ("upstream_unavailable", dial::without_url(error)),
        };
        let reason = match self.config.key.as_deref().filter(|k| !k.is_empty()) {
            Some(key) => reason.replace(key, "***"),
            None => reason,
        };
        tracing::warn!(host = host.as_deref().unwrap_or("?"), code, reason, "the upstream could not be reached");
        failure
    }

    fn url(&self, path: &str) -> String {
        url(&self.config.base_url, path)
    }

    /// Sends one request; the answer's status is checked, its body is left to read.
    async fn send(&self, body: &Value) -> Result<reqwest::Response, UpstreamError> {
        let request = match &self.call_url {
            Some(url) => self.client.post(url.clone()),
            None => self.client.post(self.url(self.dialect.call_path())),
        };
        let request = request.json(body);
        let mut request = self.dialect.authorize(request, self.config.key.as_deref());
        for (name, value) in &self.config.headers {
            request = request.header(name, value);
        }
        let after = self.config.first_byte_timeout;
        let response = match tokio::time::timeout(after, request.send()).await {
            Err(_) => return Err(UpstreamError::Timeout { what: "first-byte", after }),
            Ok(Err(error)) => return Err(self.dial_error(&error)),
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = tokio::time::timeout(after, response.bytes()).await.ok().and_then(Result::ok).unwrap_or_default();
        let (message, code) = self.dialect.describe_error(&body);
        Err(UpstreamError::Status { status, message, code, retry_after })
    }

    /// Runs the server-side `calls` at once, each within the tool timeout; emits each result and returns them
    /// as tool messages, in the calls' order.
    async fn run_tools(&self, tools: &ToolSet, calls: Vec<(Call, Value)>, out: &Output) -> Vec<ChatMessage> {
        let timeout = self.config.tool_timeout;
        let runs = calls.into_iter().map(|(call, args)| {
            let future = match tools.runner(&call.name) {
                Some(Runner::Agent(tool)) => Some(tool.call(args)),
                _ => None,
            };
            async move {
                let result = match future {
                    None => Err(ToolError { message: "not a tool the service runs".into(), code: None }),
                    Some(future) => {
                        match tokio::time::timeout(timeout, AssertUnwindSafe(future).catch_unwind()).await {
                            Err(_) => Err(ToolError {
                                message: format!("{} did not answer within {timeout:?}", call.name),
                                code: Some("timeout".into()),
                            }),
                            Ok(Err(_)) => Err(ToolError {
                                message: format!("{} panicked", call.name),
                                code: Some("tool_panicked".into()),
                            }),
                            Ok(Ok(result)) => result,
                        }
                    }
                };
                (call, result)
            }
        });
        let mut messages = Vec::new();
        for (call, result) in futures::future::join_all(runs).await {
            let content = match &result {
                Ok(Value::String(text)) => text.clone(),
                Ok(value) => value.to_string(),
                Err(error) => format!("Error: {}", error.message),
            };
            // The stream may have ended (a cancel): the loop notices next.
            let _ = match result {
                Ok(value) => out.tool_result(&call.id, &call.name, value),
                Err(error) => out.tool_failure(&call.id, &call.name, error),
            };
            messages.push(ChatMessage::tool_result(call.id, call.name, content));
        }
        messages
    }
}

/// The URL of `path` under `base_url`.
fn url(base_url: &str, path: &str) -> String {
    format!("{}/{path}", base_url.trim_end_matches('/'))
}

fn finish_reason(reason: Option<&str>) -> Option<FinishReason> {
    match reason? {
        "length" => Some(FinishReason::Length),
        "content_filter" => Some(FinishReason::ContentFilter),
        _ => None,
    }
}

fn add(total: Option<Usage>, more: Option<Usage>) -> Option<Usage> {
    match (total, more) {
        (Some(a), Some(b)) => Some(a.plus(b)),
        (a, b) => a.or(b),
    }
}

impl Agent for UpstreamAgent {
    fn check(&self, conversation: &Conversation, _limits: &Limits) -> Result<(), Refusal> {
        if conversation.option("n").and_then(Value::as_u64).is_some_and(|n| n != 1) {
            return Err(Refusal {
                message: "agentmux streams one choice: n must be 1".into(),
                param: Some("n".into()),
            });
        }
        ToolSet::new(Arc::clone(&self.tools), conversation.option("tools")).map(drop)
    }

    async fn run(&self, conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        let key = self.config.key.as_deref();
        let tools = ToolSet::new(Arc::clone(&self.tools), conversation.option("tools"))
            .map_err(|r| AgentError::new(r.message).with_code("invalid_tools").with_status(400))?;
        let text_mode = self.config.text_mode.iter().any(|m| m == conversation.model());
        let mut messages: Vec<ChatMessage> = conversation.messages().clone().into_vec();
        let mut usage = None;
        let mut ids = 0;
        for _round in 0..self.config.max_rounds.max(1) {
            let step = output.begin_block();
            let body = self.dialect.body(&conversation, &messages, &tools, text_mode);
            let halt = |halt: Halt| match halt {
                Halt::Cancelled => Ok(Outcome::cancelled()),
                Halt::Upstream(error) => {
                    let error = error.into_agent_error(key);
                    // Once the client has something, the failure is an `error` message in the stream;
                    // before, it is the status the client gets (see `AgentError::status`).
                    if output.stream().log().last_sequence() > 1 {
                        let code = error.code.as_deref().unwrap_or("upstream_error");
                        return Err(model_call::fail(&step, error.message.clone(), code).map_or(error, |e| e));
                    }
                    Err(error)
                }
                Halt::Agent(error) => Err(error),
            };
            let response = tokio::select! {
                biased;
                () = output.cancelled() => return Ok(Outcome::cancelled()),
                response = self.send(&body) => response,
            };
            let chunks = match response {
                Ok(response) => {
                    let (first_byte, idle) = (self.config.first_byte_timeout, self.config.idle_timeout);
                    chunks::Chunks::new(response, self.dialect.decoder(), first_byte, idle)
                }
                Err(error) => return halt(Halt::Upstream(error)),
            };
            let said = match model_call::read(chunks, &step, &tools, text_mode, &mut ids).await {
                Ok(said) => said,
                Err(stop) => return halt(stop),
            };
            usage = add(usage, said.usage);
            let calls: Vec<ToolCall> = said
                .tool_calls
                .iter()
                .map(|c| {
                    let mut call = ToolCall::new(&c.id, &c.name, &Value::Null);
                    call.function.arguments.clone_from(&c.arguments);
                    call
                })
                .collect();
            let mut said_message = ChatMessage::ai(said.text, calls);
            // Thinking the provider wants back (Anthropic's signed blocks) goes with the next request.
            for block in said.thinking {
                said_message.push_part(block);
            }
            messages.push(said_message);
            if said.tool_calls.is_empty() {
                step.end_block()?;
                let reason = finish_reason(said.finish_reason.as_deref());
                let outcome = Outcome { finish_reason: reason, usage, ..Outcome::completed() };
                return Ok(outcome);
            }
            let mut server = Vec::new();
            let mut handed_over = false;
            for call in said.tool_calls {
                let args = match tools.check(&call.name, &call.arguments) {
                    Ok(args) => args,
                    Err(error) => {
                        let code = error.code.clone().unwrap_or_else(|| "invalid_args".into());
                        return match model_call::fail(&step, error.message, &code) {
                            Ok(error) | Err(Halt::Agent(error)) => Err(error),
                            Err(other) => halt(other),
                        };
                    }
                };
                match tools.runner(&call.name) {
                    Some(Runner::Agent(_)) => server.push((call, args)),
                    _ => handed_over = true,
                }
            }
            messages.extend(self.run_tools(&tools, server, &step).await);
            step.end_block()?;
            if output.is_cancelled() {
                return Ok(Outcome::cancelled());
            }
            if handed_over {
                let outcome = Outcome { finish_reason: Some(FinishReason::ToolCalls), usage, ..Outcome::completed() };
                return Ok(outcome);
            }
        }
        let rounds = self.config.max_rounds;
        Err(AgentError::new(format!("the model still called tools after {rounds} rounds")).with_code("max_tool_rounds"))
    }
}

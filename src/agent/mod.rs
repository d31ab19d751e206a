//! Agents: the code that produces a stream, and the [`Output`] handle it emits through.
//!
//! - [`Agent`] (this file): `async fn run(&self, conversation, output) -> Result<Outcome, AgentError>`. Write it
//!   as a plain `async fn` in your impl; the registry boxes it.
//! - [`Output`] (`output.rs`): one method per built-in type, `send` for anything else, handles for messages
//!   that stream in deltas, blocks, sub-agent threads, and the cancellation signal.
//! - [`Agents`] (`registry.rs`): model names to agents; [`run`] (`run.rs`) starts an agent on a new stream.
//! - The catalogue (`catalogue/`): the upstreams (one unnamed, any number named) and the aliases behind the
//!   names no registered agent has: routing by `NAME/model` and alias, fallbacks, cooldowns.
//! - Built-in agents (`builtin/`): `demo`, `echo`, and `replay/<fixture>`.
//! - [`UpstreamAgent`] (`upstream/`): any OpenAI-compatible model server, streamed into typed messages,
//!   with the tool loop.
//! - [`Tool`] and [`Tools`] (`tools.rs`): tools with JSON Schemas, run by the agent or handed to the client.
//! - The text-mode reply parser (`reply/`): for models without native tool calling, whether a reply is
//!   text, tool calls, the model's error, or a malformed attempt; whole or as it streams.

mod builtin;
#[cfg(feature = "upstream")]
mod catalogue;
mod output;
mod registry;
mod reply;
mod run;
mod tools;
#[cfg(feature = "upstream")]
mod upstream;

use std::future::Future;

use crate::conversation::Conversation;
use crate::hub::{AppendError, Limits};
use crate::output::{ErrorProps, Outcome};

pub use builtin::{DemoAgent, EchoAgent, ReplayAgent};
pub use output::{Output, StreamingMessage};
pub use registry::{Agents, StartError};
pub use run::run;
pub(crate) use tools::{Runner, ToolSet};
pub use tools::{SchemaError, Tool, Tools};
#[cfg(feature = "upstream")]
pub use upstream::{UpstreamAgent, UpstreamConfig, UpstreamKind};

/// Something that answers a conversation by emitting messages.
///
/// It receives the conversation validated (see [`Conversation`]): for a thread, the stored history and the
/// new input; otherwise what the client sent.
///
/// ```
/// use agentmux::agent::{Agent, AgentError, Output};
/// use agentmux::conversation::Conversation;
/// use agentmux::output::Outcome;
///
/// struct Shout;
///
/// impl Agent for Shout {
///     async fn run(&self, conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
///         let text = conversation.last_user_text().unwrap_or_default().to_uppercase();
///         output.text(text)?;
///         Ok(Outcome::completed())
///     }
/// }
/// ```
pub trait Agent: Send + Sync + 'static {
    /// Emits the answer to `conversation` through `output`. Return how the run ended; an error ends the stream
    /// with status `error`. Watch [`Output::cancelled`] to stop early when someone cancels.
    fn run(
        &self,
        conversation: Conversation,
        output: Output,
    ) -> impl Future<Output = Result<Outcome, AgentError>> + Send;

    /// Checks `conversation` before a stream is made for it, against the limits a stream keeps: a request the
    /// agent could not answer within them is the client's fault, refused (HTTP 400, `param` naming the
    /// field) before anything starts. Every request is taken by default.
    fn check(&self, conversation: &Conversation, limits: &Limits) -> Result<(), Refusal> {
        let _ = (conversation, limits);
        Ok(())
    }
}

/// A request an agent will not take: why, and which field (`messages[0].content`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// For a person.
    pub message: String,
    /// The field at fault.
    pub param: Option<String>,
}

/// Why an agent failed: ends its stream with status `error` and this message and code.
///
/// An agent that fails before it has emitted anything (an upstream that refused the request) can say which
/// HTTP status the client should get instead of a stream: a chat request is then answered with that status,
/// its `retry-after`, and the OpenAI error envelope. CUI readers find both in the error's `details`
/// (`{"status", "retry_after"}`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    /// For a person.
    pub message: String,
    /// For programs.
    pub code: Option<String>,
    /// The HTTP status a client that has received nothing yet should get (400 to 599).
    pub status: Option<u16>,
    /// When a retry may succeed, for a 429 or 503.
    pub retry_after: Option<std::time::Duration>,
}

impl AgentError {
    /// An error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        AgentError { message: message.into(), code: None, status: None, retry_after: None }
    }

    /// Adds a code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Adds the HTTP status for a client that has received nothing yet.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    pub(crate) fn into_props(self) -> ErrorProps {
        let mut details = serde_json::Map::new();
        if let Some(status) = self.status {
            details.insert("status".into(), status.into());
        }
        if let Some(after) = self.retry_after {
            details.insert("retry_after".into(), after.as_secs().max(1).into());
        }
        let details = (!details.is_empty()).then_some(serde_json::Value::Object(details));
        ErrorProps { message: self.message, code: self.code, details }
    }
}

/// An emit the stream refused becomes the agent's error, so `?` works on every emit.
impl From<AppendError> for AgentError {
    fn from(error: AppendError) -> Self {
        let code = match &error {
            AppendError::Ended => "stream_ended",
            _ => "emit_refused",
        };
        AgentError::new(error.to_string()).with_code(code)
    }
}

//! Agents: the code that produces a stream, and the [`Output`] handle it emits through.
//!
//! - [`Agent`] (this file): `async fn run(&self, conversation, output) -> Result<Outcome, AgentError>`. Write it
//!   as a plain `async fn` in your impl; the registry boxes it.
//! - [`Output`] (`output.rs`): one method per built-in type, `send` for anything else, handles for messages
//!   that stream in deltas, blocks, sub-agent threads, and the cancellation signal.
//! - [`Agents`] (`registry.rs`): model names to agents; [`run`] (`run.rs`) starts an agent on a new stream.
//! - Built-in agents (`builtin/`): `demo`, `echo`, and `replay/<fixture>`.

mod builtin;
mod output;
mod registry;
mod run;

use std::future::Future;

use crate::conversation::Conversation;
use crate::hub::{AppendError, Limits};
use crate::output::{ErrorProps, Outcome};

pub use builtin::{DemoAgent, EchoAgent, ReplayAgent};
pub use output::{Output, StreamingMessage};
pub use registry::{Agents, StartError};
pub use run::run;

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
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    /// For a person.
    pub message: String,
    /// For programs.
    pub code: Option<String>,
}

impl AgentError {
    /// An error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        AgentError { message: message.into(), code: None }
    }

    /// Adds a code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    pub(crate) fn into_props(self) -> ErrorProps {
        ErrorProps { message: self.message, code: self.code, details: None }
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

//! `echo`: streams the last user message back word by word, without pauses.

use crate::agent::{Agent, AgentError, Output};
use crate::conversation::ChatRequest;
use crate::output::Outcome;

/// Streams the last user message back as text deltas, one word (with the space after it) per delta, and
/// reports usage in words.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoAgent;

impl Agent for EchoAgent {
    async fn run(&self, request: ChatRequest, output: Output) -> Result<Outcome, AgentError> {
        let text = request.last_user_text().unwrap_or_default();
        let mut message = output.stream_text();
        for word in text.split_inclusive(char::is_whitespace) {
            message.append(word)?;
        }
        message.end()?;
        Ok(Outcome::completed().with_usage(super::word_usage(&request, &text)))
    }
}

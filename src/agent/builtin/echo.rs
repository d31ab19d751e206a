//! `echo`: streams the last user message back word by word, without pauses.

use crate::agent::{Agent, AgentError, Output, Refusal};
use crate::conversation::{Conversation, Role};
use crate::hub::Limits;
use crate::output::Outcome;

/// Streams the last user message back as text deltas, one word (with the space after it) per delta, and
/// reports usage in words. A text it could not stream within a stream's limits (more words than a stream
/// holds messages, a word over the message limit, more bytes than a stream holds) is refused before it
/// starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoAgent;

/// What a delta adds to its word as JSON (type, ids, sequence, timestamp), at the most.
const DELTA_BYTES: u64 = 256;

/// The stream's own messages around the text: `stream_start`, `message_start`, `message_end`, `stream_end`.
const FRAMING_MESSAGES: usize = 4;

impl Agent for EchoAgent {
    async fn run(&self, conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        let text = conversation.last_user_text().unwrap_or_default();
        let mut message = output.stream_text();
        for word in text.split_inclusive(char::is_whitespace) {
            message.append(word)?;
        }
        message.end()?;
        Ok(Outcome::completed().with_usage(super::word_usage(&conversation, &text)))
    }

    fn check(&self, conversation: &Conversation, limits: &Limits) -> Result<(), Refusal> {
        let messages = conversation.messages().as_slice();
        let Some(index) = messages.iter().rposition(|m| m.role == Role::User) else { return Ok(()) };
        let text = messages[index].text();
        let refuse = |why: String| {
            Err(Refusal {
                message: format!("echo cannot stream this message back: {why}"),
                param: Some(format!("messages[{index}].content")),
            })
        };
        let words = text.split_inclusive(char::is_whitespace).count();
        if words + FRAMING_MESSAGES > limits.messages_per_stream {
            return refuse(format!("it has {words} words, and a stream holds {} messages", limits.messages_per_stream));
        }
        let longest = text.split_inclusive(char::is_whitespace).map(str::len).max().unwrap_or(0) as u64;
        if longest + DELTA_BYTES > limits.message_bytes {
            return refuse(format!("a word of {longest} bytes is over the message limit of {}", limits.message_bytes));
        }
        let bytes = text.len() as u64 + words as u64 * DELTA_BYTES;
        if bytes > limits.stream_bytes {
            return refuse(format!("it would take {bytes} bytes, and a stream holds {}", limits.stream_bytes));
        }
        Ok(())
    }
}

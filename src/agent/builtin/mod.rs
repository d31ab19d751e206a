//! The agents every agentmux has: `demo` (a tour of every built-in type), `echo` (the last user message
//! back, word by word), and `replay/<name>` (a fixture's messages).

mod demo;
mod echo;
mod replay;

pub use demo::DemoAgent;
pub use echo::EchoAgent;
pub use replay::ReplayAgent;

use crate::conversation::Conversation;
use crate::output::Usage;

/// Usage counted in words: what the built-in agents report, having no tokenizer.
fn word_usage(conversation: &Conversation, completion: &str) -> Usage {
    Usage::new(conversation.words() as u64, completion.split_whitespace().count() as u64)
}

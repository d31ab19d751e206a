//! The agents every agentmux has: `demo` (a tour of every built-in type), `echo` (the last user message
//! back, word by word), and `replay/<name>` (a fixture's messages).

mod demo;
mod echo;
mod replay;

pub use demo::DemoAgent;
pub use echo::EchoAgent;
pub use replay::ReplayAgent;

use crate::conversation::ChatRequest;
use crate::output::Usage;

/// Usage counted in words: what the built-in agents report, having no tokenizer.
fn word_usage(request: &ChatRequest, completion: &str) -> Usage {
    let prompt = request
        .messages
        .iter()
        .filter_map(|m| m.content.as_ref())
        .map(|c| c.text().split_whitespace().count())
        .sum::<usize>();
    Usage::new(prompt as u64, completion.split_whitespace().count() as u64)
}

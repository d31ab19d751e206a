//! `replay/<name>`: the messages of a fixture, in order, without pauses, then its outcome.
//!
//! The fixtures under `fixtures/` are built into the binary (see `build.rs`), so `replay/plain-text` works
//! wherever agentmux runs. A user can also replay their own recording with [`ReplayAgent::new`].

use crate::agent::{Agent, AgentError, Output};
use crate::conversation::Conversation;
use crate::output::{Outcome, OutputMessage};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/fixtures.rs"));
}

/// Sends recorded messages (JSON Lines) and ends with the recorded outcome.
#[derive(Debug, Clone)]
pub struct ReplayAgent {
    name: String,
    input: String,
    outcome: Option<String>,
}

impl ReplayAgent {
    /// A replay of `input` (one message per line) ending with `outcome` (JSON; completed when `None`).
    pub fn new(name: impl Into<String>, input: impl Into<String>, outcome: Option<String>) -> Self {
        ReplayAgent { name: name.into(), input: input.into(), outcome }
    }

    /// One replay per fixture built in.
    pub fn builtin() -> Vec<ReplayAgent> {
        embedded::FIXTURES
            .iter()
            .map(|(name, input, outcome)| ReplayAgent::new(*name, *input, outcome.map(str::to_owned)))
            .collect()
    }

    /// The recording's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Agent for ReplayAgent {
    async fn run(&self, _conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        for (number, line) in self.input.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let message = OutputMessage::from_json(line).map_err(|e| {
                AgentError::new(format!("replay {}: line {}: {e}", self.name, number + 1)).with_code("bad_recording")
            })?;
            output.send(message)?;
        }
        match &self.outcome {
            None => Ok(Outcome::completed()),
            Some(json) => serde_json::from_str(json).map_err(|e| {
                AgentError::new(format!("replay {}: outcome.json: {e}", self.name)).with_code("bad_recording")
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    /// The table `build.rs` generates, as it was written.
    const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/fixtures.rs"));

    #[test]
    fn the_generated_fixture_table_names_no_path_of_the_checkout_that_built_it() {
        assert!(!GENERATED.contains(env!("CARGO_MANIFEST_DIR")), "an absolute path in:\n{GENERATED}");
        assert!(GENERATED.contains(r#"env!("CARGO_MANIFEST_DIR")"#), "paths follow the crate being built");
        assert!(!super::ReplayAgent::builtin().is_empty(), "the fixtures are embedded");
    }
}

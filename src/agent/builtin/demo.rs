//! `demo`: a short tour of every built-in message type, with pauses so a person can watch it stream.
//!
//! In order: a loading message that turns done, streamed thinking, streamed text, a block holding a
//! streamed tool call the agent runs itself and its result, more text, an image (a data: URL, so it shows without network),
//! an action, an event, and a completed finish with usage in words. Between steps it waits for
//! [`DemoAgent::pause`], and stops early if the stream is cancelled.

use std::time::Duration;

use serde_json::json;

use crate::agent::{Agent, AgentError, Output};
use crate::conversation::Conversation;
use crate::output::{ImageProps, Outcome};

const BADGE: &str = "data:image/svg+xml;base64,PHN2ZyB4bWxucz0iaHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmciIHdpZHRoPSIyNDAiIGhlaWdodD0iNjAiPjxyZWN0IHdpZHRoPSIyNDAiIGhlaWdodD0iNjAiIHJ4PSI4IiBmaWxsPSIjMWY2ZmViIi8+PHRleHQgeD0iMTIwIiB5PSIzOCIgZm9udC1mYW1pbHk9InNhbnMtc2VyaWYiIGZvbnQtc2l6ZT0iMjIiIGZpbGw9IiNmZmYiIHRleHQtYW5jaG9yPSJtaWRkbGUiPmFnZW50bXV4PC90ZXh0Pjwvc3ZnPg==";

/// The tour; see the module doc.
#[derive(Debug, Clone, Copy)]
pub struct DemoAgent {
    /// The wait between steps (150 ms by default).
    pub pause: Duration,
}

impl Default for DemoAgent {
    fn default() -> Self {
        DemoAgent { pause: Duration::from_millis(150) }
    }
}

impl DemoAgent {
    /// Waits one pause; an error if the stream is cancelled meanwhile.
    async fn pause(&self, output: &Output) -> Result<(), AgentError> {
        tokio::select! {
            () = tokio::time::sleep(self.pause) => Ok(()),
            () = output.cancelled() => Err(AgentError::new("cancelled").with_code("cancelled")),
        }
    }
}

impl Agent for DemoAgent {
    async fn run(&self, conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        let mut said = String::new();
        let mut loading = output.start(crate::output::OutputMessage::loading("Reading your request..."))?;
        self.pause(&output).await?;
        loading.set("done", true)?;
        loading.end()?;

        let mut thinking = output.stream_thinking();
        for part in ["The user wants a tour. ", "Show each message type ", "once, briefly."] {
            thinking.append(part)?;
            self.pause(&output).await?;
        }
        thinking.end()?;

        let mut text = output.stream_text();
        for word in "Here is a short tour of what agentmux carries. ".split_inclusive(' ') {
            text.append(word)?;
            said.push_str(word);
            self.pause(&output).await?;
        }
        text.end()?;

        let step = output.begin_block();
        let mut call = step.stream_server_tool_call("call_demo_weather", "get_weather");
        for fragment in ["{\"city\":", " \"Paris\"}"] {
            call.append(fragment)?;
            self.pause(&output).await?;
        }
        call.end()?;
        step.tool_result("call_demo_weather", "get_weather", json!({ "temp_c": 18, "sky": "sunny" }))?;
        step.end_block()?;

        let weather = "The weather tool says 18 °C and sunny in Paris.\n";
        output.text(weather)?;
        said.push_str(weather);
        self.pause(&output).await?;
        output.send(
            ImageProps {
                url: BADGE.into(),
                alt: Some("agentmux".into()),
                width: Some(240),
                height: Some(60),
                detail: None,
            }
            .into(),
        )?;
        self.pause(&output).await?;
        output.action("open_panel", json!({ "panel": "details" }))?;
        output.event("demo_complete", json!({ "steps": 9 }))?;
        Ok(Outcome::completed().with_usage(super::word_usage(&conversation, &said)))
    }
}

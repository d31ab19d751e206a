//! What one message, in its current state, looks like to an OpenAI client.
//!
//! A pure function of the message's state (and of [`AgentTools`]): text is `content`; thinking and loading
//! are reasoning; a tool call handed to the client is a tool call; a tool call the agent runs itself and its
//! `tool_result` are reasoning lines or nothing; an error ends the stream; media and custom types with a `url` become Markdown in
//! `content`; action, event and custom types without a `url` are silent. The streaming adapter sends what is
//! new in a projection since it last looked, and the non-streaming aggregate joins the final projections, so
//! the two agree by construction.
//!
//! Media links are blocks: when one follows other content, or other content follows one, and the content
//! before does not end a line, a line break separates them (see `Separator` in `progress.rs`). Text that
//! follows text is joined as it is, so an answer streamed in several text messages reads as the producer
//! wrote it.
//!
//! Markdown is escaped so that any alt text, name or URL yields a working link: `\`, `[` and `]` in link text
//! are backslash-escaped and line breaks become spaces; spaces, parentheses, angle brackets and line breaks in
//! URLs are percent-encoded.

use std::borrow::Cow;

use super::options::AgentTools;
use crate::output::OutputMessage;

/// A message as an OpenAI client sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Projection<'a> {
    /// Nothing (action, event, a custom type without a URL).
    Silent,
    /// Assistant `content`. `block` marks a media or custom-type link, which stands on a line of its own.
    Content { text: Cow<'a, str>, block: bool },
    /// Reasoning (`reasoning_content` and/or `reasoning`).
    Reasoning(Cow<'a, str>),
    /// A tool call; `id` and `name` may still be empty while it streams.
    ToolCall { id: &'a str, name: &'a str, arguments: &'a str },
    /// An error, which ends an OpenAI stream.
    Error { message: &'a str, code: Option<&'a str> },
}

/// Projects a message's current state.
pub(crate) fn project(message: &OutputMessage, agent_tools: AgentTools) -> Projection<'_> {
    let prop = |key| message.prop_str(key).unwrap_or("");
    let media = |render: fn(&OutputMessage, &str) -> String| {
        let url = prop("url");
        let text = if url.is_empty() { Cow::Borrowed("") } else { Cow::Owned(render(message, url)) };
        Projection::Content { text, block: true }
    };
    match message.kind.as_str() {
        "text" => Projection::Content { text: Cow::Borrowed(prop("content")), block: false },
        "thinking" => Projection::Reasoning(Cow::Borrowed(prop("content"))),
        "loading" => Projection::Reasoning(Cow::Borrowed(prop("message"))),
        "tool_call" if message.props.get("server_side") == Some(&serde_json::Value::Bool(true)) => {
            match (agent_tools, prop("name")) {
                (AgentTools::Hidden, _) | (_, "") => Projection::Silent,
                (AgentTools::Reasoning, name) => {
                    Projection::Reasoning(Cow::Owned(format!("Calling {name} with {}", prop("arguments"))))
                }
            }
        }
        "tool_call" => Projection::ToolCall { id: prop("id"), name: prop("name"), arguments: prop("arguments") },
        "tool_result" if agent_tools == AgentTools::Hidden => Projection::Silent,
        "tool_result" => Projection::Reasoning(Cow::Owned(tool_result(message))),
        "error" => Projection::Error { message: prop("message"), code: message.prop_str("code") },
        "image" => media(|m, url| format!("![{}]({})", link_text(m.prop_str("alt").unwrap_or("")), link_url(url))),
        "audio" => media(|_, url| format!("🔊 [Play audio]({})", link_url(url))),
        "video" => media(|_, url| format!("🎬 [Watch video]({})", link_url(url))),
        "file" => media(|m, url| format!("📎 [{}]({})", link_text(&file_name(m, url)), link_url(url))),
        "action" | "event" => Projection::Silent,
        custom => match message.prop_str("url") {
            Some(url) if !url.is_empty() => {
                let text = Cow::Owned(format!("📎 [View {}]({})", link_text(custom), link_url(url)));
                Projection::Content { text, block: true }
            }
            _ => Projection::Silent,
        },
    }
}

/// A tool result as a line of reasoning: `<name> returned <result>` or `<name> failed: <message>`.
fn tool_result(message: &OutputMessage) -> String {
    let name = message.prop_str("name").filter(|n| !n.is_empty()).unwrap_or("the tool");
    if let Some(error) = message.props.get("error").filter(|e| !e.is_null()) {
        let why = error.get("message").and_then(serde_json::Value::as_str).unwrap_or("no reason given");
        return format!("{name} failed: {why}");
    }
    match message.props.get("result") {
        Some(serde_json::Value::String(text)) => format!("{name} returned {text}"),
        Some(result) => format!("{name} returned {result}"),
        None => format!("{name} returned nothing"),
    }
}

/// A file's name: its `name` prop, else the last segment of its URL's path, else `file`.
fn file_name(message: &OutputMessage, url: &str) -> String {
    if let Some(name) = message.prop_str("name").filter(|n| !n.is_empty()) {
        return name.to_owned();
    }
    url::Url::parse(url)
        .ok()
        .filter(|u| u.scheme() != "data")
        .and_then(|u| u.path_segments().and_then(|mut s| s.next_back().map(str::to_owned)))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "file".to_owned())
}

fn link_text(text: &str) -> Cow<'_, str> {
    if !text.contains(['\\', '[', ']', '\n', '\r']) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        match c {
            '\\' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn link_url(url: &str) -> Cow<'_, str> {
    if !url.contains([' ', '(', ')', '<', '>', '\n', '\r']) {
        return Cow::Borrowed(url);
    }
    let mut out = String::with_capacity(url.len() + 8);
    for c in url.chars() {
        match c {
            ' ' => out.push_str("%20"),
            '(' => out.push_str("%28"),
            ')' => out.push_str("%29"),
            '<' => out.push_str("%3C"),
            '>' => out.push_str("%3E"),
            '\n' => out.push_str("%0A"),
            '\r' => out.push_str("%0D"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(message: OutputMessage) -> String {
        match project(&message, AgentTools::Reasoning) {
            Projection::Content { text, .. } => text.into_owned(),
            other => panic!("not content: {other:?}"),
        }
    }

    #[test]
    fn markdown_survives_awkward_text_and_urls() {
        let image = OutputMessage::image("https://x.test/a (1).png").with_prop("alt", "a [b]\nc");
        assert_eq!(content(image), r"![a \[b\] c](https://x.test/a%20%281%29.png)");
        let file = OutputMessage::file("https://x.test/docs/report.pdf?dl=1");
        assert_eq!(content(file), "📎 [report.pdf](https://x.test/docs/report.pdf?dl=1)");
        let data = OutputMessage::file("data:text/plain;base64,aGk=");
        assert_eq!(content(data), "📎 [file](data:text/plain;base64,aGk=)");
        let chart = OutputMessage::new("chart", Default::default()).with_prop("url", "https://x.test/c");
        assert_eq!(content(chart), "📎 [View chart](https://x.test/c)");
    }

    #[test]
    fn silent_types() {
        for message in [
            OutputMessage::action("open"),
            OutputMessage::event("stream_start"),
            OutputMessage::new("chart", Default::default()),
            OutputMessage::new("chart", Default::default()).with_prop("url", 3),
        ] {
            assert_eq!(project(&message, AgentTools::Reasoning), Projection::Silent);
        }
    }
}

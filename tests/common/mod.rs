//! Fixture cases shared by the integration tests: `fixtures/<case>/input.jsonl` (the messages a producer
//! sends, one per line) and an optional `outcome.json` (how the stream ended; completed when absent).
#![allow(dead_code)]

pub(crate) mod browser;
pub(crate) mod command;
pub(crate) mod doubles;
pub(crate) mod http;
pub(crate) mod node;
pub(crate) mod process;
pub(crate) mod proxy;
pub(crate) mod python;
pub(crate) mod python_package;
pub(crate) mod recorded;
pub(crate) mod redis;
pub(crate) mod server;
pub(crate) mod tls;
pub(crate) mod upstream;
pub(crate) mod venv;
pub(crate) mod wait;

use std::path::{Path, PathBuf};

use agentmux::adapter::{
    Adapter, AgUiAdapter, AgUiOptions, AnthropicAdapter, AnthropicOptions, CuiAdapter, OpenAiAdapter, OpenAiCompletion,
    OpenAiOptions, ResponsesAdapter, ResponsesOptions, UiMessageAdapter, UiMessageOptions,
};
use agentmux::output::{Metadata, Outcome, OutputMessage};

/// The fixed id, clock and model that golden files are rendered with.
pub(crate) const COMPLETION_ID: &str = "chatcmpl-golden";
pub(crate) const CREATED: u64 = 1_700_000_000;
pub(crate) const FIRST_TIMESTAMP_MS: u64 = 1_700_000_000_000;

pub(crate) fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Every case directory, sorted.
pub(crate) fn cases() -> Vec<String> {
    let mut cases: Vec<String> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures/ exists")
        .map(|e| e.expect("dir entry"))
        .filter(|e| e.path().join("input.jsonl").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    cases.sort();
    cases
}

pub(crate) fn read(case: &str, file: &str) -> Vec<u8> {
    let path = fixtures_dir().join(case).join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The case's messages, validated, and stamped as a stream stamps them: sequence from 1, a timestamp
/// one millisecond apart.
pub(crate) fn messages(case: &str) -> Vec<OutputMessage> {
    let input = String::from_utf8(read(case, "input.jsonl")).expect("utf-8");
    input
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            let mut message = OutputMessage::from_json(line).unwrap_or_else(|e| panic!("{case} line {}: {e}", i + 1));
            message.metadata = Some(Metadata {
                sequence: Some(i as u64 + 1),
                timestamp: Some(FIRST_TIMESTAMP_MS + i as u64),
                trace_id: message.metadata.and_then(|m| m.trace_id),
            });
            message
        })
        .collect()
}

pub(crate) fn outcome(case: &str) -> Outcome {
    let path = fixtures_dir().join(case).join("outcome.json");
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        Err(_) => Outcome::completed(),
    }
}

/// The Responses id, time and model in golden files.
pub(crate) fn responses_options(case: &str) -> ResponsesOptions {
    ResponsesOptions { id: "resp_golden".into(), created_at: CREATED, model: format!("replay/{case}") }
}

/// The Anthropic message id and model in golden files.
pub(crate) fn anthropic_options(case: &str) -> AnthropicOptions {
    AnthropicOptions { id: "msg_golden".into(), model: format!("replay/{case}") }
}

/// The AG-UI ids in golden files.
pub(crate) fn ag_ui_options() -> AgUiOptions {
    AgUiOptions { thread_id: "thread-golden".into(), run_id: "run-golden".into() }
}

/// The UI message stream's options in golden files.
pub(crate) fn ui_options() -> UiMessageOptions {
    UiMessageOptions { message_id: "msg-golden".into() }
}

pub(crate) fn options(case: &str, include_usage: bool) -> OpenAiOptions {
    let mut options = OpenAiOptions::new(COMPLETION_ID, CREATED, format!("replay/{case}"));
    options.include_usage = include_usage;
    options
}

/// Runs the messages and the outcome through an adapter and joins its frames as SSE events.
pub(crate) fn render(adapter: &mut dyn Adapter, messages: &[OutputMessage], outcome: &Outcome) -> Vec<u8> {
    let mut frames = Vec::new();
    for message in messages {
        adapter.push(message, &mut frames);
    }
    adapter.finish(outcome, &mut frames);
    frames.iter().flat_map(|frame| agentmux::render::encode_sse(frame).to_vec()).collect()
}

/// Every golden file of a case, rendered now: (file name, bytes).
pub(crate) fn render_case(case: &str) -> Vec<(&'static str, Vec<u8>)> {
    let messages = messages(case);
    let outcome = outcome(case);
    let mut completion = OpenAiCompletion::new(options(case, false));
    for message in &messages {
        completion.push(message);
    }
    let json = match completion.finish(&outcome) {
        Ok(body) => body.to_vec(),
        Err(error) => error.to_json().to_vec(),
    };
    vec![
        ("cui.sse", render(&mut CuiAdapter, &messages, &outcome)),
        ("openai.sse", render(&mut OpenAiAdapter::new(options(case, false)), &messages, &outcome)),
        ("openai-usage.sse", render(&mut OpenAiAdapter::new(options(case, true)), &messages, &outcome)),
        ("openai.json", json),
        ("ui-message.sse", render(&mut UiMessageAdapter::new(ui_options()), &messages, &outcome)),
        ("ag-ui.sse", render(&mut AgUiAdapter::new(ag_ui_options()), &messages, &outcome)),
        ("anthropic.sse", render(&mut AnthropicAdapter::new(anthropic_options(case)), &messages, &outcome)),
        ("responses.sse", render(&mut ResponsesAdapter::new(responses_options(case)), &messages, &outcome)),
    ]
}

/// (id, name, arguments) of each tool call of an async-openai response.
pub(crate) fn tool_calls(
    response: &async_openai::types::chat::CreateChatCompletionResponse,
) -> Vec<(String, String, String)> {
    use async_openai::types::chat::ChatCompletionMessageToolCalls;
    response.choices[0]
        .message
        .tool_calls
        .iter()
        .flatten()
        .map(|call| match call {
            ChatCompletionMessageToolCalls::Function(f) => {
                (f.id.clone(), f.function.name.clone(), f.function.arguments.clone())
            }
            other => panic!("unexpected tool call {other:?}"),
        })
        .collect()
}

/// Asserts two reads are byte for byte the same, naming the first frame that differs.
pub(crate) fn assert_same_frames(got: &[bytes::Bytes], want: &[bytes::Bytes], what: &str) {
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: {} frames, expected {}; first difference at frame {first}: {:?} vs {:?}",
            got.len(),
            want.len(),
            got.get(first),
            want.get(first)
        );
    }
}

/// Everything a subscriber of `format` receives from the start of `stream` (which must end).
pub(crate) async fn read_all(
    stream: &std::sync::Arc<agentmux::hub::Stream>,
    format: agentmux::render::Format,
) -> Vec<u8> {
    let mut subscription = stream.subscribe(format, 0).expect("subscribe");
    let mut body = Vec::new();
    while let Some(batch) = subscription.next().await {
        batch.frames().iter().for_each(|frame| body.extend_from_slice(frame));
    }
    body
}

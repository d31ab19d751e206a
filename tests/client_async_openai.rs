//! async-openai, a client nobody here wrote, against the real server over 127.0.0.1: text, reasoning through
//! its bring-your-own-types path, parallel tool calls, errors after the stream started, usage chunks and an
//! unknown model, each streaming (`create_stream`) and non-streaming (`create`) where that makes sense; then
//! `: ping` keep-alives between chunks, a request carrying every common field, every `replay/<case>`, and a
//! client that drops its stream. What the client reads is compared with the golden files under `fixtures/`
//! modulo the completion's `id` and `created`, which the server picks itself.
//!
//! Facts about async-openai 0.43 these tests rely on (and pin down):
//! - with the `byot` feature on, the typed `create_stream` no longer sets `stream: true` itself, so the
//!   requests here set it;
//! - a stream ends at `data: [DONE]`; an `{"error": ...}` event is handed to the chunk deserializer, so it
//!   arrives as an `OpenAIError::JSONDeserialize` item whose content is the event's JSON;
//! - a 5xx response is retried three times (100, 200, 400 ms apart) whatever `x-should-retry` says, and its
//!   body is not parsed: the `ApiError`'s message is the raw body, `code` is `None`;
//! - a 4xx body is parsed into the `ApiError` (message, type, param, code).

mod common;

use std::collections::BTreeMap;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::{ApiErrorResponse, OpenAIError, WrappedError};
use async_openai::types::chat::{
    ChatCompletionRequestUserMessage, ChatCompletionStreamOptions, CompletionUsage, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs, CreateChatCompletionResponse, CreateChatCompletionStreamResponse, FinishReason,
    Role,
};
use common::server::TestServer;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;

fn client(server: &TestServer) -> Client<OpenAIConfig> {
    Client::with_config(OpenAIConfig::new().with_api_base(server.url("/v1")).with_api_key("test"))
}

/// A one-message chat request. `stream` is set explicitly: with `byot` on, `create_stream` does not set it.
fn request(model: &str, text: &str, stream: bool, include_usage: bool) -> CreateChatCompletionRequest {
    let mut builder = CreateChatCompletionRequestArgs::default();
    builder.model(model).messages([ChatCompletionRequestUserMessage::from(text).into()]);
    if stream {
        builder.stream(true);
    }
    if include_usage {
        builder.stream_options(ChatCompletionStreamOptions { include_usage: Some(true), include_obfuscation: None });
    }
    builder.build().expect("a valid request")
}

/// Every item of a stream until it ends (at `[DONE]`, or the end of the body), with a time limit.
async fn collect<T>(stream: impl Stream<Item = Result<T, OpenAIError>>) -> Vec<Result<T, OpenAIError>> {
    tokio::time::timeout(std::time::Duration::from_secs(10), stream.collect::<Vec<_>>()).await.expect("the stream ends")
}

/// Every item must be a chunk.
fn chunks(
    items: Vec<Result<CreateChatCompletionStreamResponse, OpenAIError>>,
) -> Vec<CreateChatCompletionStreamResponse> {
    items.into_iter().map(|item| item.unwrap_or_else(|e| panic!("a chunk, not {e}"))).collect()
}

/// The chunks of a golden SSE file (the error event and `[DONE]` left out).
fn golden_chunks(case: &str, file: &str) -> Vec<CreateChatCompletionStreamResponse> {
    String::from_utf8(common::read(case, file))
        .expect("utf-8")
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]" && !data.starts_with("{\"error\""))
        .map(|data| serde_json::from_str(data).unwrap_or_else(|e| panic!("{case}/{file}: {e}: {data}")))
        .collect()
}

fn golden_response(case: &str) -> CreateChatCompletionResponse {
    serde_json::from_slice(&common::read(case, "openai.json")).expect("openai.json is a chat.completion")
}

fn golden_error(case: &str) -> WrappedError {
    serde_json::from_slice(&common::read(case, "openai.json")).expect("openai.json is an error envelope")
}

/// `created` is seconds (async-openai types it `u32`) and close to now.
fn assert_created_now(created: u32) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    assert!(u64::from(created).abs_diff(now) < 600, "created {created} is seconds near {now}");
}

/// Checks what every chunk of one completion shares and gives the golden chunks the server's id and created.
fn assert_same_as_golden(
    received: &[CreateChatCompletionStreamResponse],
    mut golden: Vec<CreateChatCompletionStreamResponse>,
) {
    let first = received.first().expect("at least one chunk");
    for chunk in &mut golden {
        chunk.id.clone_from(&first.id);
        chunk.created = first.created;
    }
    assert_eq!(received, golden.as_slice());
}

/// What a client builds from the typed chunks.
#[derive(Debug, Default)]
struct Accumulated {
    id: String,
    content: String,
    content_pieces: Vec<String>,
    finish: Option<FinishReason>,
    /// index → (id, name, arguments)
    calls: BTreeMap<u32, (String, String, String)>,
    usage: Option<CompletionUsage>,
    usage_chunks: usize,
}

/// Accumulates the chunks as a client does, checking the invariants of one completion on the way: the same
/// `id`, `created`, `model` and `object` on every chunk, `role` once in the first chunk, `index` on every tool
/// call delta with `id`, `type` and `name` only in the first, one `finish_reason`, usage only on a last
/// chunk with `choices: []`.
fn accumulate(model: &str, chunks: &[CreateChatCompletionStreamResponse]) -> Accumulated {
    let first = chunks.first().expect("at least one chunk");
    assert!(first.id.starts_with("chatcmpl-"), "{}", first.id);
    assert_created_now(first.created);
    let mut out = Accumulated { id: first.id.clone(), ..Accumulated::default() };
    for (i, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk.id, first.id, "chunk {i}: the same id on every chunk");
        assert_eq!(chunk.created, first.created, "chunk {i}: the same created on every chunk");
        assert_eq!(chunk.model, model, "chunk {i}");
        assert_eq!(chunk.object, "chat.completion.chunk", "chunk {i}");
        assert!(out.usage.is_none(), "chunk {i}: a chunk after the usage chunk");
        if let Some(usage) = &chunk.usage {
            assert!(chunk.choices.is_empty(), "chunk {i}: the usage chunk has choices: []");
            out.usage = Some(usage.clone());
            out.usage_chunks += 1;
        } else {
            assert!(!chunk.choices.is_empty(), "chunk {i}: choices: [] only on the usage chunk");
        }
        let roles = chunk.choices.iter().filter(|c| c.delta.role.is_some()).count();
        assert_eq!(roles, usize::from(i == 0), "chunk {i}: role only in the first chunk");
        for choice in &chunk.choices {
            assert_eq!(choice.index, 0);
            if i == 0 {
                assert_eq!(choice.delta.role, Some(Role::Assistant));
            }
            assert!(out.finish.is_none(), "chunk {i}: a choice after finish_reason");
            if let Some(content) = &choice.delta.content {
                out.content.push_str(content);
                if !content.is_empty() {
                    out.content_pieces.push(content.clone());
                }
            }
            for call in choice.delta.tool_calls.iter().flatten() {
                let entry = out.calls.entry(call.index).or_default();
                let first_delta = entry.0.is_empty();
                assert_eq!(call.id.is_some(), first_delta, "chunk {i}: id in the first delta of call {}", call.index);
                assert_eq!(call.r#type.is_some(), first_delta, "chunk {i}: type in the first delta only");
                let function = call.function.as_ref().expect("every tool call delta has function");
                assert_eq!(function.name.is_some(), first_delta, "chunk {i}: name in the first delta only");
                if let Some(id) = &call.id {
                    entry.0.clone_from(id);
                }
                if let Some(name) = &function.name {
                    entry.1.clone_from(name);
                }
                entry.2.push_str(function.arguments.as_deref().unwrap_or(""));
            }
            out.finish = choice.finish_reason;
        }
    }
    out
}

/// A response compared with the golden one after taking the server's id and created.
fn assert_response_as_golden(case: &str, response: &CreateChatCompletionResponse) {
    assert!(response.id.starts_with("chatcmpl-"), "{}", response.id);
    assert_created_now(response.created);
    let mut golden = golden_response(case);
    golden.id.clone_from(&response.id);
    golden.created = response.created;
    assert_eq!(response, &golden, "{case}");
}

fn api_error(error: OpenAIError) -> ApiErrorResponse {
    match error {
        OpenAIError::ApiError(response) => response,
        other => panic!("an ApiError, not {other:?}"),
    }
}

// 1. Text.

#[tokio::test]
async fn echo_streams_the_text_word_by_word() {
    let server = TestServer::start().await;
    let text = "the quick brown fox jumps";
    let items =
        collect(client(&server).chat().create_stream(request("echo", text, true, false)).await.expect("stream")).await;
    let chunks = chunks(items);
    let got = accumulate("echo", &chunks);
    assert_eq!(got.content, text);
    assert_eq!(got.content_pieces, text.split_inclusive(' ').collect::<Vec<_>>(), "one delta per word");
    assert_eq!(got.finish, Some(FinishReason::Stop));
    assert_eq!(got.usage_chunks, 0, "no usage chunk without include_usage");
    let last = chunks.last().expect("last");
    assert!(last.choices[0].delta.content.is_none() && last.choices[0].delta.tool_calls.is_none(), "{last:?}");
}

#[tokio::test]
async fn echo_answers_without_streaming() {
    let server = TestServer::start().await;
    let text = "the quick brown fox jumps";
    let response = client(&server).chat().create(request("echo", text, false, false)).await.expect("a completion");
    assert!(response.id.starts_with("chatcmpl-"), "{}", response.id);
    assert_created_now(response.created);
    assert_eq!(response.object, "chat.completion");
    assert_eq!(response.model, "echo");
    assert_eq!(response.choices.len(), 1);
    let choice = &response.choices[0];
    assert_eq!(choice.message.role, Role::Assistant);
    assert_eq!(choice.message.content.as_deref(), Some(text));
    assert_eq!(choice.finish_reason, Some(FinishReason::Stop));
    let usage = response.usage.expect("echo reports usage");
    assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.total_tokens), (5, 5, 10));
}

#[tokio::test]
async fn plain_text_streams_and_answers_as_the_golden_files() {
    let server = TestServer::start().await;
    let client = client(&server);
    let model = "replay/plain-text";
    let chunks =
        chunks(collect(client.chat().create_stream(request(model, "hi", true, false)).await.expect("stream")).await);
    let got = accumulate(model, &chunks);
    assert_eq!(got.content, "Hello! How can I help you today?");
    assert_eq!(got.finish, Some(FinishReason::Stop));
    assert_same_as_golden(&chunks, golden_chunks("plain-text", "openai.sse"));

    let response = client.chat().create(request(model, "hi", false, false)).await.expect("a completion");
    assert_ne!(response.id, got.id, "each request is its own completion");
    assert_response_as_golden("plain-text", &response);
}

// 2. Reasoning, through the bring-your-own-types path.

#[derive(Debug, Deserialize)]
struct ReasoningChunk {
    id: String,
    object: String,
    created: u64,
    choices: Vec<ReasoningChoice>,
}

#[derive(Debug, Deserialize)]
struct ReasoningChoice {
    delta: ReasoningDelta,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ReasoningDelta {
    role: Option<String>,
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ReasoningResponse {
    object: String,
    choices: Vec<ReasoningResponseChoice>,
}

#[derive(Debug, Deserialize)]
struct ReasoningResponseChoice {
    message: ReasoningDelta,
    finish_reason: String,
}

const HAIKU_REASONING: &str = "The user wants a haiku about autumn: 5, 7, 5 syllables.";
const HAIKU: &str = "Crisp leaves drift and fall,\nthe maple lets go of red,\nwind keeps what it finds.";

/// (reasoning_content, reasoning, content, finish_reason) read from a byot stream.
async fn read_reasoning_stream(client: &Client<OpenAIConfig>) -> (String, String, String, Option<String>) {
    let body = json!({
        "model": "replay/thinking-then-text",
        "messages": [{"role": "user", "content": "a haiku about autumn"}],
        "stream": true,
    });
    let stream = client.chat().create_stream_byot::<_, ReasoningChunk>(body).await.expect("stream");
    let items = collect(stream).await;
    let (mut reasoning_content, mut reasoning, mut content, mut finish) =
        (String::new(), String::new(), String::new(), None);
    let mut id = None;
    for (i, item) in items.into_iter().enumerate() {
        let chunk = item.unwrap_or_else(|e| panic!("chunk {i}: {e}"));
        assert_eq!(chunk.object, "chat.completion.chunk");
        assert_eq!(id.get_or_insert_with(|| chunk.id.clone()), &chunk.id, "the same id on every chunk");
        assert!(chunk.created < 1 << 32, "created in seconds");
        for choice in chunk.choices {
            let delta = choice.delta;
            assert_eq!(delta.role.is_some(), i == 0, "chunk {i}: role only in the first chunk");
            let has_reasoning = delta.reasoning_content.is_some() || delta.reasoning.is_some();
            assert!(!(has_reasoning && delta.content.is_some()), "chunk {i}: reasoning in its own deltas");
            reasoning_content.push_str(delta.reasoning_content.as_deref().unwrap_or(""));
            reasoning.push_str(delta.reasoning.as_deref().unwrap_or(""));
            content.push_str(delta.content.as_deref().unwrap_or(""));
            if choice.finish_reason.is_some() {
                assert!(finish.is_none(), "one finish_reason");
                finish = choice.finish_reason;
            }
        }
    }
    (reasoning_content, reasoning, content, finish)
}

#[tokio::test]
async fn reasoning_arrives_as_reasoning_content_through_byot() {
    let server = TestServer::start().await;
    let client = client(&server);
    let (reasoning_content, reasoning, content, finish) = read_reasoning_stream(&client).await;
    assert_eq!(reasoning_content, HAIKU_REASONING);
    assert_eq!(reasoning, "", "only reasoning_content by default");
    assert_eq!(content, HAIKU);
    assert_eq!(finish.as_deref(), Some("stop"));

    let body = json!({
        "model": "replay/thinking-then-text",
        "messages": [{"role": "user", "content": "a haiku about autumn"}],
    });
    let response: ReasoningResponse = client.chat().create_byot(body).await.expect("a completion");
    assert_eq!(response.object, "chat.completion");
    let choice = &response.choices[0];
    assert_eq!(choice.message.role.as_deref(), Some("assistant"));
    assert_eq!(choice.message.reasoning_content.as_deref(), Some(HAIKU_REASONING));
    assert_eq!(choice.message.reasoning, None);
    assert_eq!(choice.message.content.as_deref(), Some(HAIKU));
    assert_eq!(choice.finish_reason, "stop");

    // The typed path ignores reasoning: the same stream reads as its content alone.
    let typed = chunks(
        collect(
            client.chat().create_stream(request("replay/thinking-then-text", "x", true, false)).await.expect("stream"),
        )
        .await,
    );
    assert_eq!(accumulate("replay/thinking-then-text", &typed).content, HAIKU);
    assert_same_as_golden(&typed, golden_chunks("thinking-then-text", "openai.sse"));
}

#[tokio::test]
async fn reasoning_arrives_as_reasoning_when_the_header_asks() {
    let server = TestServer::start().await;
    let config = OpenAIConfig::new()
        .with_api_base(server.url("/v1"))
        .with_api_key("test")
        .with_header("x-agentmux-reasoning", "reasoning")
        .expect("a valid header");
    let (reasoning_content, reasoning, content, finish) = read_reasoning_stream(&Client::with_config(config)).await;
    assert_eq!((reasoning_content.as_str(), reasoning.as_str()), ("", HAIKU_REASONING));
    assert_eq!(content, HAIKU);
    assert_eq!(finish.as_deref(), Some("stop"));
}

// 3. Tool calls.

#[tokio::test]
async fn parallel_tool_calls_accumulate_by_index() {
    let server = TestServer::start().await;
    let client = client(&server);
    for case in ["two-tool-calls-interleaved", "tool-call-fragments"] {
        let model = format!("replay/{case}");
        let golden = golden_response(case);
        let expected = common::tool_calls(&golden);
        assert!(!expected.is_empty(), "{case}");

        let chunks = chunks(
            collect(client.chat().create_stream(request(&model, "weather?", true, false)).await.expect("stream")).await,
        );
        let got = accumulate(&model, &chunks);
        assert_eq!(
            got.calls.keys().copied().collect::<Vec<_>>(),
            (0..expected.len() as u32).collect::<Vec<_>>(),
            "{case}"
        );
        assert_eq!(got.calls.into_values().collect::<Vec<_>>(), expected, "{case}");
        assert_eq!(got.finish, Some(FinishReason::ToolCalls), "{case}");
        assert_eq!(got.content, "", "{case}: no text");
        for (_, _, arguments) in &expected {
            serde_json::from_str::<serde_json::Value>(arguments).unwrap_or_else(|e| panic!("{case}: {e}: {arguments}"));
        }
        assert_same_as_golden(&chunks, golden_chunks(case, "openai.sse"));

        let response = client.chat().create(request(&model, "weather?", false, false)).await.expect("a completion");
        assert_eq!(common::tool_calls(&response), expected, "{case}");
        assert_eq!(response.choices[0].finish_reason, Some(FinishReason::ToolCalls), "{case}");
        assert_eq!(response.choices[0].message.content, None, "{case}");
        assert_response_as_golden(case, &response);
    }
    let expected =
        [("call_a", "get_weather", r#"{"city": "Paris"}"#), ("call_b", "get_time", r#"{"tz": "Europe/Paris"}"#)]
            .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()));
    assert_eq!(common::tool_calls(&golden_response("two-tool-calls-interleaved")), expected);
}

// 4. Errors after the stream started.

/// The chunks before the error, then the error event's envelope; nothing after it.
fn split_at_error(
    items: Vec<Result<CreateChatCompletionStreamResponse, OpenAIError>>,
) -> (Vec<CreateChatCompletionStreamResponse>, WrappedError) {
    let mut items = items.into_iter();
    let mut chunks = Vec::new();
    let error = loop {
        match items.next().expect("an Err item before the stream ends") {
            Ok(chunk) => chunks.push(chunk),
            Err(error) => break error,
        }
    };
    let rest: Vec<_> = items.collect();
    assert!(rest.is_empty(), "nothing after the error: {rest:?}");
    // async-openai hands the `{"error": ...}` event to the chunk deserializer.
    let envelope = match error {
        OpenAIError::JSONDeserialize(_, content) => {
            serde_json::from_str::<WrappedError>(&content).unwrap_or_else(|e| panic!("{e}: {content}"))
        }
        other => panic!("async-openai 0.43 reports an error event as JSONDeserialize, not {other:?}"),
    };
    (chunks, envelope)
}

#[tokio::test]
async fn an_error_mid_stream_ends_the_stream_with_an_err_item() {
    let server = TestServer::start().await;
    let client = client(&server);
    for (case, content, message, code) in [
        ("error-mid-stream", "Let me look that up.\n", "Upstream API timed out after 30s", "upstream_timeout"),
        ("failed", "Working on it", "The model is overloaded, try again later", "overloaded"),
        ("cancelled", "Step one: gather", "the stream was cancelled", "cancelled"),
    ] {
        let model = format!("replay/{case}");
        for include_usage in [false, true] {
            let stream =
                client.chat().create_stream(request(&model, "flights?", true, include_usage)).await.expect("stream");
            let (chunks, envelope) = split_at_error(collect(stream).await);
            let got = accumulate(&model, &chunks);
            assert_eq!(got.content, content, "{case}");
            assert_eq!(got.finish, None, "{case}: no finish_reason after an error");
            assert_eq!(got.usage_chunks, 0, "{case}: no usage chunk after an error");
            assert_eq!(envelope.error.message, message, "{case}");
            assert_eq!(envelope.error.code.as_deref(), Some(code), "{case}");
            assert_eq!(envelope.error.param, None, "{case}");
            let file = if include_usage { "openai-usage.sse" } else { "openai.sse" };
            assert_same_as_golden(&chunks, golden_chunks(case, file));
        }
    }
}

#[tokio::test]
async fn an_agent_error_is_a_500_with_the_envelope_without_streaming() {
    let server = TestServer::start().await;
    let error = api_error(
        client(&server)
            .chat()
            .create(request("replay/error-mid-stream", "flights?", false, false))
            .await
            .expect_err("the run failed"),
    );
    assert_eq!(error.status_code.as_u16(), 500);
    // async-openai does not parse a 5xx body: the message is the body, which is the envelope.
    let envelope: WrappedError =
        serde_json::from_str(&error.api_error.message).unwrap_or_else(|e| panic!("{e}: {}", error.api_error.message));
    assert_eq!(envelope.error.message, "Upstream API timed out after 30s");
    assert_eq!(envelope.error.code.as_deref(), Some("upstream_timeout"));
    assert_eq!(envelope.error.message, golden_error("error-mid-stream").error.message);
    // async-openai retried three times (it ignores `x-should-retry: false`); each try was a run of its own.
    assert_eq!(server.hub.len(), 4, "one run and three retries");
}

#[tokio::test]
async fn a_cancelled_run_is_a_409_with_the_envelope_without_streaming() {
    let server = TestServer::start().await;
    let error = api_error(
        client(&server)
            .chat()
            .create(request("replay/cancelled", "go", false, false))
            .await
            .expect_err("the run was cancelled"),
    );
    assert_eq!(error.status_code.as_u16(), 409);
    assert_eq!(error.api_error.message, "the stream was cancelled");
    assert_eq!(error.api_error.code.as_deref(), Some("cancelled"));
    assert_eq!(server.hub.len(), 1, "no retry of a 409");
}

// 5. Usage.

#[tokio::test]
async fn usage_comes_last_with_empty_choices_when_asked() {
    let server = TestServer::start().await;
    let client = client(&server);
    let model = "replay/usage";

    let chunks =
        chunks(collect(client.chat().create_stream(request(model, "2+2?", true, true)).await.expect("stream")).await);
    let got = accumulate(model, &chunks);
    assert_eq!(got.content, "Four.");
    assert_eq!(got.finish, Some(FinishReason::Stop));
    assert_eq!(got.usage_chunks, 1);
    let last = chunks.last().expect("last");
    assert!(last.choices.is_empty(), "the usage chunk is last, with choices: []");
    let usage = last.usage.as_ref().expect("usage on the last chunk");
    assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.total_tokens), (12, 5, 17));
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c.usage.is_none()), "usage null on the other chunks");
    assert_same_as_golden(&chunks, golden_chunks("usage", "openai-usage.sse"));

    let chunks = chunks_of(&client, model, false).await;
    let got = accumulate(model, &chunks);
    assert_eq!(got.usage_chunks, 0, "no usage chunk without include_usage");
    assert!(chunks.iter().all(|c| c.usage.is_none() && !c.choices.is_empty()));
    assert_same_as_golden(&chunks, golden_chunks("usage", "openai.sse"));

    let response = client.chat().create(request(model, "2+2?", false, false)).await.expect("a completion");
    assert_eq!(response.usage.as_ref(), Some(usage));
    assert_response_as_golden("usage", &response);
}

async fn chunks_of(
    client: &Client<OpenAIConfig>,
    model: &str,
    include_usage: bool,
) -> Vec<CreateChatCompletionStreamResponse> {
    chunks(
        collect(
            client.chat().create_stream(request(model, "one two three", true, include_usage)).await.expect("stream"),
        )
        .await,
    )
}

#[tokio::test]
async fn echo_reports_usage_in_words_when_asked() {
    let server = TestServer::start().await;
    let client = client(&server);
    let chunks = chunks_of(&client, "echo", true).await;
    let got = accumulate("echo", &chunks);
    assert_eq!(got.content, "one two three");
    assert_eq!(got.usage_chunks, 1);
    assert!(chunks.last().expect("last").choices.is_empty());
    let usage = got.usage.expect("usage");
    assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.total_tokens), (3, 3, 6));

    let chunks = chunks_of(&client, "echo", false).await;
    let got = accumulate("echo", &chunks);
    assert_eq!((got.usage_chunks, got.finish), (0, Some(FinishReason::Stop)));
}

// 6. An unknown model.

#[tokio::test]
async fn an_unknown_model_is_a_404_model_not_found() {
    let server = TestServer::start().await;
    let client = client(&server);
    let streamed = match client.chat().create_stream(request("no-such-model", "hi", true, false)).await {
        Ok(_) => panic!("a stream for an unknown model"),
        Err(error) => api_error(error),
    };
    let answered =
        api_error(client.chat().create(request("no-such-model", "hi", false, false)).await.expect_err("unknown model"));
    for error in [streamed, answered] {
        assert_eq!(error.status_code.as_u16(), 404);
        assert_eq!(error.api_error.code.as_deref(), Some("model_not_found"));
        assert_eq!(error.api_error.r#type.as_deref(), Some("invalid_request_error"));
        assert_eq!(error.api_error.param.as_deref(), Some("model"));
        assert!(error.api_error.message.contains("no-such-model"), "{}", error.api_error.message);
    }
    assert_eq!(server.hub.len(), 0, "no run started, no retry");
}

// 7. Keep-alive comments between chunks.

#[tokio::test]
async fn keep_alive_pings_between_chunks_do_not_disturb_the_client() {
    let mut agents = agentmux::agent::Agents::builtin();
    agents.register("demo", agentmux::agent::DemoAgent { pause: std::time::Duration::from_millis(12) });
    let settings = agentmux::http::Settings { keep_alive: std::time::Duration::from_millis(3), ..Default::default() };
    let server = TestServer::with(agentmux::hub::HubConfig::default(), settings, agents).await;
    let prompt = "Show me what you can do.";

    // The body does carry pings (seen raw), so the client beside it reads through them.
    let raw = async {
        reqwest::Client::new()
            .post(server.url("/v1/chat/completions"))
            .json(&json!({"model": "demo", "stream": true, "messages": [{"role": "user", "content": prompt}]}))
            .send()
            .await
            .expect("send")
            .text()
            .await
            .expect("body")
    };
    let typed = async {
        let stream = client(&server).chat().create_stream(request("demo", prompt, true, true)).await.expect("stream");
        chunks(collect(stream).await)
    };
    let (raw, chunks) = tokio::join!(raw, typed);
    assert!(raw.contains("\n: ping\n\n"), "{raw}");
    assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");

    let got = accumulate("demo", &chunks);
    assert_eq!(got.usage_chunks, 1);
    assert_same_as_golden(&chunks, golden_chunks("demo-agent", "openai-usage.sse"));
}

// 8. Everything async-openai's typed request can carry is accepted.

#[tokio::test]
async fn a_request_with_every_common_field_is_accepted() {
    let server = TestServer::start().await;
    let client = client(&server);
    let image = "data:image/png;base64,iVBORw0KGgo=";
    let body = |stream: bool| {
        json!({
            "model": "echo",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "system", "content": [{"type": "text", "text": "You echo."}]},
                {"role": "user", "name": "ann", "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": image, "detail": "low"}},
                    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                    {"type": "file", "file": {"filename": "a.txt", "file_data": "data:text/plain;base64,aGk="}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a picture"},
                {"role": "assistant", "content": "It is a picture."},
                {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "again"}]}
            ],
            "stream": stream,
            "stream_options": if stream { json!({"include_usage": true, "include_obfuscation": false}) } else { json!(null) },
            "temperature": 0.5, "top_p": 0.9, "max_tokens": 100, "max_completion_tokens": 100, "n": 1,
            "stop": ["\n\n"], "seed": 7, "user": "u1", "metadata": {"k": "v"}, "store": false,
            "frequency_penalty": 0.0, "presence_penalty": 0.0, "logit_bias": {"50256": -100},
            "logprobs": false, "service_tier": "auto", "reasoning_effort": "low", "verbosity": "low",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}},
            "tools": [{"type": "function", "function": {"name": "look", "description": "Looks.",
                "parameters": {"type": "object", "properties": {}}, "strict": false}}],
            "tool_choice": "auto", "parallel_tool_calls": true, "modalities": ["text"],
            "prompt_cache_key": "k", "safety_identifier": "s"
        })
    };
    let typed = |stream: bool| -> CreateChatCompletionRequest {
        let request: CreateChatCompletionRequest =
            serde_json::from_value(body(stream)).expect("async-openai's own type");
        if !stream {
            assert_eq!(request.stream_options, None);
        }
        request
    };

    let chunks = chunks(collect(client.chat().create_stream(typed(true)).await.expect("stream")).await);
    let got = accumulate("echo", &chunks);
    assert_eq!(got.content, "hello\nagain");
    assert_eq!(got.finish, Some(FinishReason::Stop));
    assert_eq!(got.usage_chunks, 1);

    let response = client.chat().create(typed(false)).await.expect("a completion");
    assert_eq!(response.choices[0].message.content.as_deref(), Some("hello\nagain"));
    assert_eq!(response.usage, got.usage);
}

// 9. Every replay, as async-openai reads it.

#[tokio::test]
async fn every_replay_reads_as_its_golden_files() {
    let server = TestServer::start().await;
    let client = client(&server);
    let cases = common::cases();
    assert!(cases.len() > 10, "{cases:?}");
    let runs = cases.iter().map(|case| {
        let client = &client;
        async move {
            let model = format!("replay/{case}");
            let is_error = serde_json::from_slice::<WrappedError>(&common::read(case, "openai.json")).is_ok();
            for (file, include_usage) in [("openai.sse", false), ("openai-usage.sse", true)] {
                let stream =
                    client.chat().create_stream(request(&model, "go", true, include_usage)).await.expect("stream");
                let items = collect(stream).await;
                let chunks = if is_error {
                    let (chunks, envelope) = split_at_error(items);
                    assert_eq!(envelope.error.message, golden_error(case).error.message, "{case}");
                    assert_eq!(envelope.error.code, golden_error(case).error.code, "{case}");
                    chunks
                } else {
                    chunks(items)
                };
                accumulate(&model, &chunks);
                assert_same_as_golden(&chunks, golden_chunks(case, file));
            }
            // A failed run answers 5xx, which async-openai retries for 0.7 s: covered once above.
            if !is_error {
                let response = client.chat().create(request(&model, "go", false, false)).await.expect("a completion");
                assert_response_as_golden(case, &response);
            }
        }
    });
    futures::future::join_all(runs).await;
}

// 10. A client that drops its stream.

/// Runs `demo`, drops the stream after its first chunk and returns how the run ended.
async fn status_after_dropping(server: &TestServer, client: &Client<OpenAIConfig>) -> agentmux::hub::Status {
    let mut stream = client.chat().create_stream(request("demo", "hi", true, false)).await.expect("stream");
    let first = stream.next().await.expect("a first chunk").expect("a chunk");
    // The completion id names the stream's epoch, never its id. The run lasts two seconds: still open here.
    let epoch = first.id.strip_prefix("chatcmpl-").expect("chatcmpl- and the stream's epoch");
    let run = server.hub.open_streams().into_iter().find(|s| s.epoch() == epoch).expect("the run's stream, open");
    drop(stream);
    let ended = async || run.status() != agentmux::hub::Status::Open;
    common::wait::eventually("the run to end", std::time::Duration::from_secs(5), ended).await;
    run.status()
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_run_only_when_asked() {
    let mut agents = agentmux::agent::Agents::builtin();
    agents.register("demo", agentmux::agent::DemoAgent { pause: std::time::Duration::from_millis(20) });
    let server = TestServer::with(agentmux::hub::HubConfig::default(), Default::default(), agents).await;
    let cancelling = OpenAIConfig::new()
        .with_api_base(server.url("/v1"))
        .with_api_key("test")
        .with_header("x-agentmux-on-disconnect", "cancel")
        .expect("a valid header");
    let (plain, cancelling) = (client(&server), Client::with_config(cancelling));
    let (kept, cancelled) =
        tokio::join!(status_after_dropping(&server, &plain), status_after_dropping(&server, &cancelling));
    assert_eq!(kept, agentmux::hub::Status::Completed, "a disconnect alone does not stop the agent");
    assert_eq!(cancelled, agentmux::hub::Status::Cancelled, "x-agentmux-on-disconnect: cancel");
}

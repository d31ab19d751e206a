//! A client nobody here wrote accepts every frame: each golden `openai.sse` is split into events by
//! `eventsource-stream` and every chunk is parsed into async-openai's `CreateChatCompletionStreamResponse`
//! (an `{"error": ...}` event into its `WrappedError`); each `openai.json` into its
//! `CreateChatCompletionResponse`. Then what a client accumulates from the chunks is checked against the
//! non-streaming response of the same case.

mod common;

use std::collections::BTreeMap;
use std::convert::Infallible;

use async_openai::error::WrappedError;
use async_openai::types::chat::{CreateChatCompletionResponse, CreateChatCompletionStreamResponse, FinishReason};
use eventsource_stream::Eventsource;
use futures::StreamExt;

/// What a client reads from one SSE body.
#[derive(Default)]
struct Accumulated {
    chunks: Vec<CreateChatCompletionStreamResponse>,
    error: Option<WrappedError>,
    done: bool,
}

async fn read_sse(body: Vec<u8>) -> Accumulated {
    let mut events = futures::stream::iter([Ok::<_, Infallible>(body)]).eventsource();
    let mut out = Accumulated::default();
    while let Some(event) = events.next().await {
        let event = event.expect("well-formed SSE");
        assert!(!out.done, "an event after [DONE]");
        assert_eq!(event.event, "message", "no event: names on the OpenAI endpoint");
        assert!(event.id.is_empty(), "no id: lines on the OpenAI endpoint");
        if event.data == "[DONE]" {
            out.done = true;
        } else if event.data.contains("\"error\":") && event.data.starts_with("{\"error\"") {
            assert!(out.error.is_none(), "one error at most");
            out.error = Some(serde_json::from_str(&event.data).expect("error event parses as WrappedError"));
        } else {
            assert!(out.error.is_none(), "a chunk after an error");
            let chunk: CreateChatCompletionStreamResponse =
                serde_json::from_str(&event.data).unwrap_or_else(|e| panic!("{e}: {}", event.data));
            out.chunks.push(chunk);
        }
    }
    assert!(out.done, "the stream ends with [DONE]");
    out
}

#[tokio::test]
async fn every_golden_chunk_parses_as_async_openai_types() {
    // Cases whose deltas take text back: the corrected text goes out again on a new line, so the streamed
    // text ends with the final text's last line, after the stale one.
    let degraded = ["replace-and-merge"];
    for case in common::cases() {
        let response_body = common::read(&case, "openai.json");
        let response: Result<CreateChatCompletionResponse, WrappedError> =
            match serde_json::from_slice::<CreateChatCompletionResponse>(&response_body) {
                Ok(response) => Ok(response),
                Err(_) => Err(serde_json::from_slice(&response_body).expect("openai.json: response or error")),
            };
        for file in ["openai.sse", "openai-usage.sse"] {
            let read = read_sse(common::read(&case, file)).await;
            let first = read.chunks.first().expect("at least the role chunk");
            for (i, chunk) in read.chunks.iter().enumerate() {
                assert_eq!((&chunk.id, chunk.created, &chunk.model), (&first.id, first.created, &first.model));
                assert_eq!(chunk.object, "chat.completion.chunk");
                let roles = chunk.choices.iter().filter(|c| c.delta.role.is_some()).count();
                assert_eq!(roles, usize::from(i == 0), "{case}/{file}: role only in the first chunk");
            }
            let mut content = String::new();
            let mut calls: BTreeMap<u32, (String, String, String)> = BTreeMap::new();
            let mut finish = None;
            for choice in read.chunks.iter().flat_map(|c| &c.choices) {
                content.push_str(choice.delta.content.as_deref().unwrap_or(""));
                for call in choice.delta.tool_calls.iter().flatten() {
                    let entry = calls.entry(call.index).or_default();
                    if let Some(id) = &call.id {
                        assert!(entry.0.is_empty(), "{case}: id sent twice for index {}", call.index);
                        entry.0.clone_from(id);
                    }
                    if let Some(function) = &call.function {
                        if let Some(name) = &function.name {
                            entry.1.clone_from(name);
                        }
                        entry.2.push_str(function.arguments.as_deref().unwrap_or(""));
                    }
                }
                if let Some(reason) = choice.finish_reason {
                    assert!(finish.is_none(), "{case}: finish_reason sent twice");
                    finish = Some(reason);
                }
            }
            let usage_chunk = read.chunks.iter().find(|c| c.choices.is_empty());
            match &response {
                Ok(response) => {
                    assert!(read.error.is_none(), "{case}/{file}");
                    let choice = &response.choices[0];
                    assert_eq!(finish, choice.finish_reason, "{case}/{file}");
                    let final_content = choice.message.content.clone().unwrap_or_default();
                    if degraded.contains(&case.as_str()) {
                        assert_ne!(content, final_content, "{case}: the degradation this case shows");
                        let last_line = final_content.lines().last().unwrap_or_default();
                        assert!(
                            content.ends_with(&format!("\n{last_line}")),
                            "{case}/{file}: ends corrected: {content:?}"
                        );
                    } else {
                        assert_eq!(content, final_content, "{case}/{file}");
                    }
                    let final_calls = common::tool_calls(response);
                    assert_eq!(calls.into_values().collect::<Vec<_>>(), final_calls, "{case}/{file}");
                    if finish == Some(FinishReason::ToolCalls) {
                        assert!(!final_calls.is_empty(), "{case}");
                    }
                    let expect_usage = file == "openai-usage.sse" && response.usage.is_some();
                    assert_eq!(usage_chunk.is_some(), expect_usage, "{case}/{file}: usage chunk");
                    if let Some(chunk) = usage_chunk {
                        assert_eq!(chunk.usage, response.usage, "{case}");
                        assert!(std::ptr::eq(chunk, read.chunks.last().expect("last")), "usage chunk is last");
                    }
                }
                Err(error) => {
                    let streamed = read.error.as_ref().expect("the stream carries the same error");
                    assert_eq!(streamed.error.message, error.error.message, "{case}");
                    assert_eq!(streamed.error.code, error.error.code, "{case}");
                    assert!(finish.is_none() && usage_chunk.is_none(), "{case}: nothing after an error");
                }
            }
        }
    }
}

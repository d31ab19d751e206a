//! One model call: the upstream's chunks as typed messages, as they arrive, and what the call said.
//!
//! The call's [`Delta`]s (whatever its dialect) become messages. Text is one streaming `text` message;
//! reasoning one streaming `thinking` (ended when the text begins, or by its signature: a signed block's
//! `signature` is set on its message and the block is kept for the next request; reasoning that comes after
//! opens another); a redacted block a `thinking` message with its `redacted` data;
//! each tool call (by its `index`) one streaming `tool_call`, opened once its name is known (the tool's runner
//! decides `server_side`), its argument fragments as deltas. In text mode, content goes through the reply
//! scanner: text reaches clients live and only what may be an action is held back; at the end a reply that
//! is actions becomes complete tool calls, and one that is the model's error or a malformed attempt becomes
//! an `error` message and ends the run.
//!
//! A run makes one model call per round of its tool loop, so several per run; a thread's turn
//! (`thread::Turn`) is a whole run and its history, which is why this is not called a turn.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::chunks::Chunks;
use super::dialect::Delta;
use super::error::UpstreamError;
use crate::agent::reply::{Reply, ReplyScanner};
use crate::agent::{AgentError, Output, Runner, StreamingMessage, ToolSet};
use crate::output::{OutputMessage, Usage};

/// Why a call stopped short.
#[derive(Debug)]
pub(crate) enum Halt {
    /// The upstream failed.
    Upstream(UpstreamError),
    /// Someone cancelled the stream.
    Cancelled,
    /// The run must end with this error (an emit refused, a malformed reply).
    Agent(AgentError),
}

impl From<crate::hub::AppendError> for Halt {
    fn from(error: crate::hub::AppendError) -> Self {
        Halt::Agent(error.into())
    }
}

/// A complete tool call the model made in this call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) arguments: String,
}

/// What one model call said: its text, the tool calls it made, why it stopped, what it used, and the thinking
/// blocks the provider wants back with the next request (signed or redacted, as Anthropic's content blocks).
#[derive(Debug, Default)]
pub(crate) struct ModelCall {
    pub(crate) text: String,
    pub(crate) thinking: Vec<Value>,
    pub(crate) tool_calls: Vec<Call>,
    pub(crate) finish_reason: Option<String>,
    pub(crate) usage: Option<Usage>,
}

/// A tool call as it streams.
struct Streaming {
    id: String,
    name: String,
    arguments: String,
    message: Option<StreamingMessage>,
}

/// The thinking block being streamed: its message and its text so far.
struct Thinking {
    message: StreamingMessage,
    text: String,
}

/// Reads `chunks` to the end, emitting through `out`; stops at once when `out`'s stream is cancelled.
pub(crate) async fn read(
    mut chunks: Chunks,
    out: &Output,
    tools: &ToolSet,
    text_mode: bool,
    ids: &mut u32,
) -> Result<ModelCall, Halt> {
    let cancelled = out.cancelled();
    tokio::pin!(cancelled);
    let mut said = ModelCall::default();
    let mut text: Option<StreamingMessage> = None;
    let mut thinking: Option<Thinking> = None;
    let mut calls: BTreeMap<u32, Streaming> = BTreeMap::new();
    let mut scanner = text_mode.then(ReplyScanner::new);
    loop {
        let deltas = tokio::select! {
            biased;
            () = &mut cancelled => return Err(Halt::Cancelled),
            deltas = chunks.next() => deltas.map_err(Halt::Upstream)?,
        };
        let Some(deltas) = deltas else { break };
        for delta in deltas {
            match delta {
                Delta::Usage(usage) => said.usage = Some(usage),
                Delta::Finish(reason) => said.finish_reason = Some(reason),
                Delta::Thinking(reasoning) => {
                    let block = thinking
                        .get_or_insert_with(|| Thinking { message: out.stream_thinking(), text: String::new() });
                    block.text.push_str(&reasoning);
                    block.message.append(reasoning)?;
                }
                Delta::Signature(signature) => {
                    // A signed block is over; it goes back to the provider with the next request.
                    let block = thinking
                        .take()
                        .unwrap_or_else(|| Thinking { message: out.stream_thinking(), text: String::new() });
                    let mut message = block.message;
                    message.set("signature", signature.as_str())?;
                    message.end()?;
                    said.thinking.push(json!({"type": "thinking", "thinking": block.text, "signature": signature}));
                }
                Delta::RedactedThinking(data) => {
                    let props = json!({"content": "", "redacted": data});
                    out.send(OutputMessage::new("thinking", props.as_object().cloned().unwrap_or_default()))?;
                    said.thinking.push(json!({"type": "redacted_thinking", "data": data}));
                }
                Delta::Text(content) => {
                    // The answer has begun: the reasoning before it is over.
                    if let Some(done) = thinking.take() {
                        done.message.end()?;
                    }
                    let live = match &mut scanner {
                        Some(scanner) => scanner.push(&content),
                        None => content,
                    };
                    if !live.is_empty() {
                        said.text.push_str(&live);
                        text.get_or_insert_with(|| out.stream_text()).append(live)?;
                    }
                }
                Delta::ToolCall { index, id, name, arguments } => {
                    let index = index.unwrap_or(calls.len() as u32);
                    stream_call(&mut calls, index, (id, name, arguments), out, tools, ids)?;
                }
            }
        }
    }
    if let Some(scanner) = scanner {
        finish_text_mode(scanner, &mut said, &mut text, out, tools, ids)?;
    }
    for message in [text, thinking.map(|t| t.message)].into_iter().flatten() {
        message.end()?;
    }
    for (_, call) in calls {
        if let Some(message) = call.message {
            message.end()?;
            said.tool_calls.push(Call { id: call.id, name: call.name, arguments: call.arguments });
        }
    }
    Ok(said)
}

/// Applies one streamed fragment (id, name, arguments) of the tool call at `index` to the call it continues:
/// its message starts once the call has a name (with an id made up if the upstream gave none), and each
/// fragment of arguments after that is appended to it.
fn stream_call(
    calls: &mut BTreeMap<u32, Streaming>,
    index: u32,
    (id, name, fragment): (Option<String>, Option<String>, String),
    out: &Output,
    tools: &ToolSet,
    ids: &mut u32,
) -> Result<(), Halt> {
    let state = calls.entry(index).or_insert_with(|| Streaming {
        id: String::new(),
        name: String::new(),
        arguments: String::new(),
        message: None,
    });
    if let Some(id) = id.filter(|id| !id.is_empty() && state.id.is_empty()) {
        state.id = id;
    }
    if let Some(name) = name.filter(|n| !n.is_empty() && state.name.is_empty()) {
        state.name = name;
    }
    state.arguments.push_str(&fragment);
    if state.message.is_none() && !state.name.is_empty() {
        if state.id.is_empty() {
            *ids += 1;
            state.id = format!("call_{ids}");
        }
        let mut message = match tools.runner(&state.name) {
            Some(Runner::Agent(_)) => out.stream_server_tool_call(&state.id, &state.name),
            _ => out.stream_tool_call(&state.id, &state.name),
        };
        message.append(state.arguments.clone())?;
        state.message = Some(message);
    } else if let Some(message) = state.message.as_mut().filter(|_| !fragment.is_empty()) {
        message.append(fragment)?;
    }
    Ok(())
}

/// The end of a text-mode reply: what the scanner held back is text after all, or the tool calls the reply
/// asked for (emitted whole), or the model's own error, or a malformed attempt at a call (both end the run).
fn finish_text_mode(
    scanner: ReplyScanner,
    said: &mut ModelCall,
    text: &mut Option<StreamingMessage>,
    out: &Output,
    tools: &ToolSet,
    ids: &mut u32,
) -> Result<(), Halt> {
    match scanner.finish() {
        Reply::Text(rest) => {
            if !rest.is_empty() {
                said.text.push_str(&rest);
                text.get_or_insert_with(|| out.stream_text()).append(rest)?;
            }
        }
        Reply::Actions(actions) => {
            for action in actions {
                *ids += 1;
                let id = format!("call_{ids}");
                let arguments = action.args.to_string();
                let mut message = match tools.runner(&action.tool) {
                    Some(Runner::Agent(_)) => {
                        OutputMessage::tool_call(&id, &action.tool, &arguments).with_prop("server_side", true)
                    }
                    _ => OutputMessage::tool_call(&id, &action.tool, &arguments),
                };
                message.message_id = None;
                out.send(message)?;
                said.tool_calls.push(Call { id, name: action.tool, arguments });
            }
        }
        Reply::ModelError { code, message } => {
            return Err(Halt::Agent(fail(out, format!("the model reported an error: {message}"), &code)?));
        }
        Reply::Malformed { reason } => {
            let why = format!("the model's reply looks like a tool call but cannot be read: {reason}");
            return Err(Halt::Agent(fail(out, why, "parse_error")?));
        }
    }
    Ok(())
}

/// Emits an `error` message with `code` and returns the error the run ends with.
pub(crate) fn fail(out: &Output, message: String, code: &str) -> Result<AgentError, Halt> {
    let mut error = OutputMessage::error(&message);
    error.props.insert("code".into(), code.into());
    out.send(error)?;
    Ok(AgentError::new(message).with_code(code))
}

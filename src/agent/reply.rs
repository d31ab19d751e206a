//! The text-mode reply parser: what a model without native tool calling meant by its reply.
//!
//! Such a model is told to answer with plain text, or with ONLY `{"type": "action", "tool": "<name>",
//! "args": {...}}`, or with ONLY `{"type": "error", "code": "...", "message": "..."}`. This module reads the
//! reply back: [`parse_reply`] for a whole reply, [`ReplyScanner`] for one that arrives in fragments, whose
//! text must reach clients live. It knows nothing of HTTP, the hub or tool registries: whether the tool
//! exists and whether the arguments fit its schema is the caller's check, so an [`Action`] carries the
//! name and the arguments as they were written.
//!
//! Parsing is never silent and never fooled, so the rules are few and strict, and every "no" says why.
//!
//! # The rules
//!
//! Whitespace: the reply is judged trimmed (`char::is_whitespace` at both ends), but [`Reply::Text`] always
//! carries the reply exactly as it came, leading and trailing whitespace included.
//!
//! 1. **Text unless it starts like JSON.** A reply whose trimmed text does not start with `{` or with a
//!    code fence of three or more backticks is [`Reply::Text`], whatever JSON it quotes later: an example in
//!    a sentence, a quoted object, a fence after prose, a stray `}`.
//! 2. **Blocks.** A reply that starts like JSON is read as a sequence of blocks separated by whitespace only.
//!    A block is either a bare JSON object (where it ends is found by parsing it), or a fenced code block:
//!    a line of three or more backticks with an optional language, the body, and a closing line of at least
//!    as many backticks and nothing else. Only a fence with no language or the language `json` (any case)
//!    can carry an action; a fence in another language is code shown to the user.
//! 3. **Anything else in the reply makes it text.** Blocks are read from the start. Prose before, between or
//!    after them (even one comma), or a fence in another language, makes the whole reply [`Reply::Text`]:
//!    an action followed by an explanation is text, and so is a plain code block with prose after it.
//! 4. **Where "tries to be an action" begins.** If reading meets a block that cannot be read before any
//!    such prose, where the blocks end is unknown, so the whole reply is judged at once: it is
//!    [`Reply::Malformed`] (the reason says what could not be read) when it mentions `type: action` or
//!    `type: error` anywhere (each word quoted with `"` or `'`, or not, any whitespace around the colon),
//!    and [`Reply::Text`] otherwise. Cannot be read means: a bare object that is not valid JSON (truncated,
//!    a trailing comma, single quotes, unquoted words, a duplicate key: `{type: action} is what I'd send`
//!    is malformed, `{name} is a placeholder` is text), a bare or `json` fence that is never closed, or a
//!    fence whose opening line never ends or holds more than a language name (a one-line fence, or
//!    `python title="a.py"`). A bare or `json` fence that
//!    closes but whose body is not one valid JSON value is judged alone: malformed if its body mentions such
//!    a type, otherwise an ordinary block (rule 5).
//! 5. **Blocks that parse.** A JSON object whose `"type"` is exactly `"action"` is an action; exactly
//!    `"error"`, an error; anything else (no `type`, another type, not an object) is an ordinary block,
//!    like a JSON answer the user asked for. Then:
//!    - no action and no error: [`Reply::Text`];
//!    - one or more actions and nothing else: [`Reply::Actions`], in order, like parallel tool calls. This
//!      is how a reply makes several calls: complete action objects, bare or each in its own fence (in any
//!      mix), with only whitespace between them;
//!    - exactly one error and nothing else: [`Reply::ModelError`];
//!    - any other mix (an action with an ordinary block, an action with an error, two errors), or an
//!      action or error of the wrong shape: [`Reply::Malformed`].
//! 6. **Shapes.** An action has only the keys `type`, `tool` and `args`: `tool` a non-empty string, `args`
//!    an object, `{}` when absent (`null` is not absent). An unknown key is refused rather than ignored, so
//!    that `"arguments"` for `"args"` is not silently a call without arguments. An error has a string
//!    `message` and an optional string `code` (`model_error` when absent, null or blank); other keys are
//!    ignored, since nothing runs on an error. A duplicate key anywhere is invalid JSON (rule 4), so what
//!    is shown and what runs cannot differ.
//!
//! # Streaming
//!
//! [`ReplyScanner::push`] takes fragments and returns the text that is safe to emit now. While the reply so
//! far (leading whitespace aside) could still be a block, everything is held back; once it cannot be an
//! action, everything held is released and the rest streams through as it comes. "Cannot" is decided as
//! soon as it is certain: the first non-whitespace character is neither `{` nor the start of a fence; or the
//! first block is a fence in another language (known at the end of its opening line); or the first block
//! is complete (a valid object, or a fence whose closing line has ended) and prose follows it. Otherwise
//! the reply is held to the end, and [`ReplyScanner::finish`] gives what [`parse_reply`] gives for the whole
//! reply, except that [`Reply::Text`] then holds only what was not emitted yet. So the text emitted plus
//! that rest is the whole reply, byte for byte, and a held reply that turns out to be text (a plain code
//! block followed by nothing) is emitted at the end.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::output::kind_name;

/// What a model meant by its reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    /// Plain text, to show as it is (from [`ReplyScanner::finish`], only the part not emitted yet).
    Text(String),
    /// One or more tool calls, in order. Never empty.
    Actions(Vec<Action>),
    /// The model reports that it cannot go on.
    ModelError {
        /// For programs; `model_error` when the model gave none.
        code: String,
        /// For a person.
        message: String,
    },
    /// The reply tried to be an action or an error and is not one: why, for a person and for the model.
    Malformed {
        /// What is wrong, e.g. `the action has no "tool"`.
        reason: String,
    },
}

/// One tool call as the model wrote it. Whether the tool exists and the arguments fit is the caller's check.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Action {
    /// The tool's name, exactly as written (never empty).
    pub(crate) tool: String,
    /// The arguments: always a JSON object, `{}` when the model gave none.
    pub(crate) args: Value,
}

/// Reads a whole reply by the rules in the module documentation. Never panics.
pub(crate) fn parse_reply(text: &str) -> Reply {
    let trimmed = text.trim();
    if !starts_like_json(trimmed) {
        return Reply::Text(text.to_owned());
    }
    match read_blocks(trimmed) {
        Blocks::Mixed => Reply::Text(text.to_owned()),
        Blocks::Unreadable(reason) if mentions_type(trimmed) => Reply::Malformed { reason },
        Blocks::Unreadable(_) => Reply::Text(text.to_owned()),
        Blocks::Read(blocks) => judge(blocks, text),
    }
}

/// Whether a trimmed reply could be blocks at all (rule 1).
fn starts_like_json(trimmed: &str) -> bool {
    trimmed.starts_with('{') || trimmed.starts_with(FENCE)
}

/// The shortest code fence.
const FENCE: &str = "```";

/// A trimmed reply read as blocks (rule 2), or why not.
enum Blocks {
    /// Every block, in order.
    Read(Vec<Block>),
    /// Prose or a fence in another language: text, whatever else is there.
    Mixed,
    /// A block that cannot be read, so where the blocks end is unknown.
    Unreadable(String),
}

/// One block of a reply.
enum Block {
    /// A bare object, or the body of a fence, that is valid JSON.
    Json(Value),
    /// A fence whose body is not valid JSON: why, and whether it mentions an action or error type.
    BadBody { reason: String, attempted: bool },
}

fn read_blocks(trimmed: &str) -> Blocks {
    let mut blocks = Vec::new();
    let mut rest = trimmed;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Blocks::Read(blocks);
        }
        if rest.starts_with('{') {
            match first_object(rest) {
                Ok((value, end)) => {
                    blocks.push(Block::Json(value));
                    rest = rest.get(end..).unwrap_or_default();
                }
                Err(reason) => return Blocks::Unreadable(reason),
            }
        } else if rest.starts_with(FENCE) {
            match read_fence(rest) {
                Fence::Closed { body, end } => {
                    blocks.push(match parse_one(body.trim()) {
                        Ok(value) => Block::Json(value),
                        Err(error) => Block::BadBody {
                            reason: format!("the fenced block is not valid JSON: {error}"),
                            attempted: mentions_type(body),
                        },
                    });
                    rest = rest.get(end..).unwrap_or_default();
                }
                Fence::OtherLanguage => return Blocks::Mixed,
                Fence::Unclosed => {
                    return Blocks::Unreadable("the code fence is never closed".to_owned());
                }
                Fence::BadOpening => {
                    return Blocks::Unreadable(
                        "a code fence must open on a line of its own (```json), with the JSON on the next line"
                            .to_owned(),
                    );
                }
            }
        } else {
            return Blocks::Mixed;
        }
    }
}

/// The JSON object at the start of `text` and the byte offset where it ends.
fn first_object(text: &str) -> Result<(Value, usize), String> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Strict>();
    match stream.next() {
        Some(Ok(Strict(value))) => Ok((value, stream.byte_offset())),
        Some(Err(error)) => Err(format!("the reply is not valid JSON: {error}")),
        None => Err("the reply is not valid JSON: it is empty".to_owned()),
    }
}

/// `text` as exactly one JSON value.
fn parse_one(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<Strict>(text).map(|Strict(value)| value)
}

/// A code fence at the start of a text.
#[derive(Debug, PartialEq)]
enum Fence<'a> {
    /// A bare or `json` fence, closed: its body, and the byte offset just past the closing line.
    Closed { body: &'a str, end: usize },
    /// A fence in another language: code to show.
    OtherLanguage,
    /// A bare or `json` fence with no closing line.
    Unclosed,
    /// The opening line holds more than a language, or does not end.
    BadOpening,
}

/// Reads the fence that `text` starts with (it starts with at least three backticks).
fn read_fence(text: &str) -> Fence<'_> {
    let ticks = leading_backticks(text);
    let after = text.get(ticks..).unwrap_or_default();
    let Some(newline) = after.find('\n') else {
        return Fence::BadOpening;
    };
    match language(after.get(..newline).unwrap_or_default()) {
        Language::Json => {}
        Language::Other => return Fence::OtherLanguage,
        Language::Bad => return Fence::BadOpening,
    }
    let body_start = ticks + newline + 1;
    let mut line_start = body_start;
    for line in text.get(body_start..).unwrap_or_default().split_inclusive('\n') {
        let line_end = line_start + line.len();
        if closes(line, ticks) {
            return Fence::Closed { body: text.get(body_start..line_start).unwrap_or_default(), end: line_end };
        }
        line_start = line_end;
    }
    Fence::Unclosed
}

fn leading_backticks(text: &str) -> usize {
    text.bytes().take_while(|&byte| byte == b'`').count()
}

/// What the rest of a fence's opening line says.
enum Language {
    /// Nothing, or `json` in any case.
    Json,
    /// One word naming another language.
    Other,
    /// Anything else, like the JSON of a one-line fence.
    Bad,
}

fn language(info: &str) -> Language {
    let info = info.trim();
    if info.is_empty() || info.eq_ignore_ascii_case("json") {
        Language::Json
    } else if info.chars().all(|c| c.is_ascii_alphanumeric() || "+-_.#".contains(c)) {
        Language::Other
    } else {
        Language::Bad
    }
}

/// Whether `line` closes a fence opened with `ticks` backticks.
fn closes(line: &str, ticks: usize) -> bool {
    let line = line.trim();
    line.len() >= ticks && leading_backticks(line) == line.len()
}

/// Whether `text` mentions `type: action` or `type: error`, quoted with `"` or `'` or not, with any
/// whitespace around the colon: what makes unreadable JSON an attempt rather than text (rule 4).
fn mentions_type(text: &str) -> bool {
    fn skip_quote(text: &str) -> &str {
        text.strip_prefix(['"', '\'']).unwrap_or(text)
    }
    text.match_indices("type").any(|(at, word)| {
        let after = text.get(at + word.len()..).unwrap_or_default();
        let Some(value) = skip_quote(after).trim_start().strip_prefix(':') else {
            return false;
        };
        let value = skip_quote(value.trim_start());
        value.starts_with("action") || value.starts_with("error")
    })
}

/// Judges blocks that all parsed or failed alone (rules 5 and 6). `text` is the whole reply.
fn judge(blocks: Vec<Block>, text: &str) -> Reply {
    let count = blocks.len();
    let mut actions = Vec::new();
    let mut errors = Vec::new();
    let mut ordinary = Vec::new();
    let mut problems = Vec::new();
    for (index, block) in blocks.into_iter().enumerate() {
        let number = index + 1;
        match block {
            Block::Json(value) => match kind(value) {
                Kind::Action(Ok(action)) => actions.push(action),
                Kind::Error(Ok(error)) => errors.push(error),
                Kind::Action(Err(reason)) | Kind::Error(Err(reason)) => problems.push((number, reason)),
                Kind::Ordinary => ordinary.push(number),
            },
            Block::BadBody { reason, attempted: true } => problems.push((number, reason)),
            Block::BadBody { attempted: false, .. } => ordinary.push(number),
        }
    }
    if let Some((number, reason)) = problems.into_iter().next() {
        let reason = if count > 1 { format!("block {number} of {count}: {reason}") } else { reason };
        return Reply::Malformed { reason };
    }
    if actions.is_empty() && errors.is_empty() {
        return Reply::Text(text.to_owned());
    }
    if let Some(number) = ordinary.first() {
        return Reply::Malformed {
            reason: format!(
                "block {number} of {count} is neither an action nor an error; a reply with an action or an \
                 error holds nothing else"
            ),
        };
    }
    let mut errors = errors.into_iter();
    match (actions.is_empty(), errors.next(), errors.next()) {
        (false, None, _) => Reply::Actions(actions),
        (true, Some((code, message)), None) => Reply::ModelError { code, message },
        (true, None, _) => Reply::Text(text.to_owned()),
        (false, Some(_), _) => {
            Reply::Malformed { reason: "a reply holds either actions or one error, not both".to_owned() }
        }
        (true, Some(_), Some(_)) => Reply::Malformed { reason: "a reply holds one error at most".to_owned() },
    }
}

/// What a parsed block is.
enum Kind {
    Action(Result<Action, String>),
    Error(Result<(String, String), String>),
    Ordinary,
}

fn kind(value: Value) -> Kind {
    let Value::Object(object) = value else {
        return Kind::Ordinary;
    };
    match object.get("type").and_then(Value::as_str) {
        Some("action") => Kind::Action(action(object)),
        Some("error") => Kind::Error(error(object)),
        _ => Kind::Ordinary,
    }
}

fn action(mut object: Map<String, Value>) -> Result<Action, String> {
    if let Some(key) = object.keys().find(|key| !matches!(key.as_str(), "type" | "tool" | "args")) {
        return Err(format!("an action has only \"type\", \"tool\" and \"args\", not {key:?}"));
    }
    let tool = match object.remove("tool") {
        Some(Value::String(tool)) if !tool.trim().is_empty() => tool,
        Some(Value::String(_)) => return Err("the action's \"tool\" is empty".to_owned()),
        Some(other) => return Err(format!("the action's \"tool\" must be a string, not {}", kind_name(&other))),
        None => return Err("the action has no \"tool\"".to_owned()),
    };
    let args = match object.remove("args") {
        None => Value::Object(Map::new()),
        Some(args @ Value::Object(_)) => args,
        Some(other) => return Err(format!("the action's \"args\" must be an object, not {}", kind_name(&other))),
    };
    Ok(Action { tool, args })
}

fn error(mut object: Map<String, Value>) -> Result<(String, String), String> {
    let code = match object.remove("code") {
        Some(Value::String(code)) if !code.trim().is_empty() => code,
        None | Some(Value::Null) | Some(Value::String(_)) => "model_error".to_owned(),
        Some(other) => return Err(format!("the error's \"code\" must be a string, not {}", kind_name(&other))),
    };
    match object.remove("message") {
        Some(Value::String(message)) => Ok((code, message)),
        Some(other) => Err(format!("the error's \"message\" must be a string, not {}", kind_name(&other))),
        None => Err("the error has no \"message\"".to_owned()),
    }
}

/// A JSON value whose objects have no duplicate keys at any depth (a duplicate is a parse error), so that a
/// later `"tool"` or `"path"` cannot override what a reader of the reply sees first.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            let Strict(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Reads a reply as it streams: releases text as soon as it is certainly text, holds back what could still
/// be an action (see "Streaming" in the module documentation).
///
/// Everything [`push`](Self::push) returns, followed by the [`Reply::Text`] that [`finish`](Self::finish)
/// returns, is the whole reply, byte for byte; any other ending means `push` returned only empty strings.
#[derive(Debug, Default)]
pub(crate) struct ReplyScanner {
    /// What has come and is not released yet (empty once live).
    held: String,
    state: Scan,
}

/// How far a [`ReplyScanner`] has read. Offsets are byte offsets into `held`, always at char boundaries.
#[derive(Debug)]
enum Scan {
    /// Only whitespace so far, up to `from`.
    Blank { from: usize },
    /// Starts with the `{` at `start`; `braces` looks for where that object closes.
    Object { start: usize, braces: Braces },
    /// Starts with backticks at `start`; the opening line has not ended, and has no newline before `seen`.
    FenceOpening { start: usize, seen: usize },
    /// Inside a bare or `json` fence of `ticks` backticks; the next line starts at `line`, and has no
    /// newline before `seen`.
    FenceBody { ticks: usize, line: usize, seen: usize },
    /// The first block is complete and valid; only whitespace from its end to `from`.
    After { from: usize },
    /// Could be an action until the end.
    Hold,
    /// Text: everything so far was released, the rest passes through.
    Live,
}

impl Default for Scan {
    fn default() -> Self {
        Scan::Blank { from: 0 }
    }
}

/// Finds where a JSON object closes, fed as it grows: counts braces outside strings.
#[derive(Debug)]
struct Braces {
    /// The next byte to look at.
    at: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Braces {
    fn new(start: usize) -> Self {
        Braces { at: start, depth: 0, in_string: false, escaped: false }
    }

    /// Reads `text` on from where it stopped; the offset just past the closing brace once it comes.
    fn feed(&mut self, text: &str) -> Option<usize> {
        let bytes = text.as_bytes();
        while let Some(&byte) = bytes.get(self.at) {
            self.at += 1;
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if byte == b'\\' {
                    self.escaped = true;
                } else if byte == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' => self.depth += 1,
                b'}' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(self.at);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

impl ReplyScanner {
    /// A scanner for a new reply.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Takes the next fragment; returns the text that is safe to emit now (often empty while held back).
    pub(crate) fn push(&mut self, fragment: &str) -> String {
        if matches!(self.state, Scan::Live) {
            return fragment.to_owned();
        }
        self.held.push_str(fragment);
        self.advance();
        if matches!(self.state, Scan::Live) { std::mem::take(&mut self.held) } else { String::new() }
    }

    /// Ends the reply: what [`parse_reply`] says of the whole reply, except that [`Reply::Text`] holds only
    /// what [`push`](Self::push) has not returned yet (empty when the reply streamed live).
    pub(crate) fn finish(self) -> Reply {
        match self.state {
            Scan::Live => Reply::Text(self.held),
            _ => parse_reply(&self.held),
        }
    }

    /// Moves the state on as far as `held` allows.
    fn advance(&mut self) {
        loop {
            let held = self.held.as_str();
            let next = match &mut self.state {
                Scan::Blank { from } => {
                    let rest = held.get(*from..).unwrap_or_default();
                    let trimmed = rest.trim_start();
                    let start = *from + (rest.len() - trimmed.len());
                    match trimmed.chars().next() {
                        None => {
                            *from = start;
                            return;
                        }
                        Some('{') => Scan::Object { start, braces: Braces::new(start) },
                        Some('`') => Scan::FenceOpening { start, seen: start },
                        Some(_) => Scan::Live,
                    }
                }
                Scan::Object { start, braces } => match braces.feed(held) {
                    None => return,
                    Some(end) => match held.get(*start..end).map(parse_one) {
                        Some(Ok(_)) => Scan::After { from: end },
                        _ => Scan::Hold,
                    },
                },
                Scan::FenceOpening { start, seen } => {
                    let rest = held.get(*start..).unwrap_or_default();
                    let ticks = leading_backticks(rest);
                    if ticks == rest.len() {
                        return; // more backticks may come
                    }
                    if ticks < FENCE.len() {
                        Scan::Live
                    } else {
                        let search = (*seen).max(*start + ticks);
                        match held.get(search..).and_then(|tail| tail.find('\n')) {
                            None => {
                                *seen = held.len();
                                return;
                            }
                            Some(offset) => {
                                let newline = search + offset;
                                match language(held.get(*start + ticks..newline).unwrap_or_default()) {
                                    Language::Json => Scan::FenceBody { ticks, line: newline + 1, seen: newline + 1 },
                                    Language::Other => Scan::Live,
                                    Language::Bad => Scan::Hold,
                                }
                            }
                        }
                    }
                }
                Scan::FenceBody { ticks, line, seen } => {
                    let search = (*seen).max(*line);
                    match held.get(search..).and_then(|tail| tail.find('\n')) {
                        None => {
                            *seen = held.len();
                            return;
                        }
                        Some(offset) => {
                            let end = search + offset + 1;
                            if closes(held.get(*line..end).unwrap_or_default(), *ticks) {
                                Scan::After { from: end }
                            } else {
                                *line = end;
                                *seen = end;
                                continue;
                            }
                        }
                    }
                }
                Scan::After { from } => {
                    let rest = held.get(*from..).unwrap_or_default();
                    let trimmed = rest.trim_start();
                    *from += rest.len() - trimmed.len();
                    if trimmed.is_empty() || (trimmed.len() < FENCE.len() && FENCE.starts_with(trimmed)) {
                        return; // a second block may be starting
                    }
                    if trimmed.starts_with('{') || trimmed.starts_with(FENCE) { Scan::Hold } else { Scan::Live }
                }
                Scan::Hold | Scan::Live => return,
            };
            self.state = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// What a table case should parse to.
    enum Want {
        Text,
        /// Tool names and their arguments as JSON.
        Calls(&'static [(&'static str, &'static str)]),
        Error(&'static str, &'static str),
        /// Words the reason must contain.
        Malformed(&'static str),
    }

    use Want::{Calls, Error, Malformed, Text};

    const READ: &str = r#"{"type": "action", "tool": "fs.read", "args": {"path": "README.md"}}"#;
    const READ_CALL: &[(&str, &str)] = &[("fs.read", r#"{"path": "README.md"}"#)];
    const TWO_CALLS: &[(&str, &str)] = &[("a", r#"{"n": 1}"#), ("b", "{}")];

    const CASES: &[(&str, &str, Want)] = &[
        ("plain text", "Hello, world!", Text),
        ("a clean action", READ, Calls(READ_CALL)),
        (
            "a pretty-printed action with whitespace around it",
            "\n  {\n    \"type\": \"action\",\n    \"tool\": \"fs.read\",\n    \"args\": {\n      \"path\": \"README.md\"\n    }\n  }\n\n",
            Calls(READ_CALL),
        ),
        (
            "an action in a json fence",
            "```json\n{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {\"path\": \"README.md\"}}\n```",
            Calls(READ_CALL),
        ),
        (
            "an action in a bare fence",
            "```\n{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {\"path\": \"README.md\"}}\n```\n",
            Calls(READ_CALL),
        ),
        (
            "an action in a JSON fence, upper case, four backticks",
            "  ````JSON\n{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {\"path\": \"README.md\"}}\n````  \n",
            Calls(READ_CALL),
        ),
        ("an action without args", r#"{"type":"action","tool":"clock.now"}"#, Calls(&[("clock.now", "{}")])),
        (
            "JSON in an example sentence",
            r#"Here is an example: {"type":"action","tool":"fs.read","args":{"path":"a"}}"#,
            Text,
        ),
        (
            "JSON quoted in prose",
            r#"The model once wrote "{\"type\": \"action\", \"tool\": \"x\"}" and nothing ran."#,
            Text,
        ),
        ("JSON in a block quote", "> {\"type\": \"action\", \"tool\": \"x\"}", Text),
        (
            "two bare actions",
            "{\"type\": \"action\", \"tool\": \"a\", \"args\": {\"n\": 1}}\n\n{\"type\": \"action\", \"tool\": \"b\"}",
            Calls(TWO_CALLS),
        ),
        (
            "two bare actions with nothing between them",
            r#"{"type":"action","tool":"a","args":{"n":1}}{"type":"action","tool":"b"}"#,
            Calls(TWO_CALLS),
        ),
        (
            "two fenced actions",
            "```json\n{\"type\": \"action\", \"tool\": \"a\", \"args\": {\"n\": 1}}\n```\n\n```json\n{\"type\": \"action\", \"tool\": \"b\"}\n```\n",
            Calls(TWO_CALLS),
        ),
        (
            "a bare and a fenced action",
            "{\"type\": \"action\", \"tool\": \"a\", \"args\": {\"n\": 1}}\n```\n{\"type\": \"action\", \"tool\": \"b\"}\n```",
            Calls(TWO_CALLS),
        ),
        (
            "two actions with a comma between them",
            r#"{"type":"action","tool":"a"}, {"type":"action","tool":"b"}"#,
            Text,
        ),
        ("actions in a JSON array", r#"[{"type":"action","tool":"a"}]"#, Text),
        (
            "an action, then prose",
            "{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {}}\nI will now read the file.",
            Text,
        ),
        ("prose, then an action", "Let me read it.\n{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {}}", Text),
        (
            "prose, then a fenced action",
            "Let me read it.\n```json\n{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {}}\n```",
            Text,
        ),
        (
            "a fenced action, then prose",
            "```json\n{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {}}\n```\nThis reads the file.",
            Text,
        ),
        (
            "a truncated action",
            "{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {\"path\": \"a\"}",
            Malformed("not valid JSON"),
        ),
        ("an action in single quotes", "{'type': 'action', 'tool': 'fs.read'}", Malformed("not valid JSON")),
        ("an action with a trailing comma", r#"{"type": "action", "tool": "x",}"#, Malformed("not valid JSON")),
        (
            "broken JSON, then prose, that attempts an action",
            "{type: action, tool: fs.read} is what I would send",
            Malformed("not valid JSON"),
        ),
        ("an action without a tool", r#"{"type": "action", "args": {"path": "a"}}"#, Malformed(r#"no "tool""#)),
        ("an action with an empty tool", r#"{"type": "action", "tool": " "}"#, Malformed("empty")),
        ("an action whose tool is a number", r#"{"type": "action", "tool": 7}"#, Malformed("not a number")),
        (
            "args that are a string",
            r#"{"type": "action", "tool": "fs.read", "args": "{\"path\": \"a\"}"}"#,
            Malformed(r#""args" must be an object, not a string"#),
        ),
        ("args that are null", r#"{"type": "action", "tool": "x", "args": null}"#, Malformed("not null")),
        ("args that are an array", r#"{"type": "action", "tool": "x", "args": [1]}"#, Malformed("not an array")),
        (
            "arguments instead of args",
            r#"{"type": "action", "tool": "x", "arguments": {"a": 1}}"#,
            Malformed(r#"not "arguments""#),
        ),
        ("a duplicate tool", r#"{"type": "action", "tool": "a", "tool": "b"}"#, Malformed(r#"duplicate key "tool""#)),
        (
            "a duplicate key deep in args",
            r#"{"type": "action", "tool": "a", "args": {"p": {"x": 1, "x": 2}}}"#,
            Malformed("duplicate key"),
        ),
        ("an unknown type value", r#"{"type": "answer", "text": "42"}"#, Text),
        ("type in another case", r#"{"type": "Action", "tool": "x"}"#, Text),
        ("type that is not a string", r#"{"type": 1, "tool": "x"}"#, Text),
        ("a JSON object that is not an action", "{\"name\": \"Ada\", \"born\": 1815}\n", Text),
        ("a fenced JSON answer", "```json\n{\"name\": \"Ada\"}\n```", Text),
        ("a fenced JSON answer that is not valid", "```json\n{\"name\": \"Ada\",}\n```", Text),
        ("an empty object", "{}", Text),
        (
            "an error reply",
            r#"{"type": "error", "code": "permission_denied", "message": "I may not read that file"}"#,
            Error("permission_denied", "I may not read that file"),
        ),
        ("an error reply without a code", r#"{"type": "error", "message": "stuck"}"#, Error("model_error", "stuck")),
        (
            "an error reply with a blank code and more keys",
            r#"{"type": "error", "code": "", "message": "stuck", "hint": "ask"}"#,
            Error("model_error", "stuck"),
        ),
        (
            "a fenced error reply",
            "```json\n{\"type\": \"error\", \"code\": \"tool_not_found\", \"message\": \"no such tool\"}\n```",
            Error("tool_not_found", "no such tool"),
        ),
        ("an error reply without a message", r#"{"type": "error", "code": "x"}"#, Malformed(r#"no "message""#)),
        (
            "an error whose code is a number",
            r#"{"type": "error", "code": 4, "message": "m"}"#,
            Malformed("not a number"),
        ),
        ("a broken error reply", r#"{"type": "error", "message": "m""#, Malformed("not valid JSON")),
        ("unicode text", "Grüße, 世界! 🌍 Ça va ? ٣", Text),
        (
            "unicode args",
            r#"{"type":"action","tool":"fs.write","args":{"path":"données/日本.txt","content":"🌍 ünïcödé \u00e9"}}"#,
            Calls(&[("fs.write", r#"{"path": "données/日本.txt", "content": "🌍 ünïcödé é"}"#)]),
        ),
        ("a unicode tool name", "{\"type\":\"action\",\"tool\":\"écrire\"}", Calls(&[("écrire", "{}")])),
        ("a trailing brace in prose", "That is all there is to it. }", Text),
        ("a trailing open brace in prose", "Format strings look like {", Text),
        ("prose that starts with a brace", "{name} is a placeholder; it is replaced by the name.", Text),
        ("an empty reply", "", Text),
        ("a whitespace-only reply", "  \n\t \r\n", Text),
        (
            "nested braces in strings",
            r#"{"type":"action","tool":"fs.write","args":{"content":"fn main() { println!(\"}}\"); }"}}"#,
            Calls(&[("fs.write", r#"{"content": "fn main() { println!(\"}}\"); }"}"#)]),
        ),
        (
            "escaped quotes and backslashes",
            r#"{"type":"action","tool":"echo","args":{"text":"she said \"hi\" \\ bye"}}"#,
            Calls(&[("echo", r#"{"text": "she said \"hi\" \\ bye"}"#)]),
        ),
        (
            "backticks inside args of a fenced action",
            "```json\n{\"type\":\"action\",\"tool\":\"fs.write\",\"args\":{\"content\":\"```rust\\nfn f() {}\\n```\"}}\n```",
            Calls(&[("fs.write", r#"{"content": "```rust\nfn f() {}\n```"}"#)]),
        ),
        ("a code block with prose after it", "```python\nprint('hi')\n```\nThis prints hi.", Text),
        ("a code block alone", "```rust\nfn main() {}\n```", Text),
        (
            "a fence in another language holding an action",
            "```python\n{\"type\": \"action\", \"tool\": \"fs.read\", \"args\": {}}\n```",
            Text,
        ),
        ("a fence with attributes on its opening line", "```python title=\"a.py\"\nprint(1)\n```\nDone.", Text),
        (
            "CRLF line endings",
            "```json\r\n{\r\n  \"type\": \"action\",\r\n  \"tool\": \"fs.read\",\r\n  \"args\": {\"path\": \"README.md\"}\r\n}\r\n```\r\n",
            Calls(READ_CALL),
        ),
        (
            "an unclosed fence holding an action",
            "```json\n{\"type\": \"action\", \"tool\": \"x\"}\n",
            Malformed("never closed"),
        ),
        ("an unclosed fence holding code", "```\nlet x = 1;", Text),
        (
            "a one-line fence holding an action",
            "```json {\"type\": \"action\", \"tool\": \"x\"} ```",
            Malformed("line of its own"),
        ),
        ("backticks alone", "```", Text),
        ("inline code first", "`ls -la` lists the files", Text),
        ("two backticks first", r#"``{"type":"action","tool":"x"}``"#, Text),
        (
            "a fenced attempt that is not valid JSON",
            "```json\n{\"type\": \"action\", \"tool\": \"x\"\n```",
            Malformed("fenced block is not valid JSON"),
        ),
        (
            "an action and an ordinary object",
            r#"{"type": "action", "tool": "x"} {"result": "made up"}"#,
            Malformed("block 2 of 2 is neither"),
        ),
        (
            "an action and an error",
            r#"{"type": "action", "tool": "x"} {"type": "error", "message": "m"}"#,
            Malformed("not both"),
        ),
        (
            "two errors",
            r#"{"type": "error", "message": "a"} {"type": "error", "message": "b"}"#,
            Malformed("one error at most"),
        ),
        (
            "two actions, the second without a tool",
            "{\"type\": \"action\", \"tool\": \"a\"}\n{\"type\": \"action\"}",
            Malformed(r#"block 2 of 2: the action has no "tool""#),
        ),
        ("whitespace kept around text", "  \n Hello there  \n", Text),
    ];

    fn check(input: &str, want: &Want, got: &Reply) -> Result<(), String> {
        let ok = match (want, got) {
            (Text, Reply::Text(text)) => text == input,
            (Calls(calls), Reply::Actions(actions)) => {
                let expected: Vec<Action> = calls
                    .iter()
                    .map(|(tool, args)| Action {
                        tool: (*tool).to_owned(),
                        args: serde_json::from_str(args).unwrap_or(Value::Null),
                    })
                    .collect();
                *actions == expected
            }
            (Error(code, message), Reply::ModelError { code: got_code, message: got_message }) => {
                got_code == code && got_message == message
            }
            (Malformed(words), Reply::Malformed { reason }) => reason.contains(words),
            _ => false,
        };
        if ok { Ok(()) } else { Err(format!("got {got:?}")) }
    }

    #[test]
    fn table() {
        assert!(CASES.len() >= 30);
        let failures: Vec<String> = CASES
            .iter()
            .filter_map(|(name, input, want)| {
                check(input, want, &parse_reply(input)).err().map(|error| format!("{name}: {input:?}: {error}"))
            })
            .collect();
        assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), CASES.len(), failures.join("\n"));
    }

    #[test]
    fn args_keep_their_order_and_types() {
        let reply = parse_reply(r#"{"type":"action","tool":"t","args":{"z":1,"a":[true,null,1.5],"m":{"k":"v"}}}"#);
        let Reply::Actions(actions) = reply else { panic!("{reply:?}") };
        let args = &actions[0].args;
        assert_eq!(*args, json!({"z": 1, "a": [true, null, 1.5], "m": {"k": "v"}}));
        let keys: Vec<&String> = args.as_object().map(|object| object.keys().collect()).unwrap_or_default();
        assert_eq!(keys, ["z", "a", "m"]);
    }

    #[test]
    fn reasons_say_where() {
        let Reply::Malformed { reason } = parse_reply("{\"type\": \"action\",\n \"tool\": }") else { panic!() };
        assert!(reason.contains("line 2"), "{reason}");
    }

    #[test]
    fn deep_nesting_is_refused_not_a_crash() {
        let deep = format!(r#"{{"type":"action","tool":"x","args":{}1{}}}"#, r#"{"a":"#.repeat(5000), "}".repeat(5000));
        assert!(matches!(parse_reply(&deep), Reply::Malformed { reason } if reason.contains("recursion limit")));
        let (emitted, end) = scan(&deep, &[deep.len() / 2]);
        assert!(agrees(&deep, &emitted, &end).is_ok());
        let braces = "{".repeat(100_000);
        assert_eq!(parse_reply(&braces), Reply::Text(braces.clone()));
    }

    #[test]
    fn a_long_action_in_small_fragments() {
        let content = "línea {con} \"comillas\" y `ticks`\n".repeat(5000);
        let input =
            format!("```json\n{}\n```\n", json!({"type": "action", "tool": "fs.write", "args": {"content": content}}));
        let mut scanner = ReplyScanner::new();
        let mut emitted = String::new();
        let mut rest = input.as_str();
        while !rest.is_empty() {
            let mut cut = rest.len().min(7);
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            let (fragment, tail) = rest.split_at(cut);
            emitted.push_str(&scanner.push(fragment));
            rest = tail;
        }
        assert_eq!(emitted, "");
        let Reply::Actions(actions) = scanner.finish() else { panic!("not an action") };
        assert_eq!(actions[0].args["content"], content);
    }

    #[test]
    fn the_type_marker() {
        for yes in [r#""type": "action""#, "'type':'error'", "type : action", "\"type\"\n:\t\"action\""] {
            assert!(mentions_type(yes), "{yes}");
        }
        for no in [r#""type": "answer""#, "type action", "the type of action", ""] {
            assert!(!mentions_type(no), "{no}");
        }
    }

    /// Feeds `input` cut at `cuts` (byte offsets at char boundaries, ascending): what was emitted, and the end.
    fn scan(input: &str, cuts: &[usize]) -> (String, Reply) {
        let mut scanner = ReplyScanner::new();
        let mut emitted = String::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([input.len()].iter()) {
            emitted.push_str(&scanner.push(input.get(from..cut).unwrap_or_default()));
            from = cut;
        }
        (emitted, scanner.finish())
    }

    /// The scanner agrees with [`parse_reply`]: text adds up to the whole reply, anything else emits nothing.
    fn agrees(input: &str, emitted: &str, end: &Reply) -> Result<(), String> {
        match (parse_reply(input), end) {
            (Reply::Text(whole), Reply::Text(rest)) if format!("{emitted}{rest}") == whole => Ok(()),
            (whole, end) if emitted.is_empty() && whole == *end => Ok(()),
            (whole, end) => {
                Err(format!("{input:?}: parse_reply gives {whole:?}; the scanner {emitted:?} then {end:?}"))
            }
        }
    }

    fn boundaries(input: &str) -> Vec<usize> {
        input.char_indices().map(|(at, _)| at).chain([input.len()]).collect()
    }

    #[test]
    fn every_case_split_anywhere_agrees() {
        for (_, input, _) in CASES {
            let cuts = boundaries(input);
            for &cut in &cuts {
                let (emitted, end) = scan(input, &[cut]);
                if let Err(error) = agrees(input, &emitted, &end) {
                    panic!("cut at {cut}: {error}");
                }
            }
            let (emitted, end) = scan(input, &cuts);
            if let Err(error) = agrees(input, &emitted, &end) {
                panic!("char by char: {error}");
            }
        }
    }

    #[test]
    fn every_case_split_twice_agrees() {
        for (_, input, _) in CASES.iter().filter(|(_, input, _)| input.len() <= 90) {
            let cuts = boundaries(input);
            for (index, &first) in cuts.iter().enumerate() {
                for &second in &cuts[index..] {
                    let (emitted, end) = scan(input, &[first, second]);
                    if let Err(error) = agrees(input, &emitted, &end) {
                        panic!("cut at {first} and {second}: {error}");
                    }
                }
            }
        }
    }

    /// Pushes fragments one by one and returns what each push emitted.
    fn emits(fragments: &[&str]) -> (Vec<String>, Reply) {
        let mut scanner = ReplyScanner::new();
        let emitted = fragments.iter().map(|fragment| scanner.push(fragment)).collect();
        (emitted, scanner.finish())
    }

    #[test]
    fn text_streams_live() {
        let (emitted, end) = emits(&["H", "ello", ", world"]);
        assert_eq!(emitted, ["H", "ello", ", world"]);
        assert_eq!(end, Reply::Text(String::new()));

        let (emitted, end) = emits(&[" \n", "\t", "Hi", " there"]);
        assert_eq!(emitted, ["", "", " \n\tHi", " there"]);
        assert_eq!(end, Reply::Text(String::new()));

        let (emitted, _) = emits(&["`", "ls` lists"]);
        assert_eq!(emitted, ["", "`ls` lists"]);
    }

    #[test]
    fn a_code_block_in_another_language_streams_from_its_first_line() {
        let (emitted, end) = emits(&["``", "`py", "thon\npri", "nt(1)\n```\n", "Done."]);
        assert_eq!(emitted, ["", "", "```python\npri", "nt(1)\n```\n", "Done."]);
        assert_eq!(end, Reply::Text(String::new()));
    }

    #[test]
    fn prose_after_a_first_block_is_released_when_it_starts() {
        let (emitted, end) = emits(&[r#"{"type":"action","tool":"x"}"#, " \n", "`", "Then", " more"]);
        assert_eq!(emitted, ["", "", "", "{\"type\":\"action\",\"tool\":\"x\"} \n`Then", " more"]);
        assert_eq!(end, Reply::Text(String::new()));

        let (emitted, _) = emits(&["```json\n", "{\"type\":\"action\",\"tool\":\"x\"}\n", "```", "\n", "This", "!"]);
        assert_eq!(emitted, ["", "", "", "", "```json\n{\"type\":\"action\",\"tool\":\"x\"}\n```\nThis", "!"]);
    }

    #[test]
    fn actions_and_errors_are_held_back() {
        let (emitted, end) =
            emits(&["  {\"type\": \"act", "ion\", \"tool\": \"fs.read\", ", "\"args\": {\"path\": \"README.md\"}}\n"]);
        assert!(emitted.iter().all(String::is_empty), "{emitted:?}");
        assert_eq!(end, parse_reply(READ));

        let (emitted, end) = emits(&["```json\n{\"type\": \"error\", ", "\"message\": \"no\"}\n```"]);
        assert!(emitted.iter().all(String::is_empty), "{emitted:?}");
        assert_eq!(end, Reply::ModelError { code: "model_error".to_owned(), message: "no".to_owned() });
    }

    #[test]
    fn a_held_block_that_is_text_comes_out_at_the_end() {
        let input = "```\nplain code\n```\n";
        let (emitted, end) = emits(&[input]);
        assert_eq!(emitted, [""]);
        assert_eq!(end, Reply::Text(input.to_owned()));
    }

    /// Structural pieces, so that generated replies come near the rules' edges.
    fn soup() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("{"),
            Just("}"),
            Just("```"),
            Just("```json\n"),
            Just("\n```\n"),
            Just("`"),
            Just(r#""type": "action""#),
            Just(r#""type":"error""#),
            Just(r#""tool": "t""#),
            Just(r#""args": {}"#),
            Just(r#""message": "m""#),
            Just(r#"{"type":"action","tool":"a","args":{"k":"v"}}"#),
            Just(", "),
            Just(":"),
            Just("\""),
            Just("\\"),
            Just(" "),
            Just("\n"),
            Just("\r\n"),
            Just("é🌍"),
            Just("python"),
            Just("prose"),
        ]
        .prop_map(str::to_owned);
        let piece = prop_oneof![4 => piece, 1 => any::<char>().prop_map(String::from)];
        prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }

    /// Cut points for `input`, snapped to char boundaries, ascending.
    fn cuts_for(input: &str, picks: &[prop::sample::Index]) -> Vec<usize> {
        let bounds = boundaries(input);
        let mut cuts: Vec<usize> = picks.iter().map(|pick| bounds[pick.index(bounds.len())]).collect();
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }

    /// Prose: not blank, and not starting like JSON once trimmed.
    fn prose() -> impl Strategy<Value = String> {
        any::<String>().prop_filter("prose", |text| {
            let trimmed = text.trim();
            !trimmed.is_empty() && !trimmed.starts_with('{') && !trimmed.starts_with('`')
        })
    }

    /// An action as a model might write it: bare or fenced, any tool name and string argument.
    fn action_text() -> impl Strategy<Value = String> {
        (any::<String>(), any::<String>(), 0..3usize).prop_map(|(tool, value, form)| {
            let object = json!({"type": "action", "tool": format!("t{tool}"), "args": {"v": value}}).to_string();
            match form {
                0 => object,
                1 => format!("```json\n{object}\n```"),
                _ => format!("\n{object}\n"),
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(512) })]

        /// Nothing panics, whatever comes, however it is cut.
        #[test]
        fn never_panics(input in any::<String>(), picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
            let _ = parse_reply(&input);
            let (emitted, end) = scan(&input, &cuts_for(&input, &picks));
            prop_assert!(agrees(&input, &emitted, &end).is_ok());
        }

        /// Near the edges of the rules, the scanner cut anywhere agrees with `parse_reply`.
        #[test]
        fn the_scanner_agrees(input in soup(), picks in prop::collection::vec(any::<prop::sample::Index>(), 0..8)) {
            let (emitted, end) = scan(&input, &cuts_for(&input, &picks));
            if let Err(error) = agrees(&input, &emitted, &end) {
                return Err(TestCaseError::fail(error));
            }
        }

        /// An action after prose, or before it, never runs.
        #[test]
        fn prose_makes_actions_text(prose in prose(), action in action_text(), glue in "[ \n]{0,2}") {
            let before = format!("{prose}{glue}{action}");
            prop_assert_eq!(parse_reply(&before), Reply::Text(before.clone()));
            let after = format!("{action}{glue}{prose}");
            prop_assert!(!matches!(parse_reply(&after), Reply::Actions(_)), "{:?}", after);
        }

        /// The generated actions themselves do parse, so the property above is not vacuous.
        #[test]
        fn actions_alone_are_actions(action in action_text()) {
            prop_assert!(matches!(parse_reply(&action), Reply::Actions(actions) if actions.len() == 1));
        }
    }
}

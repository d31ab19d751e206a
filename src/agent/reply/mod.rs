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
mod tests;

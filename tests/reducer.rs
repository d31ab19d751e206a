//! The delta reducer, table-driven: each row is a list of messages (as JSON) and either the state of every
//! message after the last one, or the field a refused last message names. A refused message must leave the
//! state as it was.

use agentmux::output::{OutputMessage, Reducer, builtin_types};
use serde_json::{Value, json};

/// What a row expects after its last message: every message's state, or the `field()` of the error.
type Expect = Result<Value, &'static str>;

/// A row: description, input messages, expectation.
type Case = (&'static str, Value, Expect);

fn parse(name: &str, input: Value) -> Vec<OutputMessage> {
    let Value::Array(items) = input else { panic!("{name}: input must be an array of messages") };
    items.into_iter().map(|m| serde_json::from_value::<OutputMessage>(m).expect("message JSON")).collect()
}

fn state(reducer: &Reducer) -> Value {
    serde_json::to_value(reducer.messages()).expect("state JSON")
}

/// Applies every message; all but the last must apply. Checks the last against `expected`.
fn run(name: &str, input: Value, expected: &Expect) -> Reducer {
    let messages = parse(name, input);
    let (last, first) = messages.split_last().expect("at least one message");
    let mut reducer = Reducer::default();
    for (i, message) in first.iter().enumerate() {
        reducer.apply(message).unwrap_or_else(|e| panic!("{name}: message {i} refused: {e}"));
    }
    let before = state(&reducer);
    match (reducer.apply(last), expected) {
        (Ok(_), Ok(want)) => assert_eq!(state(&reducer), *want, "{name}"),
        (Err(err), Err(field)) => {
            assert_eq!(err.field(), *field, "{name}: {err}");
            assert_eq!(state(&reducer), before, "{name}: a refused message changed the state");
        }
        (Ok(_), Err(field)) => panic!("{name}: expected an error on {field}, got {}", state(&reducer)),
        (Err(err), Ok(_)) => panic!("{name}: refused: {err}"),
    }
    reducer
}

fn run_all(cases: Vec<Case>) {
    for (name, input, expected) in cases {
        run(name, input, &expected);
    }
}

/// One action on one built-in type: (type, action, delta_path, props before, props of the delta, props after
/// or the error field). `None` is the default path: the main field, or the whole props for types without one.
type Cell = (&'static str, &'static str, Option<&'static str>, Value, Value, Expect);

#[rustfmt::skip]
fn matrix() -> Vec<Cell> {
    vec![
        // text: main field `content`
        ("text", "append", None, json!({"content": "Hel"}), json!({"content": "lo"}), Ok(json!({"content": "Hello"}))),
        ("text", "replace", None, json!({"content": "old"}), json!({"content": "new"}), Ok(json!({"content": "new"}))),
        ("text", "merge", None, json!({"content": "old"}), json!({"content": {"k": 1}}), Err("props.content")),
        ("text", "set", None, json!({"content": "old"}), json!({"content": "new"}), Ok(json!({"content": "new"}))),
        ("text", "append", Some("content"), json!({"content": "a"}), json!({"content": "b"}),
            Ok(json!({"content": "ab"}))),
        ("text", "replace", Some(""), json!({"content": "a"}), json!({"content": "b", "lang": "en"}),
            Ok(json!({"content": "b", "lang": "en"}))),
        ("text", "merge", Some(""), json!({"content": "a"}), json!({"lang": "en"}),
            Ok(json!({"content": "a", "lang": "en"}))),
        ("text", "set", Some("meta.lang"), json!({"content": "a"}), json!({"meta": {"lang": "en"}}),
            Ok(json!({"content": "a", "meta": {"lang": "en"}}))),
        // thinking: main field `content`
        ("thinking", "append", None, json!({"content": "Let"}), json!({"content": " me"}),
            Ok(json!({"content": "Let me"}))),
        ("thinking", "replace", None, json!({"content": "a"}), json!({"content": "b"}), Ok(json!({"content": "b"}))),
        ("thinking", "merge", None, json!({"content": "a"}), json!({"content": {"k": 1}}), Err("props.content")),
        ("thinking", "set", None, json!({"content": "a"}), json!({"content": "b"}), Ok(json!({"content": "b"}))),
        ("thinking", "append", Some("content"), json!({"content": "a"}), json!({"content": "b"}),
            Ok(json!({"content": "ab"}))),
        ("thinking", "replace", Some("content"), json!({"content": "a"}), json!({"content": "b"}),
            Ok(json!({"content": "b"}))),
        ("thinking", "merge", Some("meta"), json!({"content": "a"}), json!({"meta": {"t": 1}}),
            Ok(json!({"content": "a", "meta": {"t": 1}}))),
        ("thinking", "set", Some("signature"), json!({"content": "a"}), json!({"signature": "s"}),
            Ok(json!({"content": "a", "signature": "s"}))),
        // loading: main field `message`
        ("loading", "append", None, json!({"message": "Search"}), json!({"message": "ing"}),
            Ok(json!({"message": "Searching"}))),
        ("loading", "replace", None, json!({"message": "a"}), json!({"message": "b"}), Ok(json!({"message": "b"}))),
        ("loading", "merge", None, json!({"message": "a"}), json!({"message": {"k": 1}}), Err("props.message")),
        ("loading", "set", None, json!({"message": "a"}), json!({"message": "b"}), Ok(json!({"message": "b"}))),
        ("loading", "append", Some("message"), json!({"message": "a"}), json!({"message": "b"}),
            Ok(json!({"message": "ab"}))),
        ("loading", "replace", Some("message"), json!({"message": "a"}), json!({"message": "b", "done": true}),
            Ok(json!({"message": "b"}))),
        ("loading", "merge", Some(""), json!({"message": "a"}), json!({"done": true}),
            Ok(json!({"message": "a", "done": true}))),
        ("loading", "set", Some("done"), json!({"message": "a"}), json!({"done": true}),
            Ok(json!({"message": "a", "done": true}))),
        // tool_call: main field `arguments`
        ("tool_call", "append", None, json!({"id": "c", "name": "f", "arguments": "{\"q\":"}),
            json!({"arguments": "1}"}),
            Ok(json!({"id": "c", "name": "f", "arguments": "{\"q\":1}"}))),
        ("tool_call", "replace", None, json!({"id": "c", "name": "f", "arguments": "{}"}), json!({"arguments": "[]"}),
            Ok(json!({"id": "c", "name": "f", "arguments": "[]"}))),
        ("tool_call", "merge", None, json!({"id": "c", "name": "f", "arguments": "{}"}), json!({"arguments": {"q": 1}}),
            Err("props.arguments")),
        ("tool_call", "set", None, json!({"id": "c", "name": "f", "arguments": "{}"}), json!({"arguments": "[]"}),
            Ok(json!({"id": "c", "name": "f", "arguments": "[]"}))),
        ("tool_call", "append", Some("name"), json!({"id": "c", "name": "get_"}), json!({"name": "weather"}),
            Ok(json!({"id": "c", "name": "get_weather"}))),
        ("tool_call", "replace", Some("id"), json!({"id": "c", "name": "f"}), json!({"id": "d"}),
            Ok(json!({"id": "d", "name": "f"}))),
        ("tool_call", "merge", Some(""), json!({"id": "c", "name": "f"}), json!({"name": "g", "arguments": "{}"}),
            Ok(json!({"id": "c", "name": "g", "arguments": "{}"}))),
        ("tool_call", "set", Some("arguments"), json!({"id": "c", "name": "f"}), json!({"arguments": "{}"}),
            Ok(json!({"id": "c", "name": "f", "arguments": "{}"}))),
        // error: no main field, the default path is the whole props
        ("error", "append", None, json!({"message": "boom"}), json!({"message": "!"}), Err("props")),
        ("error", "replace", None, json!({"message": "boom", "code": "E1"}), json!({"message": "bang"}),
            Ok(json!({"message": "bang"}))),
        ("error", "merge", None, json!({"message": "boom"}), json!({"code": "E1"}),
            Ok(json!({"message": "boom", "code": "E1"}))),
        ("error", "set", None, json!({"message": "boom", "code": "E1"}), json!({"message": "bang"}),
            Ok(json!({"message": "bang"}))),
        ("error", "append", Some("message"), json!({"message": "Fail"}), json!({"message": "ed"}),
            Ok(json!({"message": "Failed"}))),
        ("error", "replace", Some("code"), json!({"message": "m", "code": "E1"}), json!({"code": "E2"}),
            Ok(json!({"message": "m", "code": "E2"}))),
        ("error", "merge", Some("details"), json!({"message": "m", "details": {"file": "a"}}),
            json!({"details": {"line": 1}}),
            Ok(json!({"message": "m", "details": {"file": "a", "line": 1}}))),
        ("error", "set", Some("details.line"), json!({"message": "m"}), json!({"details": {"line": 1}}),
            Ok(json!({"message": "m", "details": {"line": 1}}))),
        // image
        ("image", "append", None, json!({"url": "https://x/1"}), json!({"alt": "cat"}), Err("props")),
        ("image", "replace", None, json!({"url": "https://x/1", "alt": "x"}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2"}))),
        ("image", "merge", None, json!({"url": "https://x/1", "alt": "x"}), json!({"alt": "cat", "width": 64}),
            Ok(json!({"url": "https://x/1", "alt": "cat", "width": 64}))),
        ("image", "set", None, json!({"url": "https://x/1", "alt": "x"}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2"}))),
        ("image", "append", Some("alt"), json!({"url": "https://x/1", "alt": "a ca"}), json!({"alt": "t"}),
            Ok(json!({"url": "https://x/1", "alt": "a cat"}))),
        ("image", "replace", Some("url"), json!({"url": "https://x/1", "alt": "x"}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2", "alt": "x"}))),
        ("image", "merge", Some("meta"), json!({"url": "https://x/1"}), json!({"meta": {"k": 1}}),
            Ok(json!({"url": "https://x/1", "meta": {"k": 1}}))),
        ("image", "set", Some("width"), json!({"url": "https://x/1"}), json!({"width": 64}),
            Ok(json!({"url": "https://x/1", "width": 64}))),
        // audio
        ("audio", "append", None, json!({"url": "https://x/1"}), json!({"transcript": "hi"}), Err("props")),
        ("audio", "replace", None, json!({"url": "https://x/1", "format": "wav"}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2"}))),
        ("audio", "merge", None, json!({"url": "https://x/1"}), json!({"format": "mp3"}),
            Ok(json!({"url": "https://x/1", "format": "mp3"}))),
        ("audio", "set", None, json!({"url": "https://x/1", "format": "wav"}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2"}))),
        ("audio", "append", Some("transcript"), json!({"url": "https://x/1", "transcript": "Hel"}),
            json!({"transcript": "lo"}),
            Ok(json!({"url": "https://x/1", "transcript": "Hello"}))),
        ("audio", "replace", Some("format"), json!({"url": "https://x/1", "format": "wav"}), json!({"format": "mp3"}),
            Ok(json!({"url": "https://x/1", "format": "mp3"}))),
        ("audio", "merge", Some(""), json!({"url": "https://x/1"}), json!({"autoplay": true}),
            Ok(json!({"url": "https://x/1", "autoplay": true}))),
        ("audio", "set", Some("duration"), json!({"url": "https://x/1"}), json!({"duration": 1.5}),
            Ok(json!({"url": "https://x/1", "duration": 1.5}))),
        // video
        ("video", "append", None, json!({"url": "https://x/1"}), json!({"format": "mp4"}), Err("props")),
        ("video", "replace", None, json!({"url": "https://x/1", "loop": true}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2"}))),
        ("video", "merge", None, json!({"url": "https://x/1"}), json!({"loop": true}),
            Ok(json!({"url": "https://x/1", "loop": true}))),
        ("video", "set", None, json!({"url": "https://x/1", "loop": true}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2"}))),
        ("video", "append", Some("format"), json!({"url": "https://x/1", "format": "mp"}), json!({"format": "4"}),
            Ok(json!({"url": "https://x/1", "format": "mp4"}))),
        ("video", "replace", Some("thumbnail"), json!({"url": "https://x/1", "thumbnail": "https://t/1"}),
            json!({"thumbnail": "https://t/2"}),
            Ok(json!({"url": "https://x/1", "thumbnail": "https://t/2"}))),
        ("video", "merge", Some(""), json!({"url": "https://x/1"}), json!({"controls": true}),
            Ok(json!({"url": "https://x/1", "controls": true}))),
        ("video", "set", Some("loop"), json!({"url": "https://x/1"}), json!({"loop": true}),
            Ok(json!({"url": "https://x/1", "loop": true}))),
        // file
        ("file", "append", None, json!({"url": "https://x/1"}), json!({"name": "r.pdf"}), Err("props")),
        ("file", "replace", None, json!({"url": "https://x/1", "size": 9}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2"}))),
        ("file", "merge", None, json!({"url": "https://x/1"}), json!({"size": 9}),
            Ok(json!({"url": "https://x/1", "size": 9}))),
        ("file", "set", None, json!({"url": "https://x/1", "size": 9}), json!({"url": "https://x/2"}),
            Ok(json!({"url": "https://x/2"}))),
        ("file", "append", Some("name"), json!({"url": "https://x/1", "name": "report"}), json!({"name": ".pdf"}),
            Ok(json!({"url": "https://x/1", "name": "report.pdf"}))),
        ("file", "replace", Some("mime"), json!({"url": "https://x/1", "mime": "text/plain"}),
            json!({"mime": "application/pdf"}),
            Ok(json!({"url": "https://x/1", "mime": "application/pdf"}))),
        ("file", "merge", Some(""), json!({"url": "https://x/1"}), json!({"name": "r.pdf"}),
            Ok(json!({"url": "https://x/1", "name": "r.pdf"}))),
        ("file", "set", Some("size"), json!({"url": "https://x/1", "size": 1}), json!({"size": 9}),
            Ok(json!({"url": "https://x/1", "size": 9}))),
        // action
        ("action", "append", None, json!({"name": "open"}), json!({"name": "_panel"}), Err("props")),
        ("action", "replace", None, json!({"name": "open", "payload": {"a": 1}}), json!({"name": "close"}),
            Ok(json!({"name": "close"}))),
        ("action", "merge", None, json!({"name": "open"}), json!({"payload": {"a": 1}}),
            Ok(json!({"name": "open", "payload": {"a": 1}}))),
        ("action", "set", None, json!({"name": "open", "payload": {"a": 1}}), json!({"name": "close"}),
            Ok(json!({"name": "close"}))),
        ("action", "append", Some("payload.steps"), json!({"name": "n", "payload": {"steps": ["a"]}}),
            json!({"payload": {"steps": ["b"]}}),
            Ok(json!({"name": "n", "payload": {"steps": ["a", "b"]}}))),
        ("action", "replace", Some("payload"), json!({"name": "n", "payload": {"a": 1}}), json!({"payload": {"b": 2}}),
            Ok(json!({"name": "n", "payload": {"b": 2}}))),
        ("action", "merge", Some("payload"), json!({"name": "n", "payload": {"a": 1}}), json!({"payload": {"b": 2}}),
            Ok(json!({"name": "n", "payload": {"a": 1, "b": 2}}))),
        ("action", "set", Some("payload.progress"), json!({"name": "n", "payload": {"progress": 10}}),
            json!({"payload": {"progress": 50}}),
            Ok(json!({"name": "n", "payload": {"progress": 50}}))),
        // tool_result
        ("tool_result", "append", None, json!({"call_id": "c"}), json!({"name": "x"}), Err("props")),
        ("tool_result", "replace", None, json!({"call_id": "c", "result": 1}),
            json!({"call_id": "c", "error": {"message": "m"}}),
            Ok(json!({"call_id": "c", "error": {"message": "m"}}))),
        ("tool_result", "merge", None, json!({"call_id": "c"}), json!({"result": {"a": 1}}),
            Ok(json!({"call_id": "c", "result": {"a": 1}}))),
        ("tool_result", "set", None, json!({"call_id": "c", "result": 1}), json!({"call_id": "d"}),
            Ok(json!({"call_id": "d"}))),
        ("tool_result", "append", Some("result.lines"), json!({"call_id": "c", "result": {"lines": ["a"]}}),
            json!({"result": {"lines": ["b"]}}),
            Ok(json!({"call_id": "c", "result": {"lines": ["a", "b"]}}))),
        ("tool_result", "replace", Some("result"), json!({"call_id": "c", "result": {"a": 1}}), json!({"result": 2}),
            Ok(json!({"call_id": "c", "result": 2}))),
        ("tool_result", "merge", Some("result"), json!({"call_id": "c", "result": {"a": 1}}),
            json!({"result": {"b": 2}}),
            Ok(json!({"call_id": "c", "result": {"a": 1, "b": 2}}))),
        ("tool_result", "set", Some("result.done"), json!({"call_id": "c", "result": {"done": false}}),
            json!({"result": {"done": true}}),
            Ok(json!({"call_id": "c", "result": {"done": true}}))),
        // event
        ("event", "append", None, json!({"event": "step"}), json!({"message": "x"}), Err("props")),
        ("event", "replace", None, json!({"event": "step", "message": "x"}), json!({"event": "end"}),
            Ok(json!({"event": "end"}))),
        ("event", "merge", None, json!({"event": "step"}), json!({"message": "x"}),
            Ok(json!({"event": "step", "message": "x"}))),
        ("event", "set", None, json!({"event": "step", "message": "x"}), json!({"event": "end"}),
            Ok(json!({"event": "end"}))),
        ("event", "append", Some("message"), json!({"event": "e", "message": "Step "}), json!({"message": "1"}),
            Ok(json!({"event": "e", "message": "Step 1"}))),
        ("event", "replace", Some("event"), json!({"event": "start"}), json!({"event": "end"}),
            Ok(json!({"event": "end"}))),
        ("event", "merge", Some("data"), json!({"event": "e", "data": {"a": 1}}), json!({"data": {"b": 2}}),
            Ok(json!({"event": "e", "data": {"a": 1, "b": 2}}))),
        ("event", "set", Some("data.items.0"), json!({"event": "e", "data": {"items": ["a"]}}),
            json!({"data": {"items": ["b"]}}),
            Ok(json!({"event": "e", "data": {"items": ["b"]}}))),
    ]
}

#[test]
fn every_action_on_every_builtin_type() {
    let cells = matrix();
    for kind in builtin_types() {
        for action in ["append", "replace", "merge", "set"] {
            for explicit in [false, true] {
                let covered = cells.iter().any(|c| c.0 == *kind && c.1 == action && c.2.is_some() == explicit);
                assert!(covered, "matrix lacks {kind} {action} (explicit path: {explicit})");
            }
        }
    }
    for (kind, action, path, before, delta, after) in cells {
        let name = format!("{kind} {action} at {}", path.unwrap_or("the default path"));
        let input = json!([
            {"type": kind, "props": before, "message_id": "m"},
            {"type": kind, "props": delta, "message_id": "m", "delta": true, "delta_action": action,
                "delta_path": path},
        ]);
        let expected = after.map(|props| json!([{"type": kind, "props": props, "message_id": "m"}]));
        run(&name, input, &expected);
    }
}

#[test]
fn paths_arrays_and_messages() {
    run_all(vec![
        (
            "streamed text deltas concatenate; an absent delta_action is append",
            json!([
                {"type": "text", "props": {"content": "He"}, "message_id": "m"},
                {"type": "text", "props": {"content": "l"}, "message_id": "m", "delta": true},
                {"type": "text", "props": {"content": "lo"}, "message_id": "m", "delta": true,
                    "delta_action": "append"},
            ]),
            Ok(json!([{"type": "text", "props": {"content": "Hello"}, "message_id": "m"}])),
        ),
        (
            "a delta without action or path on a type with no main field merges into the props",
            json!([
                {"type": "image", "props": {"url": "https://x/1"}, "message_id": "m"},
                {"type": "image", "props": {"alt": "cat", "width": 3}, "message_id": "m", "delta": true},
            ]),
            Ok(json!([{"type": "image", "props": {"url": "https://x/1", "alt": "cat", "width": 3},
                "message_id": "m"}])),
        ),
        (
            "tool_call arguments stream from nothing",
            json!([
                {"type": "tool_call", "props": {"id": "c", "name": "search"}, "message_id": "m"},
                {"type": "tool_call", "props": {"arguments": "{\"q\":"}, "message_id": "m", "delta": true},
                {"type": "tool_call", "props": {"arguments": "\"rust\"}"}, "message_id": "m", "delta": true},
            ]),
            Ok(json!([{"type": "tool_call", "props": {"id": "c", "name": "search", "arguments": "{\"q\":\"rust\"}"},
                "message_id": "m"}])),
        ),
        (
            "replace payload.progress",
            json!([
                {"type": "action", "props": {"name": "upload", "payload": {"progress": 10, "file": "a"}},
                    "message_id": "m"},
                {"type": "action", "props": {"payload": {"progress": 60}}, "message_id": "m", "delta": true,
                    "delta_action": "replace", "delta_path": "payload.progress"},
            ]),
            Ok(json!([{"type": "action", "props": {"name": "upload", "payload": {"progress": 60, "file": "a"}},
                "message_id": "m"}])),
        ),
        (
            "set payload.progress creates payload",
            json!([
                {"type": "action", "props": {"name": "upload"}, "message_id": "m"},
                {"type": "action", "props": {"payload": {"progress": 5}}, "message_id": "m", "delta": true,
                    "delta_action": "set", "delta_path": "payload.progress"},
            ]),
            Ok(json!([{"type": "action", "props": {"name": "upload", "payload": {"progress": 5}}, "message_id": "m"}])),
        ),
        (
            "append at data.items.0 concatenates the element",
            json!([
                {"type": "event", "props": {"event": "e", "data": {"items": ["a", "x"]}}, "message_id": "m"},
                {"type": "event", "props": {"data": {"items": ["b"]}}, "message_id": "m", "delta": true,
                    "delta_path": "data.items.0"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "data": {"items": ["ab", "x"]}}, "message_id": "m"}])),
        ),
        (
            "replace at data.items.1",
            json!([
                {"type": "event", "props": {"event": "e", "data": {"items": ["a", "x"]}}, "message_id": "m"},
                {"type": "event", "props": {"data": {"items": ["-", "y"]}}, "message_id": "m", "delta": true,
                    "delta_action": "replace", "delta_path": "data.items.1"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "data": {"items": ["a", "y"]}}, "message_id": "m"}])),
        ),
        (
            "an index one past the end pushes",
            json!([
                {"type": "event", "props": {"event": "e", "data": {"items": ["a"]}}, "message_id": "m"},
                {"type": "event", "props": {"data": {"items": {"1": "b"}}}, "message_id": "m", "delta": true,
                    "delta_path": "data.items.1"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "data": {"items": ["a", "b"]}}, "message_id": "m"}])),
        ),
        (
            "set into an array element's object",
            json!([
                {"type": "event", "props": {"event": "e", "data": {"items": [{"n": 1}]}}, "message_id": "m"},
                {"type": "event", "props": {"data": {"items": [{"done": true}]}}, "message_id": "m", "delta": true,
                    "delta_action": "set", "delta_path": "data.items.0.done"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "data": {"items": [{"n": 1, "done": true}]}},
                "message_id": "m"}])),
        ),
        (
            "array append extends with an array",
            json!([
                {"type": "event", "props": {"event": "e", "data": {"items": [1, 2]}}, "message_id": "m"},
                {"type": "event", "props": {"data": {"items": [3, 4]}}, "message_id": "m", "delta": true,
                    "delta_path": "data.items"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "data": {"items": [1, 2, 3, 4]}}, "message_id": "m"}])),
        ),
        (
            "array append pushes a non-array value",
            json!([
                {"type": "event", "props": {"event": "e", "data": {"items": [1, 2]}}, "message_id": "m"},
                {"type": "event", "props": {"data": {"items": {"k": 3}}}, "message_id": "m", "delta": true,
                    "delta_path": "data.items"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "data": {"items": [1, 2, {"k": 3}]}},
                "message_id": "m"}])),
        ),
        (
            "append creates a missing leaf as the delta's value (an array stays an array)",
            json!([
                {"type": "event", "props": {"event": "e", "data": {}}, "message_id": "m"},
                {"type": "event", "props": {"data": {"items": ["a"]}}, "message_id": "m", "delta": true,
                    "delta_path": "data.items"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "data": {"items": ["a"]}}, "message_id": "m"}])),
        ),
        (
            "append to a missing leaf stores a scalar as it is, not in an array",
            json!([
                {"type": "event", "props": {"event": "e"}, "message_id": "m"},
                {"type": "event", "props": {"log": 1}, "message_id": "m", "delta": true, "delta_path": "log"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "log": 1}, "message_id": "m"}])),
        ),
        (
            "append to a null starts the value",
            json!([
                {"type": "event", "props": {"event": "e", "message": null}, "message_id": "m"},
                {"type": "event", "props": {"message": "hi"}, "message_id": "m", "delta": true,
                    "delta_path": "message"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "message": "hi"}, "message_id": "m"}])),
        ),
        (
            "set creates a.b.c",
            json!([
                {"type": "event", "props": {"event": "e"}, "message_id": "m"},
                {"type": "event", "props": {"a": {"b": {"c": 1}}}, "message_id": "m", "delta": true,
                    "delta_action": "set", "delta_path": "a.b.c"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "a": {"b": {"c": 1}}}, "message_id": "m"}])),
        ),
        (
            "set through a null creates the object",
            json!([
                {"type": "event", "props": {"event": "e", "a": null}, "message_id": "m"},
                {"type": "event", "props": {"a": {"b": 1}}, "message_id": "m", "delta": true,
                    "delta_action": "set", "delta_path": "a.b"},
            ]),
            Ok(json!([{"type": "event", "props": {"event": "e", "a": {"b": 1}}, "message_id": "m"}])),
        ),
        (
            "merge is shallow: a nested object is replaced, not merged",
            json!([
                {"type": "action", "props": {"name": "n", "payload": {"a": 1}}, "message_id": "m"},
                {"type": "action", "props": {"payload": {"b": 2}}, "message_id": "m", "delta": true,
                    "delta_action": "merge"},
            ]),
            Ok(json!([{"type": "action", "props": {"name": "n", "payload": {"b": 2}}, "message_id": "m"}])),
        ),
        (
            "merge into a missing leaf creates it",
            json!([
                {"type": "action", "props": {"name": "n"}, "message_id": "m"},
                {"type": "action", "props": {"payload": {"b": 2}}, "message_id": "m", "delta": true,
                    "delta_action": "merge", "delta_path": "payload"},
            ]),
            Ok(json!([{"type": "action", "props": {"name": "n", "payload": {"b": 2}}, "message_id": "m"}])),
        ),
        (
            "the delta's other props are ignored: only the value at its path applies",
            json!([
                {"type": "loading", "props": {"message": "Fetch"}, "message_id": "m"},
                {"type": "loading", "props": {"message": "ing", "done": true}, "message_id": "m", "delta": true},
            ]),
            Ok(json!([{"type": "loading", "props": {"message": "Fetching"}, "message_id": "m"}])),
        ),
        (
            "type_change loading -> text applies at the new type's main field and keeps the old props",
            json!([
                {"type": "loading", "props": {"message": "Searching"}, "message_id": "m"},
                {"type": "text", "props": {"content": "Found"}, "message_id": "m", "delta": true, "type_change": true},
            ]),
            Ok(json!([{"type": "text", "props": {"message": "Searching", "content": "Found"}, "message_id": "m"}])),
        ),
        (
            "type_change with a whole-props replace drops the old props",
            json!([
                {"type": "loading", "props": {"message": "Searching"}, "message_id": "m"},
                {"type": "text", "props": {"content": "Found"}, "message_id": "m", "delta": true, "type_change": true,
                    "delta_action": "replace", "delta_path": ""},
            ]),
            Ok(json!([{"type": "text", "props": {"content": "Found"}, "message_id": "m"}])),
        ),
        (
            "a delta for an unknown message_id starts a message, its delta fields and chunk_id cleared",
            json!([
                {"type": "text", "props": {"content": "a"}, "message_id": "m"},
                {"type": "text", "props": {"content": "Hi"}, "message_id": "new", "chunk_id": "c1", "delta": true,
                    "delta_action": "replace", "delta_path": "content", "type_change": true, "block_id": "b"},
            ]),
            Ok(json!([
                {"type": "text", "props": {"content": "a"}, "message_id": "m"},
                {"type": "text", "props": {"content": "Hi"}, "message_id": "new", "block_id": "b"},
            ])),
        ),
        (
            "a delta without message_id starts a message",
            json!([
                {"type": "text", "props": {"content": "a"}},
                {"type": "text", "props": {"content": "b"}, "delta": true},
            ]),
            Ok(json!([{"type": "text", "props": {"content": "a"}}, {"type": "text", "props": {"content": "b"}}])),
        ),
        (
            "messages without message_id are separate",
            json!([
                {"type": "text", "props": {"content": "a"}},
                {"type": "text", "props": {"content": "a"}},
                {"type": "image", "props": {"url": "https://x/1"}},
            ]),
            Ok(json!([
                {"type": "text", "props": {"content": "a"}},
                {"type": "text", "props": {"content": "a"}},
                {"type": "image", "props": {"url": "https://x/1"}},
            ])),
        ),
        (
            "a non-delta resend replaces the message whole, in its first position",
            json!([
                {"type": "text", "props": {"content": "a"}, "message_id": "m", "block_id": "b1"},
                {"type": "text", "props": {"content": "b"}, "message_id": "m", "delta": true},
                {"type": "text", "props": {"content": "z"}, "message_id": "n"},
                {"type": "text", "props": {"content": "new", "lang": "en"}, "message_id": "m"},
            ]),
            Ok(json!([
                {"type": "text", "props": {"content": "new", "lang": "en"}, "message_id": "m"},
                {"type": "text", "props": {"content": "z"}, "message_id": "n"},
            ])),
        ),
        (
            "a non-delta resend may change the type without type_change",
            json!([
                {"type": "loading", "props": {"message": "Drawing"}, "message_id": "m"},
                {"type": "image", "props": {"url": "https://x/1"}, "message_id": "m"},
            ]),
            Ok(json!([{"type": "image", "props": {"url": "https://x/1"}, "message_id": "m"}])),
        ),
        (
            "interleaved deltas of two messages",
            json!([
                {"type": "thinking", "props": {"content": "x"}, "message_id": "t"},
                {"type": "text", "props": {"content": "a"}, "message_id": "m"},
                {"type": "thinking", "props": {"content": "y"}, "message_id": "t", "delta": true},
                {"type": "text", "props": {"content": "b"}, "message_id": "m", "delta": true},
            ]),
            Ok(json!([
                {"type": "thinking", "props": {"content": "xy"}, "message_id": "t"},
                {"type": "text", "props": {"content": "ab"}, "message_id": "m"},
            ])),
        ),
        (
            "a delta updates block_id, thread_id and metadata when it carries them",
            json!([
                {"type": "text", "props": {"content": "a"}, "message_id": "m", "block_id": "b1", "thread_id": "t1",
                    "metadata": {"sequence": 1}},
                {"type": "text", "props": {"content": "b"}, "message_id": "m", "delta": true},
                {"type": "text", "props": {"content": "c"}, "message_id": "m", "delta": true, "block_id": "b2",
                    "metadata": {"sequence": 3}},
            ]),
            Ok(json!([{"type": "text", "props": {"content": "abc"}, "message_id": "m", "block_id": "b2",
                "thread_id": "t1", "metadata": {"sequence": 3}}])),
        ),
    ]);
}

/// A delta for message `m`.
fn delta(kind: &str, props: Value, action: &str, path: Option<&str>) -> Value {
    json!({"type": kind, "props": props, "message_id": "m", "delta": true, "delta_action": action, "delta_path": path})
}

#[test]
fn conflicts_name_the_field_and_change_nothing() {
    let text = json!({"type": "text", "props": {"content": "abc"}, "message_id": "m"});
    let image = json!({"type": "image", "props": {"url": "https://x/1", "width": 64}, "message_id": "m"});
    let event = json!({"type": "event", "props": {"event": "e", "data": {"items": ["a"], "n": 1}}, "message_id": "m"});
    let loading = json!({"type": "loading", "props": {"message": "x", "done": false}, "message_id": "m"});
    run_all(vec![
        (
            "append to a number",
            json!([image, delta("image", json!({"width": 1}), "append", Some("width"))]),
            Err("props.width"),
        ),
        (
            "append to a boolean",
            json!([loading, delta("loading", json!({"done": true}), "append", Some("done"))]),
            Err("props.done"),
        ),
        (
            "append a number to a string",
            json!([text, delta("text", json!({"content": 1}), "append", None)]),
            Err("props.content"),
        ),
        (
            "append an array to a string",
            json!([text, delta("text", json!({"content": ["d"]}), "append", None)]),
            Err("props.content"),
        ),
        ("append props to props", json!([image, delta("image", json!({"alt": "a"}), "append", None)]), Err("props")),
        (
            "append props to props, empty path",
            json!([text, delta("text", json!({"content": "d"}), "append", Some(""))]),
            Err("props"),
        ),
        (
            "merge into a string",
            json!([text, delta("text", json!({"content": {"k": 1}}), "merge", None)]),
            Err("props.content"),
        ),
        (
            "merge a string into a string",
            json!([text, delta("text", json!({"content": "d"}), "merge", None)]),
            Err("props.content"),
        ),
        (
            "merge into an array",
            json!([event, delta("event", json!({"data": {"items": {"k": 1}}}), "merge", Some("data.items"))]),
            Err("props.data.items"),
        ),
        (
            "merge a string into an object",
            json!([event, delta("event", json!({"data": "x"}), "merge", Some("data"))]),
            Err("props.data"),
        ),
        (
            "merge a string into nothing",
            json!([event, delta("event", json!({"extra": "x"}), "merge", Some("extra"))]),
            Err("props.extra"),
        ),
        (
            "set through a string",
            json!([text, delta("text", json!({"content": {"x": 1}}), "set", Some("content.x"))]),
            Err("props.content.x"),
        ),
        (
            "set through a number",
            json!([image, delta("image", json!({"width": {"deep": 1}}), "set", Some("width.deep"))]),
            Err("props.width.deep"),
        ),
        (
            "append through a number",
            json!([event, delta("event", json!({"data": {"n": {"m": 1}}}), "append", Some("data.n.m"))]),
            Err("props.data.n.m"),
        ),
        (
            "replace under a missing parent",
            json!([image, delta("image", json!({"meta": {"k": 1}}), "replace", Some("meta.k"))]),
            Err("props.meta.k"),
        ),
        (
            "append under a missing parent",
            json!([image, delta("image", json!({"meta": {"k": "a"}}), "append", Some("meta.k"))]),
            Err("props.meta.k"),
        ),
        (
            "set past the end of an array",
            json!([event, delta("event", json!({"data": {"items": {"5": "x"}}}), "set", Some("data.items.5"))]),
            Err("props.data.items.5"),
        ),
        (
            "a word as an array index",
            json!([
                event,
                delta("event", json!({"data": {"items": {"first": "x"}}}), "replace", Some("data.items.first"))
            ]),
            Err("props.data.items.first"),
        ),
        (
            "no value at the default path",
            json!([text, delta("text", json!({"other": "d"}), "append", None)]),
            Err("props.content"),
        ),
        (
            "no value at an explicit path",
            json!([event, delta("event", json!({"data": {}}), "set", Some("data.n"))]),
            Err("props.data.n"),
        ),
        (
            "a delta of another type without type_change",
            json!([text, delta("thinking", json!({"content": "d"}), "append", None)]),
            Err("type"),
        ),
        (
            "a delta without a type",
            json!([text, {"props": {"content": "d"}, "message_id": "m", "delta": true}]),
            Err("type"),
        ),
        (
            "a type_change that conflicts keeps the old type",
            json!([loading, {"type": "text", "props": {"message": 1}, "message_id": "m", "delta": true,
                "type_change": true, "delta_path": "message"}]),
            Err("props.message"),
        ),
    ]);
}

#[test]
fn a_refused_delta_does_not_stop_the_next() {
    let messages = parse(
        "refused then accepted",
        json!([
            {"type": "text", "props": {"content": "a"}, "message_id": "m"},
            {"type": "text", "props": {"content": 1}, "message_id": "m", "delta": true},
            {"type": "text", "props": {"content": "b"}, "message_id": "m", "delta": true},
        ]),
    );
    let mut reducer = Reducer::default();
    let results: Vec<_> = messages.iter().map(|m| reducer.apply(m).map_err(|e| e.field().to_owned())).collect();
    assert_eq!(results, [Ok(0), Err("props.content".to_owned()), Ok(0)]);
    assert_eq!(reducer.text(), "ab");
}

#[test]
fn text_concatenates_text_messages_in_order_of_first_appearance() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("no messages", json!([]), ""),
        (
            "text only, a later delta stays in its message's place",
            json!([
                {"type": "text", "props": {"content": "Hel"}, "message_id": "a"},
                {"type": "thinking", "props": {"content": "hmm"}, "message_id": "t"},
                {"type": "text", "props": {"content": " world"}},
                {"type": "image", "props": {"url": "https://x/1"}},
                {"type": "text", "props": {"content": "lo"}, "message_id": "a", "delta": true},
                {"type": "text", "props": {"content": "!"}, "message_id": "b"},
            ]),
            "Hello world!",
        ),
        (
            "type changes and resends move messages in and out of the text",
            json!([
                {"type": "loading", "props": {"message": "..."}, "message_id": "l"},
                {"type": "text", "props": {"content": "gone"}, "message_id": "g"},
                {"type": "text", "props": {"content": "2"}, "message_id": "k"},
                {"type": "text", "props": {"content": "1"}, "message_id": "l", "delta": true, "type_change": true},
                {"type": "thinking", "props": {"content": "x"}, "message_id": "g", "delta": true, "type_change": true},
                {"type": "text", "props": {"content": "3"}, "message_id": "k", "delta": true},
            ]),
            "123",
        ),
    ];
    for (name, input, want) in cases {
        let mut reducer = Reducer::default();
        for message in parse(name, input) {
            reducer.apply(&message).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert_eq!(reducer.text(), want, "{name}");
    }
}

#[test]
fn get_returns_one_message_by_id() {
    let messages = parse(
        "get",
        json!([
            {"type": "text", "props": {"content": "a"}, "message_id": "m"},
            {"type": "text", "props": {"content": "x"}},
            {"type": "event", "props": {"event": "e"}, "message_id": "e"},
            {"type": "text", "props": {"content": "b"}, "message_id": "m", "delta": true, "chunk_id": "c"},
        ]),
    );
    let mut reducer = Reducer::default();
    let slots: Vec<usize> = messages.iter().map(|m| reducer.apply(m).expect("applies")).collect();
    assert_eq!(slots, [0, 1, 2, 0]);
    let get = |id: &str| reducer.get(id).map(|m| serde_json::to_value(m).expect("JSON"));
    let cases = [
        ("m", Some(json!({"type": "text", "props": {"content": "ab"}, "message_id": "m"}))),
        ("e", Some(json!({"type": "event", "props": {"event": "e"}, "message_id": "e"}))),
        ("x", None),
        ("", None),
    ];
    for (id, want) in cases {
        assert_eq!(get(id), want, "get({id:?})");
    }
    assert_eq!(reducer.messages().len(), 3);
}

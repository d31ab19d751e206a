//! The reply parser's table cases (what each kind of reply parses to, whole and as it streams) and its
//! property tests.

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
    ("two actions with a comma between them", r#"{"type":"action","tool":"a"}, {"type":"action","tool":"b"}"#, Text),
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
    ("an error whose code is a number", r#"{"type": "error", "code": 4, "message": "m"}"#, Malformed("not a number")),
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
        (whole, end) => Err(format!("{input:?}: parse_reply gives {whole:?}; the scanner {emitted:?} then {end:?}")),
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

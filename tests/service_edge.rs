//! The HTTP edge over real sockets: whatever a client sends, a refusal is a status and the OpenAI error
//! envelope (`{"error": {"message", "type", "param", "code"}}`, `content-type: application/json`).
//!
//! 1. A table of malformed requests, each with the status, `param` and `code` it must get: bad, empty,
//!    out-of-range and repeated query parameters on the SSE, WebSocket and chat endpoints; a wrong method on
//!    every route (405, `Allow` kept); WebSocket upgrades without or with a wrong upgrade header; stream ids
//!    that are not UTF-8 once percent-decoded; an unknown path; a request target over 8 KiB (414); over 100
//!    headers or over 32 KiB of them (431); a declared `Content-Length` of 100 GB answered 413 at once, before a
//!    byte of body is sent (with and without `expect: 100-continue`); a chunked body that breaks its framing
//!    (400) or a body that stops arriving (408); a `Last-Event-ID` that is not a sequence or not text; an
//!    HTTP/1.0 upgrade (426); the asterisk, authority and absolute forms of the request target. Requests go
//!    through reqwest, or as raw bytes on a `TcpStream` where reqwest cannot send them.
//! 2. A fuzz-style property test over every endpoint: arbitrary bodies, query strings (percent-escapes, `&`,
//!    `=`, non-ASCII, bytes that are not UTF-8), header values (any valid header bytes) and methods, against
//!    one server for the whole run. Properties: every request is answered; no answer is a 5xx other than 503
//!    `capacity` or `shutting_down`; every answer of 400 or more is `application/json` with the envelope; no
//!    thread of the server panics; `/healthz` answers after every case; and every stream the test made is
//!    ended by the end. `PROPTEST_CASES` sets the number of cases (2,000 by default).
//!
//! A last test, ignored, keeps the requests the service cannot yet answer with the envelope (hyper refuses
//! them before any service code runs); see its doc.

mod common;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use bytes::Bytes;
use common::http::{PATIENCE, create_stream};
use common::server::TestServer;
use common::wait::eventually;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reqwest::Method;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------------------------------------
// Requests and answers over real sockets.
// ---------------------------------------------------------------------------------------------------------

/// An answer as it came off the socket: status, headers (lower-case names, values as lossy text) and body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    /// The first value of a header.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The answer for a failure message: status, headers and the body as text.
    pub(crate) fn describe(&self) -> String {
        format!("{} {:?} {}", self.status, self.headers, String::from_utf8_lossy(&self.body))
    }

    pub(crate) async fn from_reqwest(response: reqwest::Response, read_body: bool) -> Result<Answer, String> {
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let body = if read_body {
            match tokio::time::timeout(PATIENCE, response.bytes()).await {
                Ok(Ok(body)) => body.to_vec(),
                Ok(Err(error)) => return Err(format!("the body of a {status} could not be read: {error}")),
                Err(_) => return Err(format!("the body of a {status} did not end within {PATIENCE:?}")),
            }
        } else {
            Vec::new()
        };
        Ok(Answer { status, headers, body })
    }
}

/// Writes `request` on a new connection to `addr` and reads one answer within `patience`. The request is
/// written as it is: a head that declares a body need not be followed by one.
pub(crate) async fn raw(addr: SocketAddr, request: &[u8], patience: Duration) -> Result<Answer, String> {
    let exchange = async {
        let mut tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        tcp.write_all(request).await.map_err(|e| format!("write: {e}"))?;
        read_answer(&mut tcp).await
    };
    tokio::time::timeout(patience, exchange).await.unwrap_or_else(|_| Err(format!("no answer within {patience:?}")))
}

/// Reads one HTTP/1.1 answer: the head, then a body by `content-length`, by chunks, or to the end.
pub(crate) async fn read_answer(tcp: &mut TcpStream) -> Result<Answer, String> {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if fill(tcp, &mut buffer).await? == 0 {
            return Err(format!("the connection closed before a whole head: {:?}", String::from_utf8_lossy(&buffer)));
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not a status line: {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = buffer.split_off(head_end);
    let length = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse::<usize>().ok());
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if let Some(length) = length {
        while body.len() < length {
            if fill(tcp, &mut body).await? == 0 {
                return Err(format!("the body ended after {} of {length} bytes", body.len()));
            }
        }
        body.truncate(length);
    } else if chunked {
        body = loop {
            if let Some(decoded) = dechunk(&body)? {
                break decoded;
            }
            if fill(tcp, &mut body).await? == 0 {
                return Err("the chunked body ended early".into());
            }
        };
    } else {
        while fill(tcp, &mut body).await? > 0 {}
    }
    Ok(Answer { status, headers, body })
}

pub(crate) async fn fill(tcp: &mut TcpStream, buffer: &mut Vec<u8>) -> Result<usize, String> {
    let mut chunk = [0u8; 8192];
    let n = tcp.read(&mut chunk).await.map_err(|e| format!("read: {e}"))?;
    buffer.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// A whole chunked body decoded, or `None` while it is incomplete.
pub(crate) fn dechunk(mut bytes: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = bytes.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let size_text = String::from_utf8_lossy(&bytes[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| format!("a bad chunk size {size_text:?}"))?;
        let data = &bytes[line_end + 2..];
        if size == 0 {
            return Ok(Some(out));
        }
        if data.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&data[..size]);
        bytes = &data[size + 2..];
    }
}

/// A raw request head: the request line with `target` as bytes, `host`, then `headers`, then the blank line.
pub(crate) fn raw_head(method: &str, target: &[u8], headers: &[(&str, &[u8])]) -> Vec<u8> {
    let mut head = format!("{method} ").into_bytes();
    head.extend_from_slice(target);
    head.extend_from_slice(b" HTTP/1.1\r\nhost: 127.0.0.1\r\n");
    for (name, value) in headers {
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// What the envelope of an answer says: `(param, code)`. An error when the answer is not `application/json`,
/// not JSON, or not exactly the four keys with their types (`message` a non-empty string, `type` a string,
/// `param` and `code` a string or null).
pub(crate) fn envelope(answer: &Answer) -> Result<(Option<String>, Option<String>), String> {
    let content_type = answer.header("content-type");
    if content_type != Some("application/json") {
        return Err(format!("content-type is {content_type:?}, not application/json"));
    }
    let body: Value = serde_json::from_slice(&answer.body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let error = body.get("error").and_then(Value::as_object).ok_or("no \"error\" object")?;
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["code", "message", "param", "type"] {
        return Err(format!("the envelope's keys are {keys:?}"));
    }
    if error["message"].as_str().is_none_or(str::is_empty) {
        return Err("message is not a non-empty string".into());
    }
    if !error["type"].is_string() {
        return Err("type is not a string".into());
    }
    let text_or_null = |key: &str| match &error[key] {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        other => Err(format!("{key} is {other}, not a string or null")),
    };
    Ok((text_or_null("param")?, text_or_null("code")?))
}

// ---------------------------------------------------------------------------------------------------------
// 1. The table.
// ---------------------------------------------------------------------------------------------------------

/// The headers of a valid WebSocket upgrade.
pub(crate) const UPGRADE: [(&str, &str); 4] = [
    ("connection", "Upgrade"),
    ("upgrade", "websocket"),
    ("sec-websocket-version", "13"),
    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
];

/// How a row's request is sent.
pub(crate) enum Ask {
    /// Through reqwest.
    Client { method: Method, path: String, headers: Vec<(String, String)>, body: Option<String> },
    /// As these bytes on a new connection, the answer expected within the duration.
    Raw(Vec<u8>, Duration),
}

impl Ask {
    pub(crate) fn new(method: Method, path: impl Into<String>) -> Ask {
        Ask::Client { method, path: path.into(), headers: Vec::new(), body: None }
    }

    pub(crate) fn get(path: impl Into<String>) -> Ask {
        Ask::new(Method::GET, path)
    }

    pub(crate) fn post(path: impl Into<String>, body: impl Into<String>) -> Ask {
        Ask::new(Method::POST, path).body(body)
    }

    pub(crate) fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Ask {
        if let Ask::Client { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }

    pub(crate) fn body(mut self, text: impl Into<String>) -> Ask {
        if let Ask::Client { body, .. } = &mut self {
            *body = Some(text.into());
        }
        self
    }

    /// The WebSocket upgrade headers, but for `skip` (left out) and `change` (given another value).
    pub(crate) fn upgrade(mut self, skip: Option<&str>, change: Option<(&str, &str)>) -> Ask {
        for (name, value) in UPGRADE {
            if skip == Some(name) {
                continue;
            }
            let value = change.filter(|(n, _)| *n == name).map_or(value, |(_, v)| v);
            self = self.header(name, value);
        }
        self
    }

    pub(crate) async fn send(&self, client: &reqwest::Client, server: &TestServer) -> Result<Answer, String> {
        match self {
            Ask::Raw(bytes, patience) => raw(server.addr, bytes, *patience).await,
            Ask::Client { method, path, headers, body } => {
                let mut request = client.request(method.clone(), server.url(path));
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                if let Some(body) = body {
                    request = request.header("content-type", "application/json").body(body.clone());
                }
                let response = tokio::time::timeout(PATIENCE, request.send())
                    .await
                    .map_err(|_| format!("no answer within {PATIENCE:?}"))?
                    .map_err(|e| format!("no answer: {e}"))?;
                Answer::from_reqwest(response, true).await
            }
        }
    }
}

/// One row: a request and what it must get.
pub(crate) struct Row {
    pub(crate) what: String,
    pub(crate) ask: Ask,
    pub(crate) status: u16,
    pub(crate) param: Option<&'static str>,
    pub(crate) code: &'static str,
    /// For a 405: the methods `Allow` must list.
    pub(crate) allow: Option<&'static [&'static str]>,
    /// A retry can help (no `x-should-retry: false`).
    pub(crate) retryable: bool,
}

pub(crate) fn row(
    what: impl Into<String>,
    ask: Ask,
    status: u16,
    param: Option<&'static str>,
    code: &'static str,
) -> Row {
    Row { what: what.into(), ask, status, param, code, allow: None, retryable: false }
}

/// Sends a row's request and says what is wrong with its answer, if anything.
pub(crate) async fn check_row(row: &Row, client: &reqwest::Client, server: &TestServer) -> Result<(), String> {
    let answer = row.ask.send(client, server).await?;
    let mut problems = Vec::new();
    if answer.status != row.status {
        problems.push(format!("status {} instead of {}", answer.status, row.status));
    }
    match envelope(&answer) {
        Err(problem) => problems.push(problem),
        Ok((param, code)) => {
            if param.as_deref() != row.param {
                problems.push(format!("param {param:?} instead of {:?}", row.param));
            }
            if code.as_deref() != Some(row.code) {
                problems.push(format!("code {code:?} instead of {:?}", row.code));
            }
        }
    }
    let retry = answer.header("x-should-retry");
    if row.retryable && retry.is_some() {
        problems.push(format!("x-should-retry is {retry:?}, though a retry can help"));
    }
    if !row.retryable && retry != Some("false") {
        problems.push(format!("x-should-retry is {retry:?}, not \"false\""));
    }
    if let Some(allow) = row.allow {
        let mut want: Vec<&str> = allow.to_vec();
        want.sort_unstable();
        let mut got: Vec<String> =
            answer.header("allow").unwrap_or_default().split(',').map(|m| m.trim().to_owned()).collect();
        got.sort_unstable();
        if got != want {
            problems.push(format!("Allow is {:?}, not {want:?}", answer.header("allow")));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(format!("{}\n      got: {}", problems.join("; "), answer.describe())) }
}

/// Sends every row and fails with every row that went wrong.
pub(crate) async fn check_rows(rows: &[Row], client: &reqwest::Client, server: &TestServer) {
    let mut failures = Vec::new();
    for row in rows {
        if let Err(mut problem) = check_row(row, client, server).await {
            if problem.len() > 800 {
                let mut end = 800;
                while !problem.is_char_boundary(end) {
                    end -= 1;
                }
                problem.truncate(end);
                problem.push_str("...");
            }
            failures.push(format!("  {}: {problem}", row.what));
        }
    }
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), rows.len(), failures.join("\n"));
}

/// The bad queries of a subscription (SSE or WebSocket), with the `param` and `code` each gets.
pub(crate) const BAD_SUBSCRIBE_QUERIES: [(&str, &str, &str); 13] = [
    ("from=-1", "from", "invalid_value"),
    ("from=18446744073709551616", "from", "invalid_value"),
    ("from=abc", "from", "invalid_value"),
    ("from=", "from", "invalid_value"),
    ("from=%FF", "from", "invalid_value"),
    ("from=1&from=2", "from", "duplicate_parameter"),
    ("from=1&fr%6Fm=2", "from", "duplicate_parameter"),
    ("format=cui&format=openai", "format", "duplicate_parameter"),
    ("format=bogus", "format", "invalid_value"),
    ("include_usage=maybe", "include_usage", "invalid_value"),
    ("format=openai&reasoning=bogus", "reasoning", "invalid_value"),
    ("reasoning=bogus", "reasoning", "invalid_value"),
    ("from=99", "from", "sequence_ahead"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_query_path_method_and_upgrade_gets_the_envelope() {
    // A short body timeout, so the row of a body that never arrives is quick.
    let settings = Settings { body_timeout: Duration::from_secs(1), ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    let id = create_stream(&client, &server).await;
    let chat = json!({ "model": "echo", "messages": [{ "role": "user", "content": "hi" }] }).to_string();
    let mut rows = Vec::new();

    // Queries: SSE, WebSocket (a valid upgrade otherwise), chat.
    for (query, param, code) in BAD_SUBSCRIBE_QUERIES {
        let events = format!("/v1/streams/{id}/events?{query}");
        rows.push(row(format!("GET {events}"), Ask::get(&events), 400, Some(param), code));
        let ws = format!("/v1/streams/{id}/ws?{query}");
        rows.push(row(format!("upgrade {ws}"), Ask::get(&ws).upgrade(None, None), 400, Some(param), code));
    }
    for (query, param, code) in [
        ("accept=bogus", "accept", "invalid_value"),
        ("accept=", "accept", "invalid_value"),
        ("accept=cui&accept=openai", "accept", "duplicate_parameter"),
    ] {
        let path = format!("/v1/chat/completions?{query}");
        rows.push(row(format!("POST {path}"), Ask::post(&path, &chat), 400, Some(param), code));
    }
    rows.push(row(
        "POST /v1/chat/completions with x-agentmux-reasoning: bogus",
        Ask::post("/v1/chat/completions", &chat).header("x-agentmux-reasoning", "bogus"),
        400,
        Some("x-agentmux-reasoning"),
        "invalid_value",
    ));

    // Last-Event-ID, on SSE and on the WebSocket.
    for value in ["abc", "-1", "1.5"] {
        rows.push(row(
            format!("GET events with Last-Event-ID: {value}"),
            Ask::get(format!("/v1/streams/{id}/events")).header("last-event-id", value),
            400,
            Some("Last-Event-ID"),
            "invalid_value",
        ));
    }
    rows.push(row(
        "upgrade ws with Last-Event-ID: abc",
        Ask::get(format!("/v1/streams/{id}/ws")).upgrade(None, None).header("last-event-id", "abc"),
        400,
        Some("Last-Event-ID"),
        "invalid_value",
    ));
    rows.push(row(
        "GET events with Last-Event-ID: 99 (ahead)",
        Ask::get(format!("/v1/streams/{id}/events")).header("last-event-id", "99"),
        400,
        Some("Last-Event-ID"),
        "sequence_ahead",
    ));
    rows.push(row(
        "GET events with a Last-Event-ID that is not text (raw byte 0xFF)",
        Ask::Raw(
            raw_head(
                "GET",
                format!("/v1/streams/{id}/events").as_bytes(),
                &[("connection", b"close"), ("last-event-id", b"1\xff")],
            ),
            PATIENCE,
        ),
        400,
        Some("Last-Event-ID"),
        "invalid_value",
    ));

    // A wrong method on every route: 405, the envelope, and `Allow` kept.
    const GET: &[&str] = &["GET", "HEAD"];
    const POST: &[&str] = &["POST"];
    const GET_POST: &[&str] = &["GET", "HEAD", "POST"];
    let routes: Vec<(Method, String, &'static [&'static str])> = vec![
        (Method::POST, "/healthz".into(), GET),
        (Method::POST, "/v1/models".into(), GET),
        (Method::GET, "/v1/chat/completions".into(), POST),
        (Method::OPTIONS, "/v1/chat/completions".into(), POST),
        (Method::DELETE, "/v1/streams".into(), GET_POST),
        (Method::PATCH, "/v1/streams".into(), GET_POST),
        (Method::DELETE, format!("/v1/streams/{id}"), GET),
        (Method::GET, format!("/v1/streams/{id}/messages"), POST),
        (Method::PUT, format!("/v1/streams/{id}/messages"), POST),
        (Method::GET, format!("/v1/streams/{id}/end"), POST),
        (Method::GET, format!("/v1/streams/{id}/cancel"), POST),
        (Method::POST, format!("/v1/streams/{id}/events"), GET),
        (Method::POST, format!("/v1/streams/{id}/ws"), GET),
        (Method::POST, "/v1/ws".into(), GET),
        (Method::DELETE, "/v1/streams/no-such-stream/end".into(), POST),
    ];
    for (method, path, allow) in routes {
        let mut method_row =
            row(format!("{method} {path}"), Ask::new(method, &path).body("{}"), 405, None, "method_not_allowed");
        method_row.allow = Some(allow);
        rows.push(method_row);
    }

    // Upgrades: none at all, then each header left out or wrong; on both WebSocket endpoints.
    for path in [format!("/v1/streams/{id}/ws"), "/v1/ws".to_owned()] {
        let cases: [(&str, Ask, &'static str); 7] = [
            ("no upgrade headers", Ask::get(&path), "connection"),
            ("connection: keep-alive", Ask::get(&path).upgrade(None, Some(("connection", "keep-alive"))), "connection"),
            ("no upgrade header", Ask::get(&path).upgrade(Some("upgrade"), None), "upgrade"),
            ("upgrade: h2c", Ask::get(&path).upgrade(None, Some(("upgrade", "h2c"))), "upgrade"),
            ("no version", Ask::get(&path).upgrade(Some("sec-websocket-version"), None), "sec-websocket-version"),
            (
                "sec-websocket-version: 8",
                Ask::get(&path).upgrade(None, Some(("sec-websocket-version", "8"))),
                "sec-websocket-version",
            ),
            ("no key", Ask::get(&path).upgrade(Some("sec-websocket-key"), None), "sec-websocket-key"),
        ];
        for (what, ask, param) in cases {
            rows.push(row(format!("GET {path} with {what}"), ask, 400, Some(param), "websocket_upgrade"));
        }
    }

    // Paths: a stream id that is not UTF-8 once decoded, on every stream route; unknown paths.
    rows.push(row(
        "GET /v1/streams/%FF%FE/events",
        Ask::get("/v1/streams/%FF%FE/events"),
        400,
        Some("id"),
        "invalid_value",
    ));
    rows.push(row("GET /v1/streams/%FF%FE", Ask::get("/v1/streams/%FF%FE"), 400, Some("id"), "invalid_value"));
    rows.push(row(
        "upgrade /v1/streams/%C3%28/ws",
        Ask::get("/v1/streams/%C3%28/ws").upgrade(None, None),
        400,
        Some("id"),
        "invalid_value",
    ));
    for action in ["messages", "end", "cancel"] {
        let target = format!("/v1/streams/%FF%FE/{action}");
        rows.push(row(
            format!("POST {target} (raw)"),
            Ask::Raw(
                raw_head("POST", target.as_bytes(), &[("connection", b"close"), ("content-length", b"0")]),
                PATIENCE,
            ),
            400,
            Some("id"),
            "invalid_value",
        ));
    }
    rows.push(row(
        "GET /v1/streams/é/events (raw UTF-8 bytes in the path: a path, but no such stream)",
        Ask::Raw(raw_head("GET", "/v1/streams/é/events".as_bytes(), &[("connection", b"close")]), PATIENCE),
        404,
        None,
        "stream_not_found",
    ));
    rows.push(row("GET /nope", Ask::get("/nope"), 404, None, "not_found"));
    rows.push(row("POST /v1", Ask::post("/v1", "{}"), 404, None, "not_found"));
    rows.push(row(
        format!("GET /v1/streams/{id}/nope"),
        Ask::get(format!("/v1/streams/{id}/nope")),
        404,
        None,
        "not_found",
    ));
    rows.push(row("GET /v1/streams/ (no id)", Ask::get("/v1/streams/"), 404, None, "not_found"));
    rows.push(row(
        "GET /v1/streams/no-such-stream/events",
        Ask::get("/v1/streams/no-such-stream/events"),
        404,
        None,
        "stream_not_found",
    ));

    // The head: a long target, many headers, large headers.
    let long_query = format!("/v1/models?pad={}", "a".repeat(9 << 10));
    rows.push(row("GET /v1/models with a 9 KiB query", Ask::get(&long_query), 414, None, "uri_too_long"));
    let long_path = format!("/v1/streams/{}/events", "a".repeat(9 << 10));
    rows.push(row("GET a 9 KiB path", Ask::get(&long_path), 414, None, "uri_too_long"));
    let mut many = Ask::get("/healthz");
    for i in 0..65 {
        many = many.header(format!("x-pad-{i}"), "1");
    }
    rows.push(row("GET /healthz with 65 headers", many, 431, None, "headers_too_large"));
    rows.push(row(
        "GET /healthz with 33 KiB in one header",
        Ask::get("/healthz").header("x-pad", "a".repeat(33 << 10)),
        431,
        None,
        "headers_too_large",
    ));
    let mut wide = Ask::get("/healthz");
    for i in 0..40 {
        wide = wide.header(format!("x-pad-{i}"), "b".repeat(1 << 10));
    }
    rows.push(row("GET /healthz with 40 headers of 1 KiB", wide, 431, None, "headers_too_large"));

    // A declared body of 100 GB: 413 at once, while the body is never sent.
    for target in ["/v1/streams".to_owned(), format!("/v1/streams/{id}/messages"), "/v1/chat/completions".to_owned()] {
        rows.push(row(
            format!("POST {target} declaring content-length: 100000000000, no body sent"),
            Ask::Raw(
                raw_head(
                    "POST",
                    target.as_bytes(),
                    &[("content-type", b"application/json"), ("content-length", b"100000000000")],
                ),
                Duration::from_secs(3),
            ),
            413,
            None,
            "body_too_large",
        ));
    }

    rows.push(row(
        "POST /v1/streams declaring 100 GB with expect: 100-continue",
        Ask::Raw(
            raw_head("POST", b"/v1/streams", &[("expect", b"100-continue"), ("content-length", b"100000000000")]),
            Duration::from_secs(3),
        ),
        413,
        None,
        "body_too_large",
    ));
    let mut broken_chunks =
        raw_head("POST", b"/v1/streams", &[("transfer-encoding", b"chunked"), ("content-type", b"application/json")]);
    broken_chunks.extend_from_slice(b"zz\r\n");
    rows.push(row(
        "POST /v1/streams with a chunk size that is not hex",
        Ask::Raw(broken_chunks, PATIENCE),
        400,
        None,
        "bad_body",
    ));
    let mut stalled =
        raw_head("POST", b"/v1/streams", &[("content-length", b"10"), ("content-type", b"application/json")]);
    stalled.extend_from_slice(b"{}");
    let mut slow = row(
        "POST /v1/streams declaring 10 bytes and sending 2 (body timeout 1 s)",
        Ask::Raw(stalled, Duration::from_secs(4)),
        408,
        None,
        "body_timeout",
    );
    slow.retryable = true;
    rows.push(slow);

    // Other forms of the request: HTTP/1.0 upgrade, asterisk, authority and absolute forms.
    let mut old_upgrade = raw_head("GET", b"/v1/ws", &UPGRADE.map(|(n, v)| (n, v.as_bytes())));
    old_upgrade = String::from_utf8(old_upgrade).expect("ASCII").replacen("HTTP/1.1", "HTTP/1.0", 1).into_bytes();
    rows.push(row("an HTTP/1.0 upgrade of /v1/ws", Ask::Raw(old_upgrade, PATIENCE), 426, None, "websocket_upgrade"));
    for (method, target) in [("OPTIONS", "*"), ("CONNECT", "127.0.0.1:80"), ("GET", "http://127.0.0.1/v1/nope")] {
        rows.push(row(
            format!("{method} {target}"),
            Ask::Raw(raw_head(method, target.as_bytes(), &[("connection", b"close")]), PATIENCE),
            404,
            None,
            "not_found",
        ));
    }

    let started = Instant::now();
    check_rows(&rows, &client, &server).await;
    println!("{} rows in {:?}", rows.len(), started.elapsed());
    assert!(rows.len() >= 80, "the table has {} rows", rows.len());

    // Parameters an endpoint does not read are ignored, given once or more: only its own are ambiguous twice.
    for (what, ask) in [
        ("GET events?_=1&_=2&x&x", Ask::get(format!("/v1/streams/{id}/events?_=1&_=2&x&x"))),
        ("upgrade ws?_=1&_=2", Ask::get(format!("/v1/streams/{id}/ws?_=1&_=2")).upgrade(None, None)),
        (
            "POST chat?from=1&from=2&format=a&format=b",
            Ask::post("/v1/chat/completions?from=1&from=2&format=a&format=b", &chat),
        ),
    ] {
        let Ask::Client { method, path, headers, body } = ask else { unreachable!("a client request") };
        let mut request = client.request(method, server.url(&path));
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body);
        }
        let response = request.send().await.expect("an answer");
        assert!([200, 101].contains(&response.status().as_u16()), "{what}: {}", response.status());
    }

    // The service still works, and the stream the rows read is as it was: open, holding `stream_start`.
    let (status, snapshot) = common::http::get_json(&client, &server.url(&format!("/v1/streams/{id}"))).await;
    assert_eq!(status, 200, "{snapshot}");
    assert_eq!(snapshot["last_sequence"], 1, "{snapshot}");
    common::http::end_stream(&client, &server, &id).await;
}

/// `HEAD` reaches a WebSocket route (axum serves it beside `GET`) but cannot upgrade: 405 with `Allow: GET`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_on_a_websocket_route_is_405_with_allow() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = common::http::create_stream(&client, &server).await;
    for path in [format!("/v1/streams/{id}/ws"), "/v1/ws".to_owned()] {
        let response = client.head(server.url(&path)).send().await.expect("HEAD");
        assert_eq!(response.status(), 405, "{path}");
        assert_eq!(response.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET"), "{path}");
        assert_eq!(common::http::header(&response, "content-type"), "application/json", "{path}");
    }
    common::http::end_stream(&client, &server, &id).await;
}

/// Requests hyper cannot parse as HTTP, which it refuses before any service code runs (`docs/http-api.md`,
/// Errors): its own bare status (`content-length: 0`, no body), then the connection closes, and the service
/// goes on serving everyone else. Pinned so that a change in what reaches the service is noticed.
///
/// - a request target with bytes that are not UTF-8 (raw `0xFF 0xFE`, not percent-encoded): the `http` crate
///   will not make a `Uri` of it: `400`;
/// - a request target over 64 KiB (past what an `http::Uri` holds): `414`;
/// - more than 100 headers (hyper's limit; the service's own, 64, answers with the envelope below it): `431`;
/// - a request line with `HTTP/2.0`, a `content-length` that is not a number or two that differ, a header
///   line without a colon: `400`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hyper_cannot_parse_get_its_bare_status_and_a_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start().await;
    let mut many = String::new();
    for i in 0..101 {
        many.push_str(&format!("x-pad-{i}: 1\r\n"));
    }
    let huge = format!("GET /v1/models?pad={} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70 << 10));
    let rows: Vec<(&str, Vec<u8>, &str)> = vec![
        ("a raw non-UTF-8 path", b"GET /v1/streams/\xff\xfe/events HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), "400"),
        ("a target over 64 KiB", huge.into_bytes(), "414"),
        ("101 headers", format!("GET /healthz HTTP/1.1\r\nhost: x\r\n{many}\r\n").into_bytes(), "431"),
        ("HTTP/2.0 in the request line", b"GET /healthz HTTP/2.0\r\nhost: x\r\n\r\n".to_vec(), "400"),
        (
            "a content-length that is not a number",
            b"POST /v1/streams HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n".to_vec(),
            "400",
        ),
        (
            "two content-lengths that differ",
            b"POST /v1/streams HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n{}".to_vec(),
            "400",
        ),
        ("a header line without a colon", b"GET /healthz HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n".to_vec(), "400"),
    ];
    for (what, request, status) in rows {
        let mut tcp = tokio::net::TcpStream::connect(server.addr).await.expect("connect");
        tcp.write_all(&request).await.expect("write");
        let mut answer = Vec::new();
        let read = tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(read.is_ok(), "{what}: the connection closes after the answer: {answer}");
        assert!(answer.starts_with(&format!("HTTP/1.1 {status} ")), "{what}: {answer}");
        let client = reqwest::Client::new();
        let health = client.get(server.url("/healthz")).send().await.expect("healthz");
        assert_eq!(health.status(), 200, "{what}: others are still served");
    }
}

// ---------------------------------------------------------------------------------------------------------
// 2. The fuzz test.
// ---------------------------------------------------------------------------------------------------------

/// The name of the fuzz server's runtime threads, by which the panic hook knows the server's panics.
pub(crate) const SERVER_THREADS: &str = "edge-fuzz-server";

/// Panics on the fuzz server's threads.
pub(crate) static SERVER_PANICS: AtomicUsize = AtomicUsize::new(0);

/// Bytes shown escaped in a failing case.
#[derive(Clone, PartialEq)]
pub(crate) struct Raw(pub(crate) Bytes);

impl fmt::Debug for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Which stream a stream endpoint is asked about.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Id {
    /// A stream made for the case, open when the request is sent.
    Real,
    /// An id no stream has: a path segment as it is sent (percent-escapes included).
    MadeUp(String),
}

/// An endpoint.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Target {
    Create,
    Append(Id),
    End(Id),
    Cancel(Id),
    Status(Id),
    Events(Id),
    Ws(Id),
    WsMany,
    Chat,
    Models,
    Healthz,
}

impl Target {
    /// The route's own method.
    pub(crate) fn method(&self) -> Method {
        match self {
            Target::Create | Target::Append(_) | Target::End(_) | Target::Cancel(_) | Target::Chat => Method::POST,
            _ => Method::GET,
        }
    }

    /// The endpoint's name, for the summary.
    pub(crate) fn name(&self) -> String {
        let real = |id: &Id| if *id == Id::Real { "" } else { " (made-up id)" };
        match self {
            Target::Create => "create".into(),
            Target::Append(id) => format!("append{}", real(id)),
            Target::End(id) => format!("end{}", real(id)),
            Target::Cancel(id) => format!("cancel{}", real(id)),
            Target::Status(id) => format!("status{}", real(id)),
            Target::Events(id) => format!("events{}", real(id)),
            Target::Ws(id) => format!("ws{}", real(id)),
            Target::WsMany => "ws (many)".into(),
            Target::Chat => "chat".into(),
            Target::Models => "models".into(),
            Target::Healthz => "healthz".into(),
        }
    }

    pub(crate) fn id(&self) -> Option<&Id> {
        match self {
            Target::Append(id)
            | Target::End(id)
            | Target::Cancel(id)
            | Target::Status(id)
            | Target::Events(id)
            | Target::Ws(id) => Some(id),
            _ => None,
        }
    }

    /// The path, with `real` as the id of a real stream.
    pub(crate) fn path(&self, real: Option<&str>) -> String {
        let id = match self.id() {
            Some(Id::Real) => real.expect("a real stream").to_owned(),
            Some(Id::MadeUp(id)) => id.clone(),
            None => String::new(),
        };
        match self {
            Target::Create => "/v1/streams".into(),
            Target::Append(_) => format!("/v1/streams/{id}/messages"),
            Target::End(_) => format!("/v1/streams/{id}/end"),
            Target::Cancel(_) => format!("/v1/streams/{id}/cancel"),
            Target::Status(_) => format!("/v1/streams/{id}"),
            Target::Events(_) => format!("/v1/streams/{id}/events"),
            Target::Ws(_) => format!("/v1/streams/{id}/ws"),
            Target::WsMany => "/v1/ws".into(),
            Target::Chat => "/v1/chat/completions".into(),
            Target::Models => "/v1/models".into(),
            Target::Healthz => "/healthz".into(),
        }
    }
}

/// One fuzz request.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) target: Target,
    /// `None`: the route's own method.
    pub(crate) method: Option<Method>,
    /// What follows `?` (none when empty), as drawn; [`encode_query`] makes it sendable.
    pub(crate) query: String,
    pub(crate) headers: Vec<(String, Raw)>,
    pub(crate) body: Raw,
}

pub(crate) fn made_up_id() -> impl Strategy<Value = Id> {
    prop_oneof![
        2 => "[0-9a-f]{32}",
        2 => "[a-zA-Z0-9_-]{1,12}",
        3 => prop::collection::vec(any::<u8>(), 1..12).prop_map(|bytes| percent_encode_all(&bytes)),
        1 => "[a-zé日😀 .~!$&'()*+,;=:@]{1,8}".prop_map(|text| percent_encode_all(text.as_bytes())),
    ]
    .prop_map(Id::MadeUp)
}

/// Every byte but `[A-Za-z0-9_-]` as `%XX`, so the segment stays one segment.
pub(crate) fn percent_encode_all(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub(crate) fn id() -> impl Strategy<Value = Id> {
    prop_oneof![3 => Just(Id::Real), 2 => made_up_id()]
}

pub(crate) fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        2 => Just(Target::Create),
        4 => id().prop_map(Target::Append),
        2 => id().prop_map(Target::End),
        1 => id().prop_map(Target::Cancel),
        1 => id().prop_map(Target::Status),
        3 => id().prop_map(Target::Events),
        2 => id().prop_map(Target::Ws),
        1 => Just(Target::WsMany),
        4 => Just(Target::Chat),
        1 => Just(Target::Models),
        1 => Just(Target::Healthz),
    ]
}

pub(crate) fn method() -> impl Strategy<Value = Option<Method>> {
    prop_oneof![
        12 => Just(None),
        1 => prop::sample::select(vec![
            Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH, Method::OPTIONS, Method::HEAD,
        ])
        .prop_map(Some),
    ]
}

pub(crate) fn param_name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec!["from", "format", "include_usage", "reasoning", "accept", "_"]).prop_map(String::from),
        1 => "[a-zA-Z%0-9_.é]{0,8}",
    ]
}

pub(crate) fn param_value() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "0", "1", "2", "cui", "openai", "true", "false", "reasoning", "reasoning_content", "both", "standard",
            "cui-web", "CUI", "", "-1", "18446744073709551615", "18446744073709551616", "1e3", "+1", " 1", "null",
        ])
        .prop_map(String::from),
        2 => any::<u64>().prop_map(|n| n.to_string()),
        2 => "[a-z0-9 +%=&;#?é日😀\"<>\\[\\]{}|^`~.-]{0,16}",
        2 => prop::collection::vec(any::<u8>(), 0..6).prop_map(|bytes| bytes.iter().map(|b| format!("%{b:02x}")).collect()),
        1 => "%[0-9A-Za-z%]{0,3}",
    ]
}

/// A query parameter: often a known name with one of its valid values, so that cases reach past the parser.
pub(crate) fn param() -> impl Strategy<Value = (String, String)> {
    let valid = prop::sample::select(vec![
        ("from", "0"),
        ("from", "1"),
        ("from", "2"),
        ("format", "cui"),
        ("format", "openai"),
        ("include_usage", "true"),
        ("include_usage", "false"),
        ("reasoning", "reasoning"),
        ("reasoning", "reasoning_content"),
        ("reasoning", "both"),
        ("accept", "cui"),
        ("accept", "openai"),
        ("accept", "standard"),
        ("accept", "cui-web"),
        ("_", "1700000000000"),
    ]);
    prop_oneof![
        4 => valid.prop_map(|(name, value)| (name.to_owned(), value.to_owned())),
        3 => (param_name(), param_value()),
    ]
}

pub(crate) fn query() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just(String::new()),
        6 => prop::collection::vec((param(), any::<bool>()), 1..5).prop_map(|pairs| {
            pairs
                .into_iter()
                .map(|((name, value), bare)| if bare && value.is_empty() { name } else { format!("{name}={value}") })
                .collect::<Vec<_>>()
                .join("&")
        }),
        2 => ".{0,40}",
        1 => "[=&%;+?/#a-f0-9]{0,24}",
    ]
}

/// `query` as it can go on the wire: bytes outside the safe set (non-ASCII, space, `#`, quotes, controls)
/// become `%XX`; `%` stays, so escapes that do not decode (`%zz`, `%` at the end) are sent as they are.
pub(crate) fn encode_query(query: &str) -> String {
    query
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub(crate) fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "content-type", "last-event-id", "x-agentmux-accept", "x-agentmux-reasoning", "x-agentmux-on-disconnect",
            "connection", "upgrade", "sec-websocket-version", "sec-websocket-key", "sec-websocket-protocol",
            "sec-websocket-extensions", "accept", "origin", "cookie", "authorization", "x-forwarded-for",
        ])
        .prop_map(String::from),
        1 => "[a-z][a-z0-9-]{0,15}".prop_filter("a header the client itself must set", |name| {
            !["host", "content-length", "transfer-encoding", "te", "trailer", "expect"].contains(&name.as_str())
        }),
    ]
}

/// A byte a header value may hold: tab, visible ASCII and space, and `obs-text` (0x80 to 0xFF).
pub(crate) fn header_byte() -> impl Strategy<Value = u8> {
    prop_oneof![1 => Just(b'\t'), 8 => 0x20u8..=0x7e, 2 => 0x80u8..=0xff]
}

pub(crate) fn header_value() -> impl Strategy<Value = Raw> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "upgrade", "Upgrade, keep-alive", "websocket", "13", "8", "dGhlIHNhbXBsZSBub25jZQ==", "close", "keep-alive",
            "application/json", "application/x-ndjson", "text/plain", "cui", "openai", "cui-web", "reasoning", "both",
            "cancel", "1", "0", "abc", "-1", "18446744073709551616", "", " ", "*/*", "text/event-stream",
        ])
        .prop_map(|v| Raw(Bytes::from_static(v.as_bytes()))),
        3 => prop::collection::vec(header_byte(), 0..40).prop_map(|v| Raw(Bytes::from(v))),
    ]
}

pub(crate) fn headers(target: &Target) -> BoxedStrategy<Vec<(String, Raw)>> {
    let upgrade_weight = if matches!(target, Target::Ws(_) | Target::WsMany) { 4 } else { 1 };
    let some = prop::collection::vec((header_name(), header_value()), 0..4).boxed();
    let upgrade =
        UPGRADE.iter().map(|(n, v)| (n.to_string(), Raw(Bytes::from_static(v.as_bytes())))).collect::<Vec<_>>();
    prop_oneof![
        4 => some.clone(),
        upgrade_weight => (some, Just(upgrade)).prop_map(|(mut extra, upgrade)| {
            extra.extend(upgrade);
            extra
        }),
    ]
    .boxed()
}

/// Strings that are hard on JSON, SSE and Markdown.
pub(crate) fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z ]{0,16}",
        2 => "[a-zA-Z0-9 é日😀\"\\\\\n\r\t\u{0}\u{7f}\u{2028}\u{feff}]{0,24}",
        1 => ".{0,24}",
    ]
}

/// Any JSON value, a few levels deep.
pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    4 => prop::sample::select(vec![
                        "type", "props", "content", "message_id", "delta", "delta_action", "delta_path", "block_id",
                        "status", "model", "messages", "role", "stream", "error", "usage", "finish_reason",
                    ])
                    .prop_map(String::from),
                    1 => text(),
                ],
                inner,
                0..4,
            )
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// A message, often a valid one.
pub(crate) fn message() -> impl Strategy<Value = Value> {
    let kind = prop::sample::select(vec![
        "text",
        "thinking",
        "loading",
        "tool_call",
        "image",
        "action",
        "event",
        "error",
        "custom",
        "",
        "TEXT",
    ]);
    let action = prop::option::of(prop::sample::select(vec!["append", "replace", "merge", "set", "bogus"]));
    (kind, text(), prop::option::of("[a-c]{1,2}"), any::<bool>(), action, prop::option::of(json_value())).prop_map(
        |(kind, content, message_id, delta, action, extra)| {
            let mut message = json!({ "type": kind, "props": { "content": content } });
            if let Some(id) = message_id {
                message["message_id"] = json!(id);
            }
            if delta {
                message["delta"] = json!(true);
            }
            if let Some(action) = action {
                message["delta_action"] = json!(action);
            }
            if let Some(extra) = extra {
                message["props"]["extra"] = extra;
            }
            message
        },
    )
}

/// A body shaped for the endpoint: a chat request, messages (one, an array, NDJSON), an outcome.
pub(crate) fn shaped_body(target: &Target) -> BoxedStrategy<Vec<u8>> {
    match target {
        Target::Chat => {
            let role = prop_oneof![
                6 => Just("user"),
                1 => prop::sample::select(vec!["system", "developer", "assistant", "tool", "robot"]),
            ];
            let model = prop_oneof![8 => Just(json!("echo")), 1 => Just(json!("nope")), 1 => json_value()];
            (model, prop::collection::vec((role, text()), 0..4), any::<bool>(), prop::option::of(any::<bool>()))
                .prop_map(|(model, messages, stream, usage)| {
                    let messages: Vec<Value> = messages
                        .into_iter()
                        .map(|(role, content)| json!({ "role": role, "content": content }))
                        .collect();
                    let mut body = json!({ "model": model, "messages": messages, "stream": stream });
                    if let Some(usage) = usage {
                        body["stream_options"] = json!({ "include_usage": usage });
                    }
                    body.to_string().into_bytes()
                })
                .boxed()
        }
        Target::Append(_) => prop_oneof![
            3 => message().prop_map(|m| m.to_string().into_bytes()),
            2 => prop::collection::vec(message(), 0..4).prop_map(|m| Value::from(m).to_string().into_bytes()),
            2 => prop::collection::vec(message(), 0..4)
                .prop_map(|m| m.iter().map(|m| format!("{m}\n")).collect::<String>().into_bytes()),
        ]
        .boxed(),
        Target::End(_) => {
            let status = prop::sample::select(vec!["completed", "cancelled", "error", "bogus"]);
            let finish = prop::option::of(prop::sample::select(vec!["stop", "length", "tool_calls", "bogus"]));
            (status, finish, prop::option::of(json_value()))
                .prop_map(|(status, finish, error)| {
                    let mut outcome = json!({ "status": status });
                    if let Some(finish) = finish {
                        outcome["finish_reason"] = json!(finish);
                    }
                    if let Some(error) = error {
                        outcome["error"] = error;
                    }
                    outcome.to_string().into_bytes()
                })
                .boxed()
        }
        Target::Create => json_value().prop_map(|model| json!({ "model": model }).to_string().into_bytes()).boxed(),
        _ => json_value().prop_map(|v| v.to_string().into_bytes()).boxed(),
    }
}

pub(crate) fn body(target: &Target) -> BoxedStrategy<Raw> {
    let shaped = shaped_body(target);
    prop_oneof![
        2 => Just(Vec::new()),
        2 => prop::collection::vec(any::<u8>(), 0..300),
        2 => json_value().prop_map(|v| v.to_string().into_bytes()),
        5 => shaped.clone(),
        1 => (shaped, any::<prop::sample::Index>()).prop_map(|(bytes, cut)| {
            let cut = cut.index(bytes.len() + 1);
            bytes[..cut].to_vec()
        }),
    ]
    .prop_map(|bytes| Raw(Bytes::from(bytes)))
    .boxed()
}

pub(crate) fn case() -> impl Strategy<Value = Case> {
    target().prop_flat_map(|target| {
        (Just(target.clone()), method(), query(), headers(&target), body(&target))
            .prop_map(|(target, method, query, headers, body)| Case { target, method, query, headers, body })
    })
}

/// What every case shares.
pub(crate) struct Fuzz {
    pub(crate) server: TestServer,
    pub(crate) client: reqwest::Client,
    /// Streams the cases made (real ids, and `POST /v1/streams` that answered 201).
    pub(crate) made: AtomicUsize,
    /// Answers by endpoint and status, for the summary.
    pub(crate) statuses: std::sync::Mutex<std::collections::BTreeMap<(String, u16), usize>>,
}

/// Sends a case and checks the properties on its answer.
pub(crate) async fn run_case(fuzz: &Fuzz, case: Case) -> Result<(), TestCaseError> {
    let server = &fuzz.server;
    let panics = SERVER_PANICS.load(Ordering::SeqCst);
    let real = match case.target.id() {
        Some(Id::Real) => {
            fuzz.made.fetch_add(1, Ordering::Relaxed);
            Some(create_stream(&fuzz.client, server).await)
        }
        _ => None,
    };
    let method = case.method.clone().unwrap_or_else(|| case.target.method());
    let mut url = server.url(&case.target.path(real.as_deref()));
    if !case.query.is_empty() {
        url = format!("{url}?{}", encode_query(&case.query));
    }
    let mut request = fuzz.client.request(method.clone(), &url);
    for (name, value) in &case.headers {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| TestCaseError::reject(e.to_string()))?;
        let value = HeaderValue::from_bytes(&value.0).map_err(|e| TestCaseError::reject(e.to_string()))?;
        request = request.header(name, value);
    }
    if !case.body.0.is_empty() || method == Method::POST {
        request = request.body(case.body.0.clone());
    }
    let sent = tokio::time::timeout(PATIENCE, request.send()).await;
    let response = match sent {
        Err(_) => return Err(TestCaseError::fail(format!("{method} {url}: no answer within {PATIENCE:?}"))),
        Ok(Err(error)) => return Err(TestCaseError::fail(format!("{method} {url}: no answer: {error:?}"))),
        Ok(Ok(response)) => response,
    };
    let sse = response.headers().get("content-type").is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    let status = response.status().as_u16();
    // A stream's SSE body goes on while the stream is open: status and headers are enough. A 101 has no body.
    let read_body = !sse && status != 101 && method != Method::HEAD;
    let answer = Answer::from_reqwest(response, read_body).await.map_err(TestCaseError::fail)?;
    *fuzz.statuses.lock().expect("statuses").entry((case.target.name(), status)).or_default() += 1;
    let context = || format!("{method} {url}\n  answer: {}", answer.describe());

    if status == 101 && !matches!(case.target, Target::Ws(_) | Target::WsMany) {
        return Err(TestCaseError::fail(format!("a 101 from an endpoint that is not a WebSocket: {}", context())));
    }
    if status >= 400 {
        if method == Method::HEAD {
            // No body to hold the envelope; its content-type must still say JSON.
            prop_assert_eq!(answer.header("content-type"), Some("application/json"), "{}", context());
        } else {
            let (_, code) =
                envelope(&answer).map_err(|problem| TestCaseError::fail(format!("{problem}: {}", context())))?;
            if status >= 500 {
                let allowed = status == 503 && matches!(code.as_deref(), Some("capacity" | "shutting_down"));
                prop_assert!(allowed, "a server error: {}", context());
            }
        }
    }
    if status >= 500 && method == Method::HEAD {
        return Err(TestCaseError::fail(format!("a server error: {}", context())));
    }
    if let (Target::Create, 201) = (&case.target, status) {
        let created: Value = serde_json::from_slice(&answer.body).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let id = created["id"].as_str().ok_or_else(|| TestCaseError::fail(format!("no id: {created}")))?;
        fuzz.made.fetch_add(1, Ordering::Relaxed);
        end_quietly(fuzz, id).await;
    }
    if let Some(id) = &real {
        end_quietly(fuzz, id).await;
    }
    let panicked = SERVER_PANICS.load(Ordering::SeqCst) - panics;
    prop_assert_eq!(panicked, 0, "the server panicked (see stderr) on {}", context());
    let health = fuzz.client.get(server.url("/healthz")).send().await;
    let healthy = match health {
        Ok(response) if response.status() == 200 => response.text().await.is_ok_and(|body| body == "ok"),
        _ => false,
    };
    prop_assert!(healthy, "/healthz does not answer ok after {}", context());
    Ok(())
}

/// Ends a stream the test made; it may have ended already (cancelled or ended by the case).
pub(crate) async fn end_quietly(fuzz: &Fuzz, id: &str) {
    let url = fuzz.server.url(&format!("/v1/streams/{id}/end"));
    let response = fuzz.client.post(url).send().await.expect("POST end");
    assert!([200, 409].contains(&response.status().as_u16()), "ending {id}: {}", response.status());
}

/// The cases to run: `PROPTEST_CASES`, else 2,000.
pub(crate) fn fuzz_cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2_000)
}

#[test]
fn any_request_to_any_endpoint_is_answered_without_a_server_error_and_refusals_carry_the_envelope() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name().is_some_and(|name| name.starts_with(SERVER_THREADS)) {
            SERVER_PANICS.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(SERVER_THREADS)
        .enable_all()
        .build()
        .expect("runtime");
    // A chat request without a model runs `echo` (no pauses), not `demo`.
    let settings = Settings { default_model: "echo".into(), ..Settings::default() };
    let server = runtime.block_on(TestServer::with(HubConfig::default(), settings, Agents::builtin()));
    let client = reqwest::Client::builder().no_proxy().build().expect("client");
    let fuzz = Fuzz { server, client, made: AtomicUsize::new(0), statuses: Default::default() };

    let cases = fuzz_cases();
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 512, ..Config::default() };
    let mut runner = TestRunner::new(config);
    let started = Instant::now();
    let result = runner.run(&case(), |case| runtime.block_on(run_case(&fuzz, case)));
    let elapsed = started.elapsed();
    if let Err(failure) = result {
        panic!("{failure}");
    }

    // Everything the cases made has ended (a chat run ends by itself, soon).
    let all_ended = async || fuzz.server.hub.open_streams().is_empty();
    runtime.block_on(eventually("every stream the cases made to end", PATIENCE, all_ended));
    let open = fuzz.server.hub.open_streams().len();
    assert_eq!(open, 0, "streams left open after the run");
    assert_eq!(SERVER_PANICS.load(Ordering::SeqCst), 0, "the server panicked");
    let statuses = fuzz.statuses.lock().expect("statuses").clone();
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for ((_, status), count) in &statuses {
        *by_status.entry(*status).or_default() += count;
    }
    println!(
        "{cases} cases in {elapsed:?}; {} streams made and ended; answers by status: {by_status:?}",
        fuzz.made.load(Ordering::Relaxed)
    );
    for ((target, status), count) in &statuses {
        println!("  {target:>24} {status}: {count}");
    }
    // The cases reached past the edge: some were taken, some refused by a handler, some by the edge.
    for status in [200, 201, 400, 404, 405] {
        assert!(by_status.get(&status).copied().unwrap_or(0) > 0 || cases < 500, "no {status} in {by_status:?}");
    }
    drop(fuzz);
    runtime.shutdown_timeout(Duration::from_secs(5));
}

//! The viewer (`/ui`) in headless Chromium, against the real server: a run with every built-in type shows
//! each as a person expects it (Markdown rendered, thinking folded, a tool call with its result, an image, an
//! audio player, an error, a custom type as JSON, actions and events on the timeline, the outcome); a run
//! watched live while its producer appends; the list of streams; and a stream full of hostile content
//! (script tags, `onerror` attributes, `javascript:` links in text and media, HTML in tool arguments and
//! custom props) executes nothing, under a Content-Security-Policy that forbids inline script. Every fixture
//! case shows each of its messages as the service's snapshot of it says; a run whose event stream a proxy
//! drops mid-event resumes with nothing twice; with keys, the page asks for one and keeps it in the tab's
//! session storage, and a read token in the address is enough for one run. Screenshots go to
//! `target/screenshots/`. And the committed bundles are what `clients/viewer`'s sources build.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::{KeySpec, Settings, budgets};
use agentmux::hub::HubConfig;
use common::browser::{Driver, browser, start_driver, until};
use common::command::{expect_success, run};
use common::server::TestServer;
use serde_json::{Value, json};

/// A one-pixel PNG and a tiny WAV, as data URLs.
const PNG: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
const WAV: &str = "data:audio/wav;base64,UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA=";

async fn stream(client: &reqwest::Client, server: &TestServer, messages: &[Value], end: Option<Value>) -> String {
    let created: Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    if !messages.is_empty() {
        let url = server.url(&format!("/v1/streams/{id}/messages"));
        let response = client.post(url).json(&messages).send().await.expect("append");
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap_or_default());
    }
    if let Some(outcome) = end {
        let response = client.post(server.url(&format!("/v1/streams/{id}/end"))).json(&outcome).send().await;
        assert_eq!(response.expect("end").status(), 200);
    }
    id
}

/// The server (the built-in agents, no shutdown grace), an HTTP client, chromedriver and a browser with a wide
/// window.
async fn setup(config: HubConfig, settings: Settings) -> (TestServer, reqwest::Client, Driver, fantoccini::Client) {
    let settings = Settings { shutdown_grace: Duration::ZERO, ..settings };
    let server = TestServer::with(config, settings, Agents::builtin()).await;
    let driver = start_driver().await;
    let browser = browser(&driver).await;
    browser.set_window_size(1400, 900).await.expect("window size");
    (server, reqwest::Client::new(), driver, browser)
}

/// The service's snapshot of a stream.
async fn snapshot(client: &reqwest::Client, server: &TestServer, id: &str) -> Value {
    let response = client.get(server.url(&format!("/v1/streams/{id}"))).send().await.expect("snapshot");
    response.json().await.expect("json")
}

async fn screenshot(browser: &fantoccini::Client, name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("screenshots");
    std::fs::create_dir_all(&dir).expect("screenshots");
    let png = browser.screenshot().await.expect("a screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("write the screenshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_shows_every_type_live_and_runs_nothing_hostile() {
    let (server, client, _driver, browser) = setup(HubConfig::default(), Settings::default()).await;

    // Every built-in type.
    let every = [
        json!({"type": "thinking", "props": {"content": "First, the weather."}, "block_id": "b1"}),
        json!({"type": "loading", "props": {"message": "Fetching the forecast"}, "message_id": "l1", "block_id": "b1"}),
        json!({"type": "tool_call", "props": {"id": "c1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"}, "block_id": "b1"}),
        json!({"type": "tool_result", "props": {"call_id": "c1", "name": "weather", "result": {"temp_c": 18}}, "block_id": "b1"}),
        json!({"type": "text", "props": {"content": "It is **18 °C** in Paris."}, "message_id": "t1"}),
        json!({"type": "image", "props": {"url": PNG, "alt": "a pixel"}}),
        json!({"type": "audio", "props": {"url": WAV}}),
        json!({"type": "file", "props": {"url": "https://example.com/report.pdf", "name": "report.pdf"}}),
        json!({"type": "action", "props": {"name": "open_panel", "payload": {"panel": "map"}}}),
        json!({"type": "weather_card", "props": {"city": "Paris", "temp_c": 18}}),
        json!({"type": "error", "props": {"message": "The radar is down", "code": "radar"}}),
    ];
    let id = stream(&client, &server, &every, Some(json!({"status": "completed"}))).await;
    browser.goto(&server.url(&format!("/ui/streams/{id}"))).await.expect("open the viewer");
    until(&browser, "document.querySelector('.outcome.completed')", Duration::from_secs(20)).await;
    let found = browser
        .execute(
            "const q = (s) => document.querySelector(s); return {
                bold: q('.message.text strong')?.textContent,
                thinkingClosed: q('.message.thinking details') && !q('.message.thinking details').open,
                loadingDone: q('.message.loading')?.classList.contains('done'),
                toolResult: q('.message.tool_call .tool-result')?.textContent,
                image: q('.message.image img')?.src?.slice(0, 15),
                audio: !!q('.message.audio audio[controls]'),
                file: q('.message.file a')?.href,
                custom: q('.message.weather_card .json')?.textContent,
                error: q('.message.error')?.textContent,
                action: q('.timeline-item.action')?.textContent,
                events: document.querySelectorAll('.timeline-item.event').length,
                block: document.querySelectorAll('.block .message').length,
            };",
            vec![],
        )
        .await
        .expect("inspect");
    assert_eq!(found["bold"], "18 °C", "{found}");
    assert_eq!(found["thinkingClosed"], true, "{found}");
    assert_eq!(found["loadingDone"], true, "the loading resolved when its block ended: {found}");
    assert!(found["toolResult"].as_str().unwrap_or("").contains("\"temp_c\": 18"), "{found}");
    assert_eq!(found["image"], "data:image/png;", "{found}");
    assert_eq!(found["audio"], true, "{found}");
    assert_eq!(found["file"], "https://example.com/report.pdf", "{found}");
    assert!(found["custom"].as_str().unwrap_or("").contains("\"city\": \"Paris\""), "{found}");
    assert!(found["error"].as_str().unwrap_or("").contains("The radar is down"), "{found}");
    assert!(found["action"].as_str().unwrap_or("").contains("open_panel"), "{found}");
    assert!(found["events"].as_u64().unwrap_or(0) >= 4, "stream_start, block_start, block_end, stream_end: {found}");
    assert_eq!(found["block"], 3, "thinking, loading and the tool call grouped in their block: {found}");
    // The frames pane shows the same run as OpenAI chunks.
    until(
        &browser,
        "document.querySelector('.frames-text').textContent.includes('chat.completion.chunk')",
        Duration::from_secs(10),
    )
    .await;
    screenshot(&browser, "viewer-every-type").await;

    // Live: the page is open before the producer appends.
    let live = stream(&client, &server, &[], None).await;
    browser.goto(&server.url(&format!("/ui/streams/{live}"))).await.expect("open");
    until(&browser, "document.querySelector('.timeline-item.event')", Duration::from_secs(10)).await;
    let url = server.url(&format!("/v1/streams/{live}/messages"));
    for word in ["Hello", ", ", "world"] {
        let delta = json!({"type": "text", "props": {"content": word}, "message_id": "m", "delta": true});
        assert_eq!(client.post(&url).json(&delta).send().await.expect("append").status(), 200);
        // A producer a word at a time, as the page sees it live: the scenario, not synchronisation.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until(
        &browser,
        "document.querySelector('.message.text')?.textContent.includes('Hello, world')",
        Duration::from_secs(10),
    )
    .await;
    let ended = client.post(server.url(&format!("/v1/streams/{live}/end"))).send().await.expect("end");
    assert_eq!(ended.status(), 200);
    until(&browser, "document.querySelector('.outcome.completed')", Duration::from_secs(10)).await;
    let texts =
        browser.execute("return document.querySelectorAll('.message.text').length;", vec![]).await.expect("count");
    assert_eq!(texts, json!(1), "one message, its deltas applied");

    // Hostile content: nothing runs.
    let hostile = [
        json!({"type": "text", "props": {"content": "<img src=x onerror=\"window.__pwned='img'\"><script>window.__pwned='script'</script>[click me](javascript:window.__pwned='link') <a href=\"javascript:window.__pwned='a'\">a</a> <iframe src=\"javascript:window.__pwned='frame'\"></iframe>"}}),
        // The service refuses a javascript: URL in media (below); a data: URL of another kind gets through
        // to the page, which does not load it.
        json!({"type": "image", "props": {"url": "data:text/html,<script>window.__pwned='image'</script>"}}),
        json!({"type": "video", "props": {"url": "data:text/html,<script>window.__pwned='video'</script>"}}),
        json!({"type": "file", "props": {"url": "data:text/html,<script>window.__pwned='file'</script>", "name": "<b onmouseover=x>f</b>"}}),
        json!({"type": "tool_call", "props": {"id": "h", "name": "<img src=x onerror=\"window.__pwned='tool'\">", "arguments": "<script>window.__pwned='args'</script>"}}),
        json!({"type": "custom_html", "props": {"html": "<img src=x onerror=\"window.__pwned='custom'\">"}}),
        json!({"type": "error", "props": {"message": "<svg onload=\"window.__pwned='svg'\">"}}),
    ];
    let bad = stream(&client, &server, &hostile, Some(json!({"status": "completed"}))).await;
    let refused = json!({"type": "image", "props": {"url": "javascript:window.__pwned='image'"}});
    let response = client.post(server.url(&format!("/v1/streams/{bad}/messages"))).json(&refused).send().await;
    assert_eq!(response.expect("append").status(), 400, "no javascript: URL ever enters a stream");
    browser.goto(&server.url(&format!("/ui/streams/{bad}"))).await.expect("open");
    until(&browser, "document.querySelector('.outcome')", Duration::from_secs(10)).await;
    // Click every link the page made, as a curious person would.
    browser
        .execute("document.querySelectorAll('a').forEach((a) => a.click()); return true;", vec![])
        .await
        .expect("click");
    // Time for anything the clicks set off to run: nothing must have, so there is nothing to wait for.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let verdict = browser
        .execute(
            "return {
                pwned: window.__pwned ?? null,
                handlers: [...document.querySelectorAll('*')].filter((n) => [...n.attributes].some((a) => a.name.startsWith('on'))).length,
                scripts: document.querySelectorAll('script:not([src])').length,
                javascriptUrls: [...document.querySelectorAll('[href],[src]')].filter((n) => /^\\s*javascript:/i.test(n.getAttribute('href') ?? n.getAttribute('src') ?? '')).length,
                frames: document.querySelectorAll('iframe').length,
                blocked: document.querySelectorAll('.blocked').length,
                shownAsText: document.querySelector('.message.tool_call .tool-arguments')?.textContent,
            };",
            vec![],
        )
        .await
        .expect("inspect");
    assert_eq!(verdict["pwned"], Value::Null, "{verdict}");
    assert_eq!(verdict["handlers"], 0, "{verdict}");
    assert_eq!(verdict["scripts"], 0, "{verdict}");
    assert_eq!(verdict["javascriptUrls"], 0, "{verdict}");
    assert_eq!(verdict["frames"], 0, "{verdict}");
    assert_eq!(verdict["blocked"], 3, "the image, the video and the file not loaded: {verdict}");
    assert_eq!(verdict["shownAsText"], "<script>window.__pwned='args'</script>", "{verdict}");
    screenshot(&browser, "viewer-hostile").await;

    // The list, newest first.
    browser.goto(&server.url("/ui")).await.expect("open the list");
    until(&browser, "document.querySelectorAll('table.streams tr.stream').length >= 3", Duration::from_secs(10)).await;
    let first =
        browser.execute("return document.querySelector('table.streams tr.stream a').textContent;", vec![]).await;
    assert_eq!(first.expect("first"), json!(bad));
    screenshot(&browser, "viewer-list").await;

    // Every answer of the viewer forbids inline script.
    for path in ["/ui", "/ui/streams/x", "/ui/assets/viewer.js", "/ui/assets/viewer.css"] {
        let response = client.get(server.url(path)).send().await.expect("get");
        assert_eq!(response.status(), 200, "{path}");
        let policy = response.headers()["content-security-policy"].to_str().expect("ascii");
        assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"), "{path}: {policy}");
    }
    browser.close().await.expect("close");
    server.stop().await.expect("stops");
}

/// The committed bundle (`src/http/api/ui/viewer.js`, `viewer.css`) is what `clients/viewer` builds.
#[test]
fn the_committed_bundle_is_what_the_sources_build() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients").join("viewer");
    common::node::npm_install(&dir);
    let mut check = Command::new("node");
    check.args(["build.mjs", "--check"]).current_dir(&dir);
    expect_success("node build.mjs --check (clients/viewer)", run(&mut check, Duration::from_secs(120)));
}

/// What the page shows of a run: every conversation element with what identifies it, the timeline's length,
/// the outcome's status.
const INSPECT: &str = "return {
    messages: [...document.querySelectorAll('.conversation .message')].map((n) => ({
        type: n.dataset.type,
        id: n.dataset.messageId ?? null,
        text: n.innerText,
        thinkingOpen: n.querySelector('details')?.open ?? null,
        thinking: n.querySelector('.thinking-text')?.textContent ?? null,
        toolName: n.querySelector('.tool-name')?.textContent ?? null,
        arguments: n.querySelector('.tool-arguments')?.textContent ?? null,
        result: n.querySelector('.tool-result')?.textContent ?? null,
        pending: !!n.querySelector('.tool-result.pending'),
        done: n.classList.contains('done'),
        src: n.querySelector('img,audio,video')?.getAttribute('src') ?? null,
        controls: n.querySelector('audio,video')?.controls ?? null,
        href: n.querySelector('a')?.getAttribute('href') ?? null,
        customType: n.querySelector('.custom-type')?.textContent ?? null,
        json: n.querySelector('.json')?.textContent ?? null,
        errorText: n.querySelector('.error-text')?.textContent ?? null,
    })),
    timeline: document.querySelectorAll('.timeline-item').length,
    outcome: document.querySelector('.outcome')?.className ?? null,
};";

/// Letters and digits only, one space apart: what Markdown's rendering keeps of a text.
fn words(text: &str) -> String {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// JSON as the page indents it (`JSON.stringify(value, null, 2)`).
fn indented(value: &Value) -> String {
    serde_json::to_string_pretty(value).expect("json")
}

/// Checks the page's view of a run against the service's snapshot of it, message by message.
fn check_view(case: &str, snapshot: &Value, view: &Value) {
    let messages = snapshot["messages"].as_array().expect("messages");
    let shown = view["messages"].as_array().expect("shown");
    let timeline = messages.iter().filter(|m| matches!(m["type"].as_str(), Some("event" | "action"))).count();
    assert_eq!(view["timeline"], timeline, "{case}: every event and action on the timeline once: {view}");
    let status = snapshot["status"].as_str().expect("status");
    assert_eq!(view["outcome"], format!("outcome {status}"), "{case}: {view}");
    let calls: Vec<&Value> = messages.iter().filter(|m| m["type"] == "tool_call").collect();
    let mut expected = 0;
    for message in messages {
        let kind = message["type"].as_str().expect("type");
        let props = &message["props"];
        if matches!(kind, "event" | "action") {
            continue;
        }
        if kind == "tool_result"
            && let Some(call) = calls.iter().find(|c| c["props"]["id"] == props["call_id"])
        {
            let node = shown.iter().find(|n| n["type"] == "tool_call" && n["id"] == call["message_id"]);
            let node = node.unwrap_or_else(|| panic!("{case}: the call of {message} shown: {view}"));
            assert_eq!(node["pending"], false, "{case}: {node}");
            let result = node["result"].as_str().expect("result");
            if let Some(error) = props["error"]["message"].as_str() {
                assert!(result.contains(error), "{case}: the tool's error shown: {node}");
            } else {
                let value = props.get("result").or_else(|| props.get("content")).unwrap_or(props);
                assert_eq!(result, indented(value), "{case}: the tool's result under its call: {node}");
            }
            continue;
        }
        let node = &shown.get(expected).unwrap_or_else(|| panic!("{case}: {message} not shown: {view}"));
        expected += 1;
        assert_eq!(node["type"], kind, "{case}: shown in order: {node} for {message}");
        assert_eq!(node["id"], message["message_id"], "{case}: {node}");
        let is = |field: &str| props[field].as_str().unwrap_or_default();
        match kind {
            "text" => assert_eq!(words(node["text"].as_str().expect("text")), words(is("content")), "{case}: {node}"),
            "thinking" => {
                assert_eq!(node["thinkingOpen"], false, "{case}: thinking folded: {node}");
                assert_eq!(node["thinking"], is("content"), "{case}: {node}");
            }
            "loading" => assert_eq!(node["done"], true, "{case}: the loading resolved: {node}"),
            "tool_call" => {
                assert_eq!(node["arguments"], is("arguments"), "{case}: {node}");
                assert_eq!(node["pending"], false, "{case}: no call shown running once the run ended: {node}");
                let answered =
                    messages.iter().any(|m| m["type"] == "tool_result" && m["props"]["call_id"] == props["id"]);
                if !answered {
                    assert_eq!(node["result"], "no result in this run", "{case}: {node}");
                }
                assert!(node["toolName"].as_str().is_some_and(|n| n.contains(is("name"))), "{case}: {node}");
            }
            "tool_result" => assert!(!node["result"].as_str().unwrap_or_default().is_empty(), "{case}: {node}"),
            "error" => assert!(node["errorText"].as_str().is_some_and(|t| t.contains(is("message"))), "{case}: {node}"),
            "image" => assert_eq!(node["src"], is("url"), "{case}: {node}"),
            "audio" | "video" => {
                assert_eq!(node["src"], is("url"), "{case}: {node}");
                assert_eq!(node["controls"], true, "{case}: a player: {node}");
            }
            "file" => assert_eq!(node["href"], is("url"), "{case}: {node}"),
            _ => {
                assert_eq!(node["customType"], kind, "{case}: {node}");
                assert_eq!(node["json"], indented(props), "{case}: a custom type as JSON: {node}");
            }
        }
    }
    assert_eq!(shown.len(), expected, "{case}: nothing shown beyond the messages: {view}");
}

/// Every fixture case, posted to a stream and opened in the viewer, shows each of its messages as its type
/// is shown (compared with the service's snapshot of the same stream), every event and action on the
/// timeline once, and the outcome. A screenshot of each goes to `target/screenshots/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_case_shows_its_expected_elements() {
    let (server, client, _driver, browser) = setup(HubConfig::default(), Settings::default()).await;
    let cases = common::cases();
    assert!(cases.len() >= 15, "{cases:?}");
    for case in &cases {
        let input = String::from_utf8(common::read(case, "input.jsonl")).expect("utf-8");
        let messages: Vec<Value> =
            input.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("json")).collect();
        let outcome = common::fixtures_dir().join(case).join("outcome.json");
        let outcome = match std::fs::read(&outcome) {
            Ok(bytes) => serde_json::from_slice(&bytes).expect("outcome.json"),
            Err(_) => json!({"status": "completed"}),
        };
        let id = stream(&client, &server, &messages, Some(outcome)).await;
        let snapshot = snapshot(&client, &server, &id).await;
        browser.goto(&server.url(&format!("/ui/streams/{id}"))).await.expect("open the viewer");
        until(&browser, "document.querySelector('.outcome')", Duration::from_secs(20)).await;
        let view = browser.execute(INSPECT, vec![]).await.expect("inspect");
        check_view(case, &snapshot, &view);
        screenshot(&browser, &format!("viewer-case-{case}")).await;
    }
    browser.close().await.expect("close");
    server.stop().await.expect("stops");
}

/// The viewer, opened through a proxy that drops its event stream in the middle of an event while the run
/// is live, resumes it: the text whole with no word twice, every event once, the outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_viewer_resumes_a_cut_connection_without_duplicates() {
    let (server, client, _driver, browser) = setup(HubConfig::default(), Settings::default()).await;
    // The CUI event stream (its frames begin `{"type"`; the frames pane's are another format's) drops after
    // the `id:` line of sequence 10, before that event's data.
    let proxy = common::proxy::CuttingProxy::start(server.addr, b"\nid: 10\ndata: {\"type\"").await;
    let id = stream(&client, &server, &[], None).await;
    browser.goto(&proxy.url(&format!("/ui/streams/{id}"))).await.expect("open the viewer through the proxy");
    until(&browser, "document.querySelector('.timeline-item.event')", Duration::from_secs(10)).await;
    let url = server.url(&format!("/v1/streams/{id}/messages"));
    let words: Vec<String> = (0..30).map(|i| format!("word{i} ")).collect();
    for chunk in words.chunks(3) {
        let deltas: Vec<Value> = chunk
            .iter()
            .map(|w| json!({"type": "text", "props": {"content": w}, "message_id": "m", "delta": true}))
            .collect();
        assert_eq!(client.post(&url).json(&deltas).send().await.expect("append").status(), 200);
        // A producer a few words at a time, so the proxy cuts the stream midway: the scenario.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = client.post(server.url(&format!("/v1/streams/{id}/end"))).send().await.expect("end");
    assert_eq!(ended.status(), 200);
    until(&browser, "document.querySelector('.outcome.completed')", Duration::from_secs(20)).await;
    assert!(proxy.has_cut(), "the event stream was cut");
    let snapshot = snapshot(&client, &server, &id).await;
    let view = browser.execute(INSPECT, vec![]).await.expect("inspect");
    check_view("cut", &snapshot, &view);
    let text = view["messages"][0]["text"].as_str().expect("text");
    assert_eq!(text.trim(), words.concat().trim(), "every word once, in order");
    screenshot(&browser, "viewer-cut-resumed").await;
    browser.close().await.expect("close");
    server.stop().await.expect("stops");
}

/// Where keys are configured: the list asks for a key, keeps it in the tab's session storage (never in the
/// address), and shows the key's streams; a wrong key is forgotten and asked for again, saying it was refused;
/// a stream's page opened with a read token alone (`?token=`) shows the run with no key at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_the_viewer_asks_for_one_and_keeps_it_in_the_session() {
    let keys: Vec<KeySpec> = ["sk-viewer"].iter().map(|line| line.parse().expect("a key")).collect();
    let mut config = HubConfig::default();
    config.limits.client_budgets = budgets(&keys, config.limits.streams_per_client, 0);
    let (server, client, _driver, browser) = setup(config, Settings { api_keys: keys, ..Settings::default() }).await;
    let created: Value = client
        .post(server.url("/v1/streams"))
        .bearer_auth("sk-viewer")
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let id = created["id"].as_str().expect("id");
    let text = json!({"type": "text", "props": {"content": "for *key holders*"}});
    let appended = client.post(server.url(&format!("/v1/streams/{id}/messages"))).bearer_auth("sk-viewer").json(&text);
    assert_eq!(appended.send().await.expect("append").status(), 200);
    let ended = client.post(server.url(&format!("/v1/streams/{id}/end"))).bearer_auth("sk-viewer").send().await;
    assert_eq!(ended.expect("end").status(), 200);

    let submit = |key: &'static str| {
        let browser = browser.clone();
        async move {
            let input = browser.find(fantoccini::Locator::Css("form.key-form input")).await.expect("the key field");
            input.send_keys(key).await.expect("type the key");
            browser
                .find(fantoccini::Locator::Css("form.key-form button"))
                .await
                .expect("button")
                .click()
                .await
                .expect("submit");
        }
    };
    browser.goto(&server.url("/ui")).await.expect("open the list");
    until(&browser, "document.querySelector('form.key-form')", Duration::from_secs(10)).await;
    submit("sk-wrong").await;
    until(
        &browser,
        "document.querySelector('form.key-form')?.textContent.includes('not accepted')",
        Duration::from_secs(10),
    )
    .await;
    let forgotten = browser.execute("return sessionStorage.getItem('agentmux-key');", vec![]).await.expect("inspect");
    assert_eq!(forgotten, Value::Null, "a refused key is not kept");
    submit("sk-viewer").await;
    until(&browser, "document.querySelectorAll('table.streams tr.stream').length === 1", Duration::from_secs(10)).await;
    let kept = browser
        .execute("return {stored: sessionStorage.getItem('agentmux-key'), address: window.location.href};", vec![])
        .await
        .expect("inspect");
    assert_eq!(kept["stored"], "sk-viewer", "{kept}");
    assert!(!kept["address"].as_str().expect("href").contains("sk-viewer"), "never in the address: {kept}");
    screenshot(&browser, "viewer-keyed-list").await;
    // The stream's page in the same tab: the key from the session.
    browser
        .find(fantoccini::Locator::Css("table.streams tr.stream a"))
        .await
        .expect("link")
        .click()
        .await
        .expect("open");
    until(&browser, "document.querySelector('.outcome.completed')", Duration::from_secs(10)).await;
    let shown = browser.execute("return document.querySelector('.message.text em')?.textContent;", vec![]).await;
    assert_eq!(shown.expect("text"), json!("key holders"));
    // No key, a read token in the address: the run, read with the token.
    browser.execute("sessionStorage.clear(); return true;", vec![]).await.expect("forget the key");
    let token = created["read_token"].as_str().expect("read token");
    browser.goto(&server.url(&format!("/ui/streams/{id}?token={token}"))).await.expect("open with the token");
    until(&browser, "document.querySelector('.outcome.completed')", Duration::from_secs(10)).await;
    let stored = browser.execute("return sessionStorage.getItem('agentmux-key');", vec![]).await.expect("inspect");
    assert_eq!(stored, Value::Null, "the token is not a key to keep");
    // A token that does not open the stream: said so, with the way back to a key (not a key prompt that a
    // token in the address would always override).
    browser.goto(&server.url(&format!("/ui/streams/{id}?token=garbage"))).await.expect("open with a bad token");
    until(&browser, "document.querySelector('.failure')?.textContent.includes('read token')", Duration::from_secs(10))
        .await;
    let state = browser
        .execute(
            "return {form: !!document.querySelector('form.key-form'), status: document.querySelector('.status')?.textContent,
                back: document.querySelector('.failure a')?.getAttribute('href')};",
            vec![],
        )
        .await
        .expect("inspect");
    assert_eq!(state["form"], false, "{state}");
    assert_eq!(state["status"], "failed", "{state}");
    assert_eq!(state["back"], format!("/ui/streams/{id}"), "{state}");
    browser.close().await.expect("close");
    server.stop().await.expect("stops");
}

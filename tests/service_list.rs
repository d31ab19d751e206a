//! `GET /v1/streams`: every stream held, newest first, a page at a time, with its status; a bad page is a
//! 400 naming the parameter; with keys it needs a key (a stream's token reads its stream, not the list).

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::{KeySpec, Settings, budgets};
use agentmux::hub::HubConfig;
use common::doubles::SteppingClock;
use common::http::{assert_envelope, get_json};
use common::server::TestServer;
use serde_json::Value;

async fn created(client: &reqwest::Client, server: &TestServer, key: Option<&str>) -> Value {
    let mut request = client.post(server.url("/v1/streams"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.expect("create");
    assert_eq!(response.status(), 201);
    response.json().await.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pages_through_every_stream_newest_first() {
    let settings = Settings { shutdown_grace: Duration::ZERO, ..Settings::default() };
    // A clock that ticks a millisecond a reading: creation times apart, so newest first is the reverse of the
    // order of creation (without waiting for the system clock to tick).
    let config = HubConfig { clock: Arc::new(SteppingClock::new(1_700_000_000_000)), ..HubConfig::default() };
    let server = TestServer::with(config, settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(created(&client, &server, None).await["id"].as_str().expect("id").to_owned());
    }
    let ended = client.post(server.url(&format!("/v1/streams/{}/end", ids[0]))).send().await.expect("end");
    assert_eq!(ended.status(), 200);
    let mut seen = Vec::new();
    let mut url = server.url("/v1/streams?limit=3");
    let mut pages = 0;
    loop {
        let (status, page) = get_json(&client, &url).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["object"], "list");
        pages += 1;
        for stream in page["data"].as_array().expect("data") {
            seen.push((
                stream["id"].as_str().expect("id").to_owned(),
                stream["status"].as_str().unwrap_or("").to_owned(),
            ));
            assert!(stream["epoch"].is_string() && stream["created_ms"].is_u64() && stream["last_sequence"].is_u64());
        }
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(page["has_more"], true);
                url = server.url(&format!("/v1/streams?limit=3&after={next}"));
            }
            None => {
                assert_eq!(page["has_more"], false);
                break;
            }
        }
    }
    assert_eq!(pages, 3);
    let listed: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    assert_eq!(listed, newest_first);
    assert_eq!(seen.last().map(|(_, status)| status.as_str()), Some("completed"));
    assert!(seen[..6].iter().all(|(_, status)| status == "open"));

    for (query, param) in
        [("limit=0", "limit"), ("limit=501", "limit"), ("after=nonsense", "after"), ("limit=x", "limit")]
    {
        let (status, body) = get_json(&client, &server.url(&format!("/v1/streams?{query}"))).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["param"], param, "{query}: {body}");
    }
    server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_the_list_needs_a_key() {
    let keys: Vec<KeySpec> = ["sk-list"].iter().map(|line| line.parse().expect("a key")).collect();
    let mut config = HubConfig::default();
    config.limits.client_budgets = budgets(&keys, config.limits.streams_per_client, 0);
    let settings = Settings { api_keys: keys, shutdown_grace: Duration::ZERO, ..Settings::default() };
    let server = TestServer::with(config, settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let stream = created(&client, &server, Some("sk-list")).await;
    let list = || client.get(server.url("/v1/streams"));
    let response = list().send().await.expect("list");
    assert_eq!(response.status(), 401);
    let token = stream["read_token"].as_str().expect("token");
    let response = list().bearer_auth(token).send().await.expect("list");
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.expect("json");
    assert_envelope(&body, None, "permission_denied");
    let page: Value = list().bearer_auth("sk-list").send().await.expect("list").json().await.expect("json");
    assert_eq!(page["data"][0]["id"], stream["id"]);
    server.stop().await.expect("stops");
}

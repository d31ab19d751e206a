//! Recorded upstream answers (`fixtures/upstream/<case>/`) replayed through an [`UpstreamAgent`]: the run on a
//! hub with a fixed clock and ids, so what each format renders can be compared byte for byte with the case's
//! golden files. Shared by the upstream kinds' tests (`tests/upstream.rs`, `tests/upstream_anthropic.rs`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentmux::agent::{self, Tools, UpstreamAgent, UpstreamConfig};
use agentmux::conversation::Conversation;
use agentmux::hub::{Hub, HubConfig, Stream};
use agentmux::render::Format;
use serde_json::{Value, json};

use super::doubles::{CountingIds, SteppingClock};
use super::upstream::{FakeUpstream, Reply};

/// Replays `case` through an agent on `config(upstream)`: a user asks `model` about the weather with the
/// client's `tools`; the fake upstream and the ended stream.
pub(crate) async fn run(
    case: &str,
    config: impl Fn(&FakeUpstream) -> UpstreamConfig,
    model: &str,
    tools: Value,
) -> (FakeUpstream, Arc<Stream>) {
    let upstream = FakeUpstream::start(vec![Reply::fixture(case)]).await;
    let agent = UpstreamAgent::new(config(&upstream), Tools::new()).expect("agent");
    let hub = Hub::new(HubConfig {
        clock: Arc::new(SteppingClock::new(1_700_000_000_000)),
        ids: Arc::new(CountingIds::default()),
        ..HubConfig::default()
    });
    let mut options = serde_json::Map::new();
    options.insert("tools".into(), tools);
    let conversation = Conversation::user(model, "What is the weather in Paris?").with_options(options);
    let stream = agent::run(&hub, Arc::new(agent), conversation).expect("run");
    tokio::time::timeout(Duration::from_secs(20), stream.ended()).await.expect("the run ends");
    (upstream, stream)
}

/// Renders `stream` in each of `formats` (golden file name, format) and notes in `failures` each that differs
/// from `fixtures/upstream/<case>/<file>`, leaving what it rendered under `target/golden-actual/upstream/`.
pub(crate) async fn compare(case: &str, stream: &Arc<Stream>, formats: &[(&str, Format)], failures: &mut Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, format) in formats {
        let bytes = super::read_all(stream, *format).await;
        let golden = root.join("fixtures/upstream").join(case).join(file);
        if std::fs::read(&golden).ok().as_deref() != Some(&bytes[..]) {
            let actual = root.join("target/golden-actual/upstream").join(case);
            std::fs::create_dir_all(&actual).expect("mkdir");
            std::fs::write(actual.join(file), &bytes).expect("write");
            failures.push(format!("{case}/{file}"));
        }
    }
}

/// The tools the recorded answers call, declared by the client.
pub(crate) fn client_tools() -> Value {
    let tool = |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}});
    json!([tool("get_weather"), tool("get_time")])
}

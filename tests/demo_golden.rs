//! The `demo` agent's stream, as the hub serves it (lifecycle events, stamped ids and sequences), through
//! every adapter, pinned byte for byte by `fixtures/demo-agent/`. The hub runs on a clock that ticks one
//! millisecond per reading and on counting ids, so the output is the same on every run. On a mismatch the
//! rendered files are left under `target/golden-actual/demo-agent/` for review; the test never rewrites
//! the golden files.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentmux::adapter::{AgentTools, OpenAiCompletion, ReasoningField};
use agentmux::agent::{self, DemoAgent};
use agentmux::conversation::Conversation;
use agentmux::hub::{Hub, HubConfig};
use agentmux::render::Format;
use common::doubles::{CountingIds, SteppingClock};

#[tokio::test]
async fn demo_agent_stream_matches_its_golden_files() {
    let hub = Hub::new(HubConfig {
        clock: Arc::new(SteppingClock::new(1_700_000_000_000)),
        ids: Arc::new(CountingIds::default()),
        ..HubConfig::default()
    });
    let demo = DemoAgent { pause: Duration::ZERO };
    let request = Conversation::user("demo", "Show me what you can do.");
    let stream = agent::run(&hub, Arc::new(demo), request).expect("run");
    let cui = common::read_all(&stream, Format::Cui).await;
    let openai = common::read_all(&stream, Format::OPENAI).await;
    let usage = common::read_all(
        &stream,
        Format::OpenAi {
            include_usage: true,
            reasoning: ReasoningField::ReasoningContent,
            agent_tools: AgentTools::Reasoning,
        },
    )
    .await;
    let mut completion = OpenAiCompletion::new(agentmux::adapter::OpenAiOptions::from(stream.info()));
    stream.history().iter().for_each(|message| completion.push(message));
    let outcome = stream.outcome().expect("ended");
    let json = completion.finish(&outcome).map(|b| b.to_vec()).unwrap_or_else(|e| e.to_json().to_vec());

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/demo-agent");
    let actual_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/golden-actual/demo-agent");
    let mut failures = Vec::new();
    for (file, rendered) in
        [("cui.sse", cui), ("openai.sse", openai), ("openai-usage.sse", usage), ("openai.json", json)]
    {
        if std::fs::read(dir.join(file)).ok().as_deref() != Some(&rendered[..]) {
            std::fs::create_dir_all(&actual_dir).expect("create dir");
            std::fs::write(actual_dir.join(file), &rendered).expect("write");
            failures.push(format!("diff {} {}", dir.join(file).display(), actual_dir.join(file).display()));
        }
    }
    assert!(failures.is_empty(), "demo golden files differ:\n{}", failures.join("\n"));
}

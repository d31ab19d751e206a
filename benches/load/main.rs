//! The load benchmark: starts `target/release/agentmux` (and a ceiling server, and nginx with nchan) as child
//! processes, drives them over real loopback connections and prints one table: deliveries per second,
//! publish-to-receive latency, server CPU and peak RSS, errors and `lagged` subscribers, per scenario (medians
//! of the runs).
//!
//! ```sh
//! ./bench --quick                  # one short run of every scenario
//! ./bench --json target/bench.json # three runs, medians, and every run as JSON
//! cargo bench --bench load -- --only fanout,latency --runs 1
//! ./bench --soak --soak-duration 60s  # the soak (never in the default set), one minute instead of ten
//! ./bench --cluster                # one node against three through Redis (never in the default set)
//! ./bench --relay                  # the relay (never in the default set): agentmux and LiteLLM in front of
//!                                  # a fast upstream, their added time to first token and per chunk, one
//!                                  # request at a time (relay) and 50 / 200 at once (relay-50, relay-200)
//! ```
//!
//! - `client.rs`: HTTP/1.1 and SSE over raw sockets, cheap enough that the client is not the bottleneck;
//! - `ws_client.rs`: the WebSocket subscriber of the `ws-` scenarios (each the twin of an SSE one, run right
//!   after it: the same load, its subscribers on `/v1/streams/{id}/ws`), as cheap as the SSE reader;
//! - `scenarios.rs`: fan-out, latency, many streams, idle connections, OpenAI mix, every format at once, chat;
//! - `stall.rs`: the first OpenAI subscriber to a long stream, and the producer's POST latency meanwhile;
//! - `ws_idle.rs`: the server memory that SSE and WebSocket subscribers which never read cost;
//! - `soak/`: about 10,000 connections of every kind for ten minutes while streams come and go, and whether
//!   the server's RSS stays flat (run only when asked for, once);
//! - `relay/`: the time agentmux adds to the first token and to each chunk in front of a fast OpenAI-compatible
//!   upstream (plain and over TLS), beside LiteLLM's proxy, one request at a time and many at once (run only
//!   when asked for);
//! - `output_server.rs`: agentmux's service with an in-process producer, for the token-streaming scenarios:
//!   deltas emitted through the `Output` handle instead of posted;
//! - `cluster.rs`: agentmux nodes through one `redis-server` (`--engine redis`), one node against three
//!   (run only when asked for: `--cluster`);
//! - `ceiling.rs`: the minimal hyper server each fan-out figure is compared with, coalescing (the ceiling)
//!   and naive (a second row);
//! - `nchan.rs`: nginx with nchan, the third target of the fan-out, latency and idle scenarios (its
//!   configuration is `benches/nchan/nginx.conf`);
//! - `procfs.rs`: the child servers and their CPU and memory from `/proc`;
//! - `hist.rs`: the latency histogram.

mod ceiling;
mod client;
mod cluster;
mod hist;
mod nchan;
mod output_server;
mod procfs;
mod relay;
mod scenarios;
mod soak;
mod stall;
mod ws_client;
mod ws_idle;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;

use procfs::Target;
use relay::Relay;
use scenarios::{Kind, RunResult, Scenario, Settings, TokenSource, Transport};
use soak::Soak;
use ws_idle::WsIdle;

#[derive(Parser, Debug)]
#[command(name = "load", about = "Load benchmark for agentmux over loopback")]
struct Args {
    /// One short run: fewer messages and subscribers (under 2 minutes).
    #[arg(long)]
    quick: bool,
    /// Runs of each scenario; the table shows medians (default 3, 1 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// Also write every run and the medians here, as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Only the scenarios whose names start with one of these (comma-separated). The soak runs only when
    /// named in full: `--only soak`.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run the soak (the same as `--only soak`): about 10,000 connections for `--soak-duration`, once.
    #[arg(long)]
    soak: bool,
    /// How long the soak holds its connections once they are open.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    soak_duration: Duration,
    /// Subscriber connections the soak holds (its producers' come on top).
    #[arg(long, default_value_t = 10_000)]
    soak_connections: usize,
    /// The server's `--retention` in the soak: ended streams are evicted during it.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    soak_retention: Duration,
    /// The start of the soak left out of its RSS figures (default: a fifth of the duration).
    #[arg(long, value_parser = humantime::parse_duration)]
    soak_warmup: Option<Duration>,
    /// How often the soak samples the server's RSS.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    soak_sample: Duration,
    /// One more flag for the soak's server (repeat it; `--soak-server-arg=--max-connections=12000`).
    #[arg(long, allow_hyphen_values = true)]
    soak_server_arg: Vec<String>,
    /// Run the cluster scenarios (the same as `--only cluster`): one node against three through Redis.
    #[arg(long)]
    cluster: bool,
    /// Run the relay (the same as `--only relay`): agentmux and LiteLLM's proxy in front of a fast upstream.
    #[arg(long)]
    relay: bool,
    /// Content chunks per answer of the relay's upstream.
    #[arg(long, default_value_t = 50)]
    relay_chunks: usize,
    /// Between two content chunks of the relay's upstream.
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    relay_interval: Duration,
    /// Counted requests per target and run in the relay (default 200, 50 with --quick).
    #[arg(long)]
    relay_requests: Option<usize>,
    /// Requests per target before the relay counts (default 20, 5 with --quick).
    #[arg(long)]
    relay_warmup: Option<usize>,
    /// Where the relay installs LiteLLM's proxy (a Python venv; reused once it works).
    #[arg(long, default_value = "target/litellm-venv")]
    relay_venv: PathBuf,
    /// Leave LiteLLM out of the relay.
    #[arg(long)]
    relay_no_litellm: bool,
    /// Concurrent streaming runs of the relay's concurrent scenarios (`relay-50`, `relay-200`; comma-separated,
    /// `0` for none).
    #[arg(long, value_delimiter = ',', default_values_t = [50, 200])]
    relay_concurrency: Vec<usize>,
    /// Between two content chunks of the upstream in the concurrent scenarios.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    relay_concurrent_interval: Duration,
    /// Counted rounds of the concurrent scenarios per run: in each, every target serves every client's
    /// requests (default 2, 1 with --quick).
    #[arg(long)]
    relay_concurrent_rounds: Option<usize>,
    /// Internal: run as the relay's upstream.
    #[arg(long, hide = true)]
    relay_upstream: bool,
    /// Internal: the relay upstream's CA goes here, and it serves HTTPS too.
    #[arg(long, hide = true)]
    relay_tls_dir: Option<PathBuf>,
    /// The agentmux binary (default: `release/agentmux` in `$CARGO_TARGET_DIR`, else in `target`).
    #[arg(long, default_value_os_t = default_server())]
    server: PathBuf,
    /// Run agentmux with its store (a fresh data directory per run) instead of `--ephemeral`.
    #[arg(long)]
    store: bool,
    /// With `--store`: the fan-out producer posts with `?durable=false`, so it is answered once its messages
    /// are appended rather than committed (subscribers still receive them only once committed).
    #[arg(long)]
    no_durable_acks: bool,
    /// Skip the ceiling servers (coalescing and naive).
    #[arg(long)]
    no_ceiling: bool,
    /// Skip the naive ceiling (a write per wake-up, no gathering), keeping the coalescing one.
    #[arg(long)]
    no_naive_ceiling: bool,
    /// Skip nchan (nginx with the nchan module), which the fan-out, latency and idle scenarios otherwise
    /// run against too when Debian's `nginx` and `libnginx-mod-nchan` are installed.
    #[arg(long)]
    no_nchan: bool,
    /// Messages per POST in the fan-out scenarios.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Text deltas per message before the producer starts a new message id.
    #[arg(long, default_value_t = 256)]
    deltas_per_message: usize,
    /// In fan-out scenarios, parse the latency stamp of one event in this many.
    #[arg(long, default_value_t = 16)]
    sample_every: u64,
    /// Internal: run as the ceiling server.
    #[arg(long, hide = true)]
    ceiling_server: bool,
    /// Internal: with `--ceiling-server`, the naive one.
    #[arg(long, hide = true)]
    ceiling_naive: bool,
    /// Internal: run as the output server (agentmux with an in-process producer).
    #[arg(long, hide = true)]
    output_server: bool,
    /// Internal: the ceiling server's address.
    #[arg(long, hide = true)]
    addr: Option<String>,
    /// Passed by `cargo bench`. Without it (`cargo test --all-targets` runs bench targets too) nothing runs.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Where `cargo build --release` put agentmux.
fn default_server() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from).join("release/agentmux")
}

fn fanout(name: &str, cui: usize, openai: usize, messages: usize) -> Scenario {
    let formats = vec![("", cui), ("openai", openai)].into_iter().filter(|(_, count)| *count > 0).collect();
    Scenario {
        name: name.into(),
        kind: Kind::Fanout { formats, messages },
        ceiling: true,
        nchan: true,
        transport: Transport::Sse,
    }
}

/// Fan-out with the subscribers spread evenly over every format agentmux speaks (agentmux alone: the others
/// speak one), and how many times each format rendered each message.
fn formats(subscribers: usize, messages: usize) -> Scenario {
    let names = ["", "openai", "ui-message", "ag-ui", "anthropic", "responses"];
    let formats = names.iter().map(|&name| (name, subscribers / names.len())).collect();
    let name = format!("formats-{subscribers}");
    Scenario { name, kind: Kind::Fanout { formats, messages }, ceiling: false, nchan: false, transport: Transport::Sse }
}

/// Token streaming: a delta at a time, posted (against the ceiling and nchan too) or emitted in-process
/// through `Output` (agentmux alone).
fn tokens(subscribers: usize, messages: usize, source: TokenSource) -> Scenario {
    let name = match source {
        TokenSource::Post => format!("tokens-{subscribers}"),
        TokenSource::Output => format!("tokens-output-{subscribers}"),
    };
    let posted = source == TokenSource::Post;
    Scenario {
        name,
        kind: Kind::Tokens { subscribers, messages, source },
        ceiling: posted,
        nchan: posted,
        transport: Transport::Sse,
    }
}

fn relay_settings(args: &Args) -> Relay {
    Relay {
        pace: relay::upstream::Pace { chunks: args.relay_chunks.max(1), interval: args.relay_interval },
        requests: args.relay_requests.unwrap_or(if args.quick { 50 } else { 200 }).max(1),
        warmup: args.relay_warmup.unwrap_or(if args.quick { 5 } else { 20 }),
        venv: args.relay_venv.clone(),
        no_litellm: args.relay_no_litellm,
        concurrency: 1,
        rounds: args.relay_concurrent_rounds.unwrap_or(if args.quick { 1 } else { 2 }).max(1),
    }
}

/// The relay scenarios: one request at a time (`relay`), then each concurrency of `--relay-concurrency`
/// (`relay-N`), the upstream streaming at `--relay-concurrent-interval`.
fn relay_scenarios(args: &Args) -> Vec<Scenario> {
    let one = relay_settings(args);
    let mut all = vec![Scenario {
        name: "relay".into(),
        kind: Kind::Relay(one.clone()),
        ceiling: false,
        nchan: false,
        transport: Transport::Sse,
    }];
    for &concurrency in args.relay_concurrency.iter().filter(|&&n| n > 1) {
        let mut relay = one.clone();
        relay.concurrency = concurrency;
        relay.pace.interval = args.relay_concurrent_interval;
        let name = format!("relay-{concurrency}");
        all.push(Scenario { name, kind: Kind::Relay(relay), ceiling: false, nchan: false, transport: Transport::Sse });
    }
    all
}

/// Every scenario: the relay and the soak (last) only run when asked for by name.
fn scenarios(args: &Args) -> Vec<Scenario> {
    let mut all = standard(args.quick);
    all.extend(relay_scenarios(args));
    let soak = Soak {
        duration: args.soak_duration,
        connections: args.soak_connections,
        retention: args.soak_retention,
        warmup: args.soak_warmup,
        sample: args.soak_sample.max(Duration::from_millis(100)),
        server_args: args.soak_server_arg.clone(),
    };
    all.push(Scenario {
        name: "soak".into(),
        kind: Kind::Soak(soak),
        ceiling: false,
        nchan: false,
        transport: Transport::Sse,
    });
    all.extend(cluster(args.quick));
    all
}

/// One node against three through Redis: publish-to-receive latency at a steady rate with the subscribers
/// on the writer against on the two other nodes, and batched fan-out with the subscribers on one node
/// against spread over three.
fn cluster(quick: bool) -> Vec<Scenario> {
    let (subscribers, fanout, messages, seconds) =
        if quick { (300, 300, 10_000, 5.0) } else { (600, 900, 30_000, 10.0) };
    let scenario = |name: &str, nodes, remote, subscribers, rate| Scenario {
        name: name.into(),
        kind: Kind::Cluster { nodes, remote, subscribers, messages, rate, seconds },
        ceiling: false,
        nchan: false,
        transport: Transport::Sse,
    };
    vec![
        scenario("cluster-latency-1node", 1, false, subscribers, Some(100.0)),
        scenario("cluster-latency-3nodes", 3, true, subscribers, Some(100.0)),
        scenario("cluster-fanout-1node", 1, false, fanout, None),
        scenario("cluster-fanout-3nodes", 3, false, fanout, None),
    ]
}

fn selected(args: &Args, scenario: &Scenario) -> bool {
    if let Kind::Soak(_) = scenario.kind {
        return args.soak || args.only.iter().any(|o| o == "soak");
    }
    if let Kind::Relay(_) = scenario.kind {
        return args.relay || args.only.iter().any(|o| o.starts_with("relay") && scenario.name.starts_with(o.as_str()));
    }
    if let Kind::Cluster { .. } = scenario.kind {
        return args.cluster
            || args.only.iter().any(|o| o.starts_with("cluster") && scenario.name.starts_with(o.as_str()));
    }
    if (args.soak || args.relay || args.cluster) && args.only.is_empty() {
        return false;
    }
    args.only.is_empty() || args.only.iter().any(|o| scenario.name.starts_with(o.as_str()))
}

/// The WebSocket twin of an SSE scenario: the same load with its subscribers on `/v1/streams/{id}/ws`,
/// beside nchan's WebSocket subscribers (not the ceiling's: it speaks SSE only; the table sets each WebSocket
/// figure beside agentmux's SSE one of the same run instead).
fn ws_twin(sse: &Scenario) -> Scenario {
    Scenario { name: format!("ws-{}", sse.name), transport: Transport::WebSocket, ceiling: false, ..sse.clone() }
}

/// The SSE scenarios that have a WebSocket twin, which runs right after each.
fn twinned(name: &str) -> bool {
    matches!(name, "fanout-100" | "fanout-1000" | "tokens-100" | "tokens-1000")
        || name.starts_with("latency-")
        || name.starts_with("idle-")
}

fn standard(quick: bool) -> Vec<Scenario> {
    standard_sse(quick)
        .into_iter()
        .flat_map(|scenario| {
            let twin = twinned(&scenario.name).then(|| ws_twin(&scenario));
            std::iter::once(scenario).chain(twin)
        })
        .collect()
}

fn standard_sse(quick: bool) -> Vec<Scenario> {
    let other = |name: &str, kind| Scenario {
        name: name.into(),
        kind,
        ceiling: false,
        nchan: false,
        transport: Transport::Sse,
    };
    let idle = |name: &str, connections, hold| Scenario {
        name: name.into(),
        kind: Kind::Idle { connections, hold },
        ceiling: false,
        nchan: true,
        transport: Transport::Sse,
    };
    // The same in both modes (under 10 s each): a stream holds at most 100,000 messages, so the fill leaves
    // room for the live producer's 3,000 and the stream's own events.
    let stall = other("stall", Kind::Stall { messages: 96_000, rate: 1000.0, seconds: 3.0, join_after: 1.0 });
    let ws_idle =
        other("ws-idle", Kind::WsIdle(WsIdle { connections: 40, messages: 2000, message_bytes: 10_000, settle: 2.0 }));
    if quick {
        vec![
            fanout("fanout-100", 100, 0, 60_000),
            fanout("fanout-1000", 1000, 0, 20_000),
            fanout("fanout-2000", 2000, 0, 10_000),
            Scenario {
                name: "latency-500".into(),
                kind: Kind::Latency { subscribers: 500, rate: 100.0, seconds: 5.0 },
                ceiling: true,
                nchan: true,
                transport: Transport::Sse,
            },
            other("many-streams-2000", Kind::ManyStreams { streams: 2000, seconds: 3.0 }),
            idle("idle-2000", 2000, 1.0),
            fanout("openai-mix-1000", 500, 500, 10_000),
            formats(1200, 10_000),
            tokens(100, 20_000, TokenSource::Post),
            tokens(100, 20_000, TokenSource::Output),
            tokens(1000, 3000, TokenSource::Post),
            tokens(1000, 3000, TokenSource::Output),
            other("chat-200", Kind::Chat { concurrency: 200, requests: 1, words: 2000 }),
            other("chat-retained-600", Kind::Chat { concurrency: 8, requests: 75, words: 2000 }),
            stall,
            ws_idle,
        ]
    } else {
        vec![
            // Long enough to last about three seconds (agentmux is started with room for it): at 90,000
            // messages a run lasted one, and the shared machine's swings decided the ratio.
            fanout("fanout-100", 100, 0, 270_000),
            fanout("fanout-1000", 1000, 0, 30_000),
            fanout("fanout-5000", 5000, 0, 6_000),
            Scenario {
                name: "latency-1000".into(),
                // Twenty seconds: the p99 of ten swung with whatever else the machine did meanwhile.
                kind: Kind::Latency { subscribers: 1000, rate: 100.0, seconds: 20.0 },
                ceiling: true,
                nchan: true,
                transport: Transport::Sse,
            },
            other("many-streams-10000", Kind::ManyStreams { streams: 10_000, seconds: 10.0 }),
            idle("idle-10000", 10_000, 5.0),
            fanout("openai-mix-2000", 1000, 1000, 15_000),
            formats(3000, 15_000),
            tokens(100, 50_000, TokenSource::Post),
            tokens(100, 50_000, TokenSource::Output),
            tokens(1000, 10_000, TokenSource::Post),
            tokens(1000, 10_000, TokenSource::Output),
            other("chat-200", Kind::Chat { concurrency: 200, requests: 3, words: 2000 }),
            other("chat-retained-600", Kind::Chat { concurrency: 8, requests: 75, words: 2000 }),
            stall,
            ws_idle,
        ]
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.ceiling_server {
        let mode = if args.ceiling_naive { ceiling::Mode::Naive } else { ceiling::Mode::Coalescing };
        return ceiling::main(args.addr.as_deref().unwrap_or("127.0.0.1:8090"), mode);
    }
    if args.output_server {
        return output_server::main(args.addr.as_deref().unwrap_or("127.0.0.1:8090"));
    }
    if args.relay_upstream {
        let pace = relay::upstream::Pace { chunks: args.relay_chunks.max(1), interval: args.relay_interval };
        return relay::upstream::main(
            args.addr.as_deref().unwrap_or("127.0.0.1:0"),
            pace,
            args.relay_tls_dir.as_deref(),
        );
    }
    if !args.bench {
        eprintln!("load: not started by `cargo bench`: skipped (run ./bench, or cargo bench --bench load)");
        return ExitCode::SUCCESS;
    }
    client::now_ns();
    // Children inherit the raised limit: both ends of 10,000 connections need their own descriptors.
    let nofile = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0);
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("load: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(bench(args, nofile))
}

#[derive(Serialize)]
struct Report<'a> {
    mode: &'a str,
    runs: usize,
    cores: usize,
    nofile: u64,
    batch: usize,
    deltas_per_message: usize,
    sample_every: u64,
    /// nchan's versions, when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    nchan: Option<String>,
    medians: Vec<RunResult>,
    all_runs: Vec<RunResult>,
    /// The relay's settings, LiteLLM's version and the issue's targets, when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    relay: Option<Vec<relay::Summary>>,
}

async fn bench(args: Args, nofile: u64) -> ExitCode {
    if !args.server.exists() {
        eprintln!("load: {} not found: build it with `cargo build --release` (or use ./bench)", args.server.display());
        return ExitCode::FAILURE;
    }
    let selected: Vec<Scenario> = scenarios(&args).into_iter().filter(|s| selected(&args, s)).collect();
    // nchan when a scenario runs against it, it is wanted and it works here; else one line why not.
    let nchan = if args.no_nchan || !selected.iter().any(|s| s.nchan) {
        None
    } else {
        match nchan::Install::find() {
            Ok(install) => {
                eprintln!("load: nchan: {}", install.versions);
                Some(install)
            }
            Err(why) => {
                eprintln!("load: nchan skipped: {why}");
                None
            }
        }
    };
    let settings = Settings {
        agentmux: args.server.clone(),
        batch: args.batch.max(1),
        deltas_per_message: args.deltas_per_message.max(1),
        sample_every: args.sample_every,
        drain: Duration::from_secs(if args.quick { 20 } else { 60 }),
        store: args.store,
        durable_acks: !args.no_durable_acks,
        nchan,
    };
    let only_soak = selected.iter().all(|s| matches!(s.kind, Kind::Soak(_)));
    let runs = args.runs.unwrap_or(if args.quick || only_soak { 1 } else { 3 }).max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "load: {} scenario(s), {runs} run(s) each, {cores} cores, open-file limit {nofile}, batch {}, {} deltas per \
         message, latency sampled 1/{} in fan-out",
        selected.len(),
        settings.batch,
        settings.deltas_per_message,
        settings.sample_every
    );
    let started = Instant::now();
    let mut all = Vec::new();
    for run in 1..=runs {
        for scenario in &selected {
            // The soak runs for minutes: once.
            if run > 1 && matches!(scenario.kind, Kind::Soak(_)) {
                continue;
            }
            // The relay measures its three targets side by side in each run.
            if let Kind::Relay(relay) = &scenario.kind {
                let began = Instant::now();
                let rows = relay::run(relay, &scenario.name, run, &settings).await.unwrap_or_else(|e| {
                    vec![RunResult {
                        scenario: scenario.name.clone(),
                        target: Target::Agentmux.name().into(),
                        run,
                        connections: scenario.connections(),
                        errors: 1,
                        notes: vec![format!("failed: {e}")],
                        ..RunResult::default()
                    }]
                });
                for result in rows {
                    progress(run, scenario, &result, began);
                    all.push(result);
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
            let mut targets = vec![Target::Agentmux];
            if scenario.ceiling && !args.no_ceiling {
                targets.push(Target::Ceiling);
                if !args.no_naive_ceiling {
                    targets.push(Target::CeilingNaive);
                }
            }
            if scenario.nchan && settings.nchan.is_some() {
                targets.push(Target::Nchan);
            }
            // Every other run takes the servers in the opposite order, so that none is always first after
            // the last scenario or always last: what the machine does meanwhile falls on each in turn.
            if run % 2 == 0 {
                targets.reverse();
            }
            for target in targets {
                let began = Instant::now();
                let needed = scenario.connections() as u64 + 64;
                let result = if nofile < needed {
                    Err(std::io::Error::other(format!("needs {needed} open files, the limit is {nofile}")))
                } else {
                    scenarios::run(scenario, target, run, &settings).await
                };
                let result = result.unwrap_or_else(|e| RunResult {
                    scenario: scenario.name.clone(),
                    target: target.name().into(),
                    run,
                    connections: scenario.connections(),
                    errors: 1,
                    notes: vec![format!("failed: {e}")],
                    ..RunResult::default()
                });
                progress(run, scenario, &result, began);
                all.push(result);
                // Let the sockets of the last run close before the next server starts.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    let medians = medians(&selected, &all);
    print_table(&medians, runs, args.quick);
    let relays: Vec<Relay> = selected
        .iter()
        .filter_map(|s| if let Kind::Relay(relay) = &s.kind { Some(relay.clone()) } else { None })
        .collect();
    relay::print_tables(&relays, &medians, runs);
    println!("total {:.0}s", started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        let report = Report {
            mode: if args.quick { "quick" } else { "full" },
            runs,
            cores,
            nofile,
            batch: settings.batch,
            deltas_per_message: settings.deltas_per_message,
            sample_every: settings.sample_every,
            nchan: settings.nchan.as_ref().map(|install| install.versions.clone()),
            relay: relay::summary(&relays, &medians),
            medians,
            all_runs: all,
        };
        let written = serde_json::to_vec_pretty(&report).map_err(std::io::Error::other).and_then(|json| {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(path, json)
        });
        match written {
            Ok(()) => eprintln!("load: wrote {}", path.display()),
            Err(e) => {
                eprintln!("load: writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// One line per finished run of a scenario against one server.
fn progress(run: usize, scenario: &Scenario, result: &RunResult, began: Instant) {
    eprintln!(
        "  run {run} {:<20} {:<8} {:>10}/s  p99 {:>8}  errors {}  lagged {}  ({:.1}s){}",
        scenario.name,
        result.target,
        rate(result.deliveries_per_s),
        ms(result.p99_ms),
        result.errors,
        result.lagged,
        began.elapsed().as_secs_f64(),
        if result.notes.is_empty() { String::new() } else { format!("  {}", result.notes.join("; ")) }
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 }
}

fn median_opt(values: Vec<Option<f64>>) -> Option<f64> {
    let present: Vec<f64> = values.into_iter().flatten().collect();
    (!present.is_empty()).then(|| median(present))
}

/// Per scenario and server, the median of each figure over the runs (errors and lagged: the median too).
fn medians(selected: &[Scenario], all: &[RunResult]) -> Vec<RunResult> {
    let mut out = Vec::new();
    for scenario in selected {
        // The servers in the order they first ran.
        let mut targets: Vec<&str> = Vec::new();
        for row in all.iter().filter(|r| r.scenario == scenario.name) {
            if !targets.contains(&row.target.as_str()) {
                targets.push(&row.target);
            }
        }
        for target in targets {
            let runs: Vec<&RunResult> =
                all.iter().filter(|r| r.scenario == scenario.name && r.target == target).collect();
            let Some(first) = runs.first() else { continue };
            let m = |f: fn(&RunResult) -> f64| median(runs.iter().map(|r| f(r)).collect());
            let mo = |f: fn(&RunResult) -> Option<f64>| median_opt(runs.iter().map(|r| f(r)).collect());
            let mut extra = BTreeMap::new();
            for key in runs.iter().flat_map(|r| r.extra.keys()) {
                let values = runs.iter().filter_map(|r| r.extra.get(key).copied()).collect();
                extra.insert(key.clone(), median(values));
            }
            if target == Target::Agentmux.name() {
                extra.extend(paired_ratios(&runs, all));
                extra.extend(paired_with_sse(&runs, all));
            }
            let mut notes: Vec<String> = Vec::new();
            for note in runs.iter().flat_map(|r| r.notes.iter()) {
                if notes.len() < 4 && !notes.contains(note) {
                    notes.push(note.clone());
                }
            }
            out.push(RunResult {
                scenario: first.scenario.clone(),
                target: first.target.clone(),
                run: 0,
                connections: first.connections,
                messages: m(|r| r.messages as f64) as u64,
                deliveries: m(|r| r.deliveries as f64) as u64,
                seconds: m(|r| r.seconds),
                deliveries_per_s: m(|r| r.deliveries_per_s),
                latency_samples: m(|r| r.latency_samples as f64) as u64,
                p50_ms: mo(|r| r.p50_ms),
                p99_ms: mo(|r| r.p99_ms),
                p999_ms: mo(|r| r.p999_ms),
                server_cpu_s: m(|r| r.server_cpu_s),
                server_peak_rss_mib: m(|r| r.server_peak_rss_mib),
                client_cpu_s: m(|r| r.client_cpu_s),
                errors: m(|r| r.errors as f64).round() as u64,
                lagged: m(|r| r.lagged as f64).round() as u64,
                extra,
                notes,
            });
        }
    }
    out
}

/// One figure of a run, when it has it.
type Figure = fn(&RunResult) -> Option<f64>;

/// agentmux against each peer run by run: for each run, agentmux's deliveries per second over the peer's in
/// the same run (and its p99 over the peer's), then the median of those ratios (`paired_<figure>_vs_<peer>`).
/// The two ran seconds apart, so a slow phase of the shared machine falls on both sides of one ratio
/// instead of on one side of the ratio of medians; the runs' own ratios go beside it (`..._run<n>`).
fn paired_ratios(runs: &[&RunResult], all: &[RunResult]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for peer in [Target::Ceiling.name(), Target::CeilingNaive.name(), Target::Nchan.name()] {
        let figures: [(&str, Figure); 2] = [
            ("deliveries", |r| Some(r.deliveries_per_s).filter(|d| *d > 0.0)),
            ("p99", |r| r.p99_ms.filter(|p| *p > 0.0)),
        ];
        for (figure, value) in figures {
            let mut ratios = Vec::new();
            for mine in runs {
                let theirs = all.iter().find(|r| r.scenario == mine.scenario && r.target == peer && r.run == mine.run);
                if let (Some(a), Some(b)) = (value(mine), theirs.and_then(value)) {
                    out.insert(format!("paired_{figure}_vs_{peer}_run{}", mine.run), a / b);
                    ratios.push(a / b);
                }
            }
            if !ratios.is_empty() {
                out.insert(format!("paired_{figure}_vs_{peer}"), median(ratios));
            }
        }
    }
    out
}

/// A WebSocket scenario's agentmux figures over agentmux's own in its SSE twin, run by run, and the median of
/// those (`paired_<figure>_vs_sse`): deliveries per second, p99, and an idle connection's RSS.
fn paired_with_sse(runs: &[&RunResult], all: &[RunResult]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let figures: [(&str, Figure); 3] = [
        ("deliveries", |r| Some(r.deliveries_per_s).filter(|d| *d > 0.0)),
        ("p99", |r| r.p99_ms.filter(|p| *p > 0.0)),
        ("rss_per_conn", |r| r.extra.get("server_rss_kib_per_conn").copied().filter(|k| *k > 0.0)),
    ];
    for (figure, value) in figures {
        let mut ratios = Vec::new();
        for mine in runs {
            let Some(sse) = mine.scenario.strip_prefix("ws-") else { continue };
            let theirs = all.iter().find(|r| r.scenario == sse && r.target == mine.target && r.run == mine.run);
            if let (Some(a), Some(b)) = (value(mine), theirs.and_then(value)) {
                out.insert(format!("paired_{figure}_vs_sse_run{}", mine.run), a / b);
                ratios.push(a / b);
            }
        }
        if !ratios.is_empty() {
            out.insert(format!("paired_{figure}_vs_sse"), median(ratios));
        }
    }
    out
}

fn rate(per_s: f64) -> String {
    match per_s {
        r if r >= 1e6 => format!("{:.2}M", r / 1e6),
        r if r >= 1e4 => format!("{:.0}k", r / 1e3),
        r if r >= 1e3 => format!("{:.1}k", r / 1e3),
        r => format!("{r:.0}"),
    }
}

fn ms(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// What a row adds beside the common columns.
fn notes(row: &RunResult, rows: &[RunResult]) -> String {
    let get = |key: &str| row.extra.get(key).copied();
    let mut parts = Vec::new();
    if let (Some(per_message), Some(per_delivery)) = (get("server_us_per_message"), get("server_us_per_delivery")) {
        parts.push(format!("server CPU {per_message:.1} µs per message, {per_delivery:.2} µs per delivery"));
    }
    // The in-process producer beside the same load posted.
    if let Some(subscribers) = row.scenario.strip_prefix("tokens-output-") {
        let posted = rows.iter().find(|r| r.scenario == format!("tokens-{subscribers}") && r.target == row.target);
        if let Some(posted) = posted.filter(|p| p.deliveries_per_s > 0.0) {
            parts.push(format!(
                "{:.2}x the deliveries/s of a POST per delta",
                row.deliveries_per_s / posted.deliveries_per_s
            ));
        }
    }
    parts.extend(relay::notes(&row.extra));
    if let Some(rps) = get("requests_per_s") {
        parts.push(format!("{rps:.1} req/s, {} chunks/s; latency = time to first chunk", rate(row.deliveries_per_s)));
    }
    if let (Some(rate_now), Some(target)) = (get("publish_msgs_per_s"), get("target_msgs_per_s")) {
        parts.push(format!("published {}/s of {}/s", rate(rate_now), rate(target)));
    } else if let Some(published) = get("publish_msgs_per_s") {
        parts.push(format!("published {} msg/s", rate(published)));
    }
    if let Some(floor) = get("burst_floor_ms") {
        parts.push(format!(
            "kernel CPU per delivery: server {:.1} µs + reader {:.1} µs, so one message to all takes ≥ {floor:.1} ms",
            get("server_kernel_us_per_delivery").unwrap_or(0.0),
            get("client_kernel_us_per_delivery").unwrap_or(0.0),
        ));
    }
    // The p99 beside each peer's, run by run (as the vs columns are for deliveries).
    for peer in ["ceiling", "ceiling-naive", "nchan", "sse"] {
        if let Some(ratio) = get(&format!("paired_p99_vs_{peer}")) {
            let each: Vec<String> = (1..)
                .map_while(|run| get(&format!("paired_p99_vs_{peer}_run{run}")))
                .map(|r| format!("{r:.2}"))
                .collect();
            let whose = if peer == "sse" { "agentmux SSE twin".to_owned() } else { peer.to_owned() };
            parts.push(format!("p99 {ratio:.2}x the {whose}'s (per run {})", each.join(", ")));
        }
    }
    if let Some(ratio) = get("paired_rss_per_conn_vs_sse") {
        parts.push(format!("RSS/conn {ratio:.2}x the agentmux SSE twin's"));
    }
    if let Some(mib) = get("received_mib_per_s") {
        parts.push(format!("{mib:.0} MiB/s"));
    }
    if let Some(most) = get("renders_per_message_max") {
        let each: Vec<String> = row
            .extra
            .iter()
            .filter_map(|(key, value)| Some((key.strip_prefix("renders_per_message_")?, value)))
            .filter(|(format, _)| *format != "max")
            .map(|(format, value)| format!("{format} {value:.3}"))
            .collect();
        parts.push(format!("renders per message: at most {most:.3} ({})", each.join(", ")));
    }
    if let Some(server) = get("server_rss_kib_per_conn") {
        parts.push(format!(
            "RSS/conn: server {server:.1} KiB, client {:.1} KiB; kernel/conn pair {:.1} KiB; {:.0} connects/s",
            get("client_rss_kib_per_conn").unwrap_or(0.0),
            get("kernel_kib_per_conn_pair").unwrap_or(0.0),
            get("connect_per_s").unwrap_or(0.0)
        ));
    }
    if let Some(catch_up) = get("catch_up_ms") {
        parts.push(format!(
            "first OpenAI subscriber to {:.0} messages: head after {:.0} ms, caught up ({:.0} chunks; deliv/s is \
             their rate) after {catch_up:.0} ms",
            get("log_at_join").unwrap_or(0.0),
            get("catch_up_head_ms").unwrap_or(0.0),
            get("catch_up_chunks").unwrap_or(0.0),
        ));
        for (prefix, when) in [("stall", "meanwhile"), ("before", "before it joined")] {
            if let Some(p50) = get(&format!("{prefix}_post_p50_ms")) {
                parts.push(format!(
                    "POST latency {when}: p50 {} / p99 {} / max {} ms ({:.0} POSTs)",
                    ms(Some(p50)),
                    ms(get(&format!("{prefix}_post_p99_ms"))),
                    ms(get(&format!("{prefix}_post_max_ms"))),
                    get(&format!("{prefix}_posts")).unwrap_or(0.0),
                ));
            }
        }
    }
    for (set, name) in [("sse", "SSE"), ("ws", "WebSocket")] {
        if let Some(added) = get(&format!("{set}_idle_added_mib")) {
            parts.push(format!(
                "{:.0} {name} subscribers that never read added {added:.1} MiB RSS ({:.0} KiB/conn) to {:.1} MiB",
                get(&format!("{set}_idle_open")).unwrap_or(0.0),
                get(&format!("{set}_idle_kib_per_conn")).unwrap_or(0.0),
                get(&format!("{set}_idle_rss_before_mib")).unwrap_or(0.0),
            ));
        }
    }
    if get("ws_idle_added_mib").is_some() {
        parts.push("each set on a fresh server holding the same stream".into());
    }
    if let Some(slope) = get("soak_rss_slope_mib_per_min") {
        parts.push(format!(
            "RSS {:.1} → {:.1} MiB over the steady part (max {:.1}), slope {slope:+.3} MiB/min, end/start {:.3}: \
             {}; {:.0} connections held (min {:.0}), {:.0} opened; streams {:.0} created, {:.0} ended",
            get("soak_rss_start_mib").unwrap_or(0.0),
            get("soak_rss_end_mib").unwrap_or(0.0),
            get("soak_rss_max_mib").unwrap_or(0.0),
            get("soak_rss_end_over_start").unwrap_or(0.0),
            if get("soak_flat") == Some(1.0) { "flat" } else { "NOT flat" },
            get("soak_held_end").unwrap_or(0.0),
            get("soak_held_min").unwrap_or(0.0),
            get("soak_opened").unwrap_or(0.0),
            get("soak_streams_created").unwrap_or(0.0),
            get("soak_streams_ended").unwrap_or(0.0),
        ));
    }
    if let Some(overflows) = get("listen_overflows") {
        parts.push(format!("{overflows:.0} SYNs dropped by a full listen queue"));
    }
    parts.extend(row.notes.iter().cloned());
    parts.join("; ")
}

fn print_table(rows: &[RunResult], runs: usize, quick: bool) {
    let header = [
        "scenario",
        "server",
        "conns",
        "msgs",
        "deliv/s",
        "vs ceil",
        "vs naive",
        "vs nchan",
        "vs sse",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "srv CPU s",
        "srv RSS MiB",
        "cli CPU s",
        "errors",
        "lagged",
    ];
    let mut lines: Vec<Vec<String>> = Vec::new();
    for row in rows {
        // agentmux's deliveries per second over another server's, run by run, the median of the runs.
        let versus = |other: &str| match row.extra.get(&format!("paired_deliveries_vs_{other}")) {
            Some(ratio) => format!("{ratio:.2}x"),
            None => "".into(),
        };
        let idle = row.deliveries_per_s == 0.0 && row.deliveries == 0;
        lines.push(vec![
            row.scenario.clone(),
            row.target.clone(),
            row.connections.to_string(),
            row.messages.to_string(),
            if idle { "-".into() } else { rate(row.deliveries_per_s) },
            versus("ceiling"),
            versus("ceiling-naive"),
            versus("nchan"),
            versus("sse"),
            ms(row.p50_ms),
            ms(row.p99_ms),
            ms(row.p999_ms),
            format!("{:.2}", row.server_cpu_s),
            format!("{:.1}", row.server_peak_rss_mib),
            format!("{:.2}", row.client_cpu_s),
            row.errors.to_string(),
            row.lagged.to_string(),
            notes(row, rows),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| lines.iter().map(|l| l[i].len()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let format_line = |cells: &[String]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            match widths.get(i) {
                Some(&w) if i < 2 => out.push_str(&format!("{cell:<w$}  ")),
                Some(&w) => out.push_str(&format!("{cell:>w$}  ")),
                None => out.push_str(cell),
            }
        }
        out.trim_end().to_owned()
    };
    println!();
    println!(
        "agentmux load benchmark ({}; {}):",
        if quick { "quick" } else { "full" },
        if runs > 1 { format!("medians of {runs} runs") } else { "one run".into() }
    );
    let mut head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    head.push("notes".into());
    println!("{}", format_line(&head));
    lines.iter().for_each(|l| println!("{}", format_line(l)));
    println!();
    println!(
        "deliv/s: SSE events received per second by all subscribers (pings and the initial stream_start excluded) \
         from the first publish to the last event; vs ceil: agentmux / the minimal hyper server doing the same \
         transport and gathering as agentmux does (a subscriber that keeps up waits 1.5 ms after a write before \
         the next), each run's ratio (the two run seconds apart) and the median of those; vs naive: the same \
         against that server without the gathering (a write per wake-up, so one per message per subscriber \
         when messages come one at a time); vs nchan: the same \
         against nginx with nchan (2 workers, EventSource, or WebSocket in the ws- rows; a message per POST, a batch's \
         POSTs pipelined; the same data: lines; a tenth of the batched fan-out scenarios' messages, at its \
         pace a run of seconds rather than minutes); vs sse: a ws- row (the same load, its subscribers on \
         /v1/streams/{{id}}/ws, a text frame per event) over agentmux's own SSE twin of the same run; latency: publish (stamped in the message; at a steady \
         rate, the moment it was due, so a server that falls behind is charged for its backlog) to receipt, \
         sampled; \
         tokens: a delta per POST, or (tokens-output) emitted inside agentmux through its Output handle; \
         srv CPU: during that window (nchan: master and workers); srv RSS: the server's VmHWM (nchan: the sum of \
         its processes', shared memory counted in each); cli CPU: the load generator during the window."
    );
}

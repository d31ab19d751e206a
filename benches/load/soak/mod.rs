//! The `soak` scenario (issue "Holds under abuse"): about 10,000 connections against one server for ten
//! minutes while streams start and end, sampling the server's RSS. Not in the default set: `./bench --soak`
//! (or `--only soak`), `--soak-duration 60s` for a short one.
//!
//! The server runs with a short `--retention` (30 s), so ended streams are evicted during the soak (and a
//! `--max-connections` above the soak's count when the server has that flag). The connections, a mix of
//! every kind a server meets:
//!
//! | share | what | module |
//! |---|---|---|
//! | 30% | SSE readers, CUI | `sse.rs` |
//! | 20% | SSE readers, `format=openai` | `sse.rs` |
//! | 10% | WebSocket readers on `/v1/streams/{id}/ws`, half CUI, half OpenAI | `ws.rs` |
//! | 10% | WebSocket readers on `/v1/ws`, two subscriptions each | `ws.rs` |
//! | 14% | idle SSE subscribers of quiet streams (pings, a message a minute) | `sse.rs` |
//! | 6% | idle `/v1/ws` connections that subscribe to nothing and send nothing | `ws.rs` |
//! | 8% | slow SSE readers, half CUI, half OpenAI | `sse.rs`, `scan.rs` |
//! | 2% | slow WebSocket readers, half CUI, half OpenAI | `ws.rs`, `scan.rs` |
//!
//! Meanwhile 100 producers (`producer.rs`) keep 100 streams open, each living 10–40 s with an append
//! every 250–750 ms, so readers re-subscribe all the time; two more keep a bulk stream each open (16 KiB
//! deltas, megabytes a stream) that only slow readers read, one in ten of them, so that the server's
//! cursor falls behind what the kernel buffers and eviction gives them `lagged`; ten quiet streams hold
//! the idle subscribers. Connections open 64 at a time until the target
//! is held (the ramp); the duration counts from then; every `sample` the server's RSS and the counts are
//! taken (`report.rs`), and a progress line is printed every 30 s. Then every task stops, and the figures
//! are printed: RSS at the start of the steady part, at the end, the most, the slope, connections held,
//! streams, deliveries, errors, `lagged`, and the verdict.

mod producer;
mod report;
mod scan;
mod shared;
mod sse;
mod ws;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use tokio::task::JoinSet;

use crate::procfs::{self, Server};
use crate::scenarios::{RunResult, on_own_thread};

use producer::Production;
use report::{Run, Sample};
use shared::Shared;
use sse::SseKind;
use ws::WsKind;

/// The soak's settings (`--soak-*` flags).
#[derive(Debug, Clone)]
pub(crate) struct Soak {
    /// How long the connections are held once the ramp is over.
    pub(crate) duration: Duration,
    /// Subscriber connections to hold (producers' come on top).
    pub(crate) connections: usize,
    /// The server's `--retention`.
    pub(crate) retention: Duration,
    /// Left out of the RSS figures at the start (default: a fifth of the duration).
    pub(crate) warmup: Option<Duration>,
    /// Between two samples.
    pub(crate) sample: Duration,
    /// More server flags, passed as they are.
    pub(crate) server_args: Vec<String>,
}

/// Streams, their producers and the quiet streams.
fn production() -> Production {
    Production {
        slots: 100,
        bulk_slots: 2,
        bulk_bytes: 16 << 10,
        lifetime: 10.0..40.0,
        interval_ms: 250..750,
        quiet: 10,
        quiet_every: Duration::from_secs(60),
    }
}

/// A subscriber of one kind.
#[derive(Debug, Clone, Copy)]
enum Subscriber {
    Sse(SseKind),
    Ws(WsKind),
}

/// The kinds and their shares in thousandths.
const MIX: [(&str, u32, Subscriber); 11] = [
    ("SSE CUI", 300, Subscriber::Sse(SseKind::Reader { openai: false })),
    ("SSE OpenAI", 200, Subscriber::Sse(SseKind::Reader { openai: true })),
    ("WS per-stream CUI", 50, Subscriber::Ws(WsKind::Stream { openai: false })),
    ("WS per-stream OpenAI", 50, Subscriber::Ws(WsKind::Stream { openai: true })),
    ("WS /v1/ws x2", 100, Subscriber::Ws(WsKind::Multi)),
    ("idle SSE", 140, Subscriber::Sse(SseKind::Idle)),
    ("idle WS", 60, Subscriber::Ws(WsKind::Idle)),
    ("slow SSE CUI", 40, Subscriber::Sse(SseKind::Slow { openai: false })),
    ("slow SSE OpenAI", 40, Subscriber::Sse(SseKind::Slow { openai: true })),
    ("slow WS CUI", 10, Subscriber::Ws(WsKind::Slow { openai: false })),
    ("slow WS OpenAI", 10, Subscriber::Ws(WsKind::Slow { openai: true })),
];

impl Soak {
    /// File descriptors the load generator needs.
    pub(crate) fn connections(&self) -> usize {
        let plan = production();
        self.connections + plan.slots + plan.bulk_slots + 2
    }

    /// How many of each kind: `(name, count, kind)`.
    fn mix(&self) -> Vec<(&'static str, usize, Subscriber)> {
        let mut left = self.connections;
        let mut out = Vec::new();
        for (i, &(name, share, kind)) in MIX.iter().enumerate() {
            let count = if i + 1 == MIX.len() { left } else { (self.connections * share as usize / 1000).min(left) };
            left -= count;
            out.push((name, count, kind));
        }
        out
    }

    /// The server's flags: `--retention`, `--max-connections` if the server has it (above what the soak
    /// holds), then `--soak-server-arg`s; a flag given there is not added.
    pub(crate) fn server_args(&self, agentmux: &Path) -> Vec<String> {
        let help = std::process::Command::new(agentmux)
            .arg("--help")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let given = |flag: &str| self.server_args.iter().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        let mut args = Vec::new();
        if !given("--retention") {
            args.extend(["--retention".into(), humantime::format_duration(self.retention).to_string()]);
        }
        if help.contains("--max-connections") && !given("--max-connections") {
            args.extend(["--max-connections".into(), (self.connections() + 1024).to_string()]);
        }
        args.extend(self.server_args.iter().cloned());
        args
    }
}

/// One soak against `server` (started with [`Soak::server_args`]).
pub(crate) async fn soak(
    server: &Server,
    soak: &Soak,
    server_args: &[String],
    result: &mut RunResult,
) -> io::Result<()> {
    let shared = Shared::new(server.addr);
    let plan = production();
    let Some(quiet) = producer::quiet_streams(&shared, plan.quiet).await else {
        let why = shared.counters.notes().into_iter().map(|(n, _)| n).collect::<Vec<_>>().join("; ");
        return Err(io::Error::other(format!("creating the quiet streams: {why}")));
    };
    let producers = on_own_thread({
        let (shared, plan) = (Arc::clone(&shared), plan.clone());
        move || producer::run(shared, plan, quiet)
    });
    let began = Instant::now();
    while shared.board.active() < plan.slots / 2 && began.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mix = soak.mix();
    let mut kinds: Vec<Subscriber> =
        mix.iter().flat_map(|&(_, count, kind)| std::iter::repeat_n(kind, count)).collect();
    kinds.shuffle(&mut rand::rng());
    let mut tasks = JoinSet::new();
    let ramp = Instant::now();
    for (index, kind) in kinds.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        match kind {
            Subscriber::Sse(kind) => tasks.spawn(sse::subscriber(shared, index, kind)),
            Subscriber::Ws(kind) => tasks.spawn(ws::subscriber(shared, index, kind)),
        };
    }
    let target = soak.connections as i64;
    while shared.counters.held() < target && ramp.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ramp_s = ramp.elapsed().as_secs_f64();
    eprintln!("  soak: {} connections held after a ramp of {ramp_s:.1} s", shared.counters.held());

    let (server_cpu, client_cpu) = (server.cpu_seconds(), procfs::cpu_seconds("self"));
    let steady = tokio::time::Instant::now();
    let mut samples = Vec::new();
    let mut every = tokio::time::interval(soak.sample);
    let mut next_progress = 0.0;
    loop {
        every.tick().await;
        let sample = Sample::take(steady.elapsed().as_secs_f64(), server, &shared);
        if sample.t >= next_progress {
            eprintln!("{}", sample.progress());
            next_progress += 30.0;
        }
        samples.push(sample);
        if sample.t >= soak.duration.as_secs_f64() {
            break;
        }
    }
    let (server_cpu, client_cpu) =
        (server.cpu_seconds().since(server_cpu), procfs::cpu_seconds("self").since(client_cpu));
    let peak_rss_kib = server.peak_rss_kib();

    shared.stop.cancel();
    let stopped =
        tokio::time::timeout(Duration::from_secs(30), async { while tasks.join_next().await.is_some() {} }).await;
    if stopped.is_err() {
        result.note("some subscribers did not stop within 30 s".into());
    }
    drop(tasks);
    let _ = tokio::time::timeout(Duration::from_secs(30), producers).await;

    let mix_text =
        mix.iter().filter(|(_, n, _)| *n > 0).map(|(name, n, _)| format!("{n} {name}")).collect::<Vec<_>>().join(", ");
    let run = Run {
        warmup: soak.warmup.unwrap_or(soak.duration / 5),
        ramp_s,
        target: soak.connections,
        mix: &mix_text,
        server_args,
        server_cpu,
        client_cpu,
        peak_rss_kib,
    };
    report::finish(&run, &samples, &shared, &PathBuf::from("target/bench/soak-samples.csv"), result);
    Ok(())
}

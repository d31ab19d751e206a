//! The `relay` scenario (issue "A relay benchmark"): what agentmux adds to the time to first token and to
//! each chunk when it relays a fast OpenAI-compatible upstream, side by side in one run with LiteLLM's proxy
//! in front of the same upstream. Not in the default set: `./bench --relay` (or `--only relay`).
//!
//! Each run starts, on loopback:
//! - the fast upstream (`upstream.rs`, a child process of the load generator) that stamps every content
//!   chunk with the wall-clock time it was written;
//! - `agentmux --addr 127.0.0.1:0 --upstream-url http://UPSTREAM/v1` (its address read from its
//!   `agentmux listening address=...` log line);
//! - a second agentmux, `agentmux-tls`, in front of the same upstream over HTTPS (`--upstream-url
//!   https://UPSTREAM_TLS/v1 --upstream-ca-file`, the upstream's CA made at start by `tls.rs`): what TLS to
//!   the upstream adds (a handshake per pooled connection, decrypting each chunk) beside the plain relay;
//! - LiteLLM's proxy in front of the same upstream (`litellm.rs`: installed into a venv under `target/` the
//!   first time). If it cannot be installed or started, a line says why and the run measures the other two.
//!
//! Then one client (`stream.rs`, on a thread of its own) sends streaming chat requests one at a time,
//! interleaved: the upstream directly (the baseline), agentmux, LiteLLM, again (each round starting one
//! target further on, so each follows every other as often), `warmup` rounds that are not counted, then
//! `requests` rounds that are, so noise meets every target alike. Per target: time to first
//! token (request written to first content chunk read) and per-chunk latency (chunk read less its stamp),
//! p50 and p99, exact over the samples. "Added" is a target's quantile less the direct one's of the same
//! run. The table shows the medians over the runs of every figure, and LiteLLM's added TTFT p50 over
//! agentmux's.

mod litellm;
mod stream;
mod tls;
pub(crate) mod upstream;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::OnceCell;

use crate::procfs::{self, Server};
use crate::scenarios::{RunResult, Settings, on_own_thread};
use litellm::LiteLlm;
use stream::Client;
use upstream::{MODEL, Pace};

/// Nanoseconds since the Unix epoch: the clock the upstream stamps chunks with and the client reads them by
/// (one clock for every process on the machine).
pub(crate) fn wall_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The relay's settings (`--relay-*` flags).
#[derive(Debug, Clone)]
pub(crate) struct Relay {
    /// How the upstream streams.
    pub(crate) pace: Pace,
    /// Counted requests per target and run.
    pub(crate) requests: usize,
    /// Requests per target before counting.
    pub(crate) warmup: usize,
    /// Where LiteLLM is installed.
    pub(crate) venv: PathBuf,
    /// Leave LiteLLM out.
    pub(crate) no_litellm: bool,
}

/// The targets, in the order each round visits them.
pub(crate) const TARGETS: [&str; 4] = ["direct", "agentmux", "agentmux-tls", "litellm"];
const LITELLM_TARGET: &str = TARGETS[3];

/// LiteLLM, installed once per process (or why not).
static LITELLM: OnceCell<Result<LiteLlm, String>> = OnceCell::const_new();

async fn litellm(relay: &Relay) -> Result<LiteLlm, String> {
    if relay.no_litellm {
        return Err("left out (--relay-no-litellm)".into());
    }
    let venv = relay.venv.clone();
    LITELLM
        .get_or_init(|| async move {
            let ensured = tokio::task::spawn_blocking(move || litellm::ensure(&venv)).await;
            let ensured = ensured.unwrap_or_else(|e| Err(format!("installing LiteLLM: {e}")));
            match &ensured {
                Ok(l) => eprintln!("relay: LiteLLM {} (litellm[proxy] in {})", l.version, relay.venv.display()),
                Err(why) => eprintln!("relay: LiteLLM is not available, measuring direct and agentmux only: {why}"),
            }
            ensured
        })
        .await
        .clone()
}

/// Starts `command` with its output going to `log`, and waits (up to `within`) for the line holding
/// `marker` and `address=ADDR` there. The log is read, not piped: a pipe would wake a thread of the load
/// generator for every line the server logs while it is measured.
async fn spawn_announcing(
    mut command: Command,
    log: PathBuf,
    marker: &'static str,
    within: Duration,
) -> io::Result<Server> {
    let name = command.get_program().to_string_lossy().into_owned();
    let file = File::create(&log)?;
    let child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("starting {name}: {e}")))?;
    let mut server = Server::adopt(child, ([127, 0, 0, 1], 0).into());
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(address) = announced(&text, marker, " address=") {
            server.addr = address;
            return Ok(server);
        }
        let why = match server.exited() {
            Some(status) => format!("exited ({status})"),
            None if tokio::time::Instant::now() > deadline => format!("nothing within {within:?}"),
            None => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        return Err(io::Error::other(format!("{name} did not say where it listens: {why}; see {}", log.display())));
    }
}

/// The address after `key` on the line of `log` holding `marker`.
fn announced(log: &str, marker: &str, key: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|line| line.contains(marker))?;
    line.split(key).nth(1)?.split_whitespace().next()?.parse().ok()
}

/// What the client measured of one target.
#[derive(Debug, Default)]
struct Measured {
    ttft: Vec<u64>,
    chunks: Vec<u64>,
    requests: u64,
    /// Wall time of the counted requests, written to body read, in nanoseconds.
    busy_ns: u64,
    errors: u64,
    notes: Vec<String>,
    cpu: procfs::Cpu,
    /// Failures in a row; at [`GIVE_UP`] the target is left out for the rest of the run.
    failing: usize,
}

/// Failures in a row after which a target is not asked again in that run.
const GIVE_UP: usize = 5;

struct Plan {
    /// Name, address, server pid.
    targets: Vec<(&'static str, SocketAddr, String)>,
    /// The key each target wants, if any.
    keys: Vec<Option<String>>,
    upstream_pid: String,
    warmup: usize,
    requests: usize,
    chunks: usize,
    limit: Duration,
}

/// The interleaved rounds; every target's samples and CPU over the counted ones, and the upstream's CPU.
async fn measure(plan: Plan) -> (Vec<Measured>, procfs::Cpu, f64) {
    let body = serde_json::json!({
        "model": MODEL,
        "stream": true,
        "messages": [{"role": "user", "content": "Say something."}],
    })
    .to_string()
    .into_bytes();
    let mut clients: Vec<Client> =
        plan.targets.iter().zip(&plan.keys).map(|(&(_, addr, _), key)| Client::new(addr, key.clone())).collect();
    let mut out: Vec<Measured> = plan.targets.iter().map(|_| Measured::default()).collect();
    let cpus = |plan: &Plan| plan.targets.iter().map(|(_, _, pid)| procfs::cpu_seconds(pid)).collect::<Vec<_>>();
    let (mut before, mut upstream_before, mut started) =
        (cpus(&plan), procfs::cpu_seconds(&plan.upstream_pid), wall_ns());
    for round in 0..plan.warmup + plan.requests {
        if round == plan.warmup {
            (before, upstream_before, started) = (cpus(&plan), procfs::cpu_seconds(&plan.upstream_pid), wall_ns());
        }
        let counted = round >= plan.warmup;
        // Each round starts one target further on, so that each follows every other one as often, and
        // whatever a target still does after its answer (LiteLLM's callbacks) weighs on all alike.
        let n = clients.len();
        for i in (0..n).map(|i| (i + round) % n) {
            let (client, measured) = (&mut clients[i], &mut out[i]);
            if measured.failing >= GIVE_UP {
                continue;
            }
            let began = wall_ns();
            let answer = client.stream("/v1/chat/completions", &body, plan.limit).await;
            let took = wall_ns().saturating_sub(began);
            let why = match &answer {
                Err(e) => Some(e.to_string()),
                Ok(a) if !a.done || a.chunk_ns.len() != plan.chunks || a.ttft_ns.is_none() => Some(format!(
                    "short answer: {} stamped chunks of {}, [DONE] {}",
                    a.chunk_ns.len(),
                    plan.chunks,
                    a.done
                )),
                Ok(_) => None,
            };
            measured.failing = if why.is_some() { measured.failing + 1 } else { 0 };
            if measured.failing == GIVE_UP {
                measured.notes.push(format!("left out after {GIVE_UP} failures in a row"));
            }
            if let Some(why) = why {
                let why = if counted { why } else { format!("warm-up: {why}") };
                measured.errors += 1;
                if measured.notes.len() < 4 && !measured.notes.contains(&why) {
                    measured.notes.push(why);
                }
            }
            if !counted {
                continue;
            }
            measured.requests += 1;
            measured.busy_ns += took;
            if let Ok(answer) = answer {
                measured.ttft.extend(answer.ttft_ns);
                measured.chunks.extend(answer.chunk_ns);
            }
        }
    }
    let seconds = wall_ns().saturating_sub(started) as f64 / 1e9;
    for ((measured, before), after) in out.iter_mut().zip(before).zip(cpus(&plan)) {
        measured.cpu = after.since(before);
    }
    (out, procfs::cpu_seconds(&plan.upstream_pid).since(upstream_before), seconds)
}

/// The value at quantile `q` of `values` (nearest rank), in milliseconds.
fn quantile_ms(values: &mut [u64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1] as f64 / 1e6)
}

/// One run: the three servers, the rounds, a row per target.
pub(crate) async fn run(relay: &Relay, name: &str, run: usize, settings: &Settings) -> io::Result<Vec<RunResult>> {
    let label = format!("{name}-run{run}");
    let litellm = litellm(relay).await;
    let logs = PathBuf::from("target/bench/logs");
    std::fs::create_dir_all(&logs)?;

    let tls_dir = logs.join(format!("{label}-tls"));
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["--relay-upstream", "--addr", "127.0.0.1:0", "--relay-chunks"]).arg(relay.pace.chunks.to_string());
    command.arg("--relay-interval").arg(format!("{}us", relay.pace.interval.as_micros()));
    command.arg("--relay-tls-dir").arg(&tls_dir);
    let within = Duration::from_secs(10);
    let marker = "relay upstream listening";
    let upstream_log = logs.join(format!("{label}-upstream.log"));
    let upstream = spawn_announcing(command, upstream_log.clone(), marker, within).await?;
    let tls_addr = announced(&std::fs::read_to_string(&upstream_log)?, marker, " tls_address=").ok_or_else(|| {
        io::Error::other(format!("the relay upstream did not say where it serves HTTPS: {}", upstream_log.display()))
    })?;

    // With its store (the service's default), what a client receives waits for the writer's commit.
    let (plain_data, tls_data) = (
        settings.store.then(|| crate::procfs::DataDir::fresh(&label)),
        settings.store.then(|| crate::procfs::DataDir::fresh(&format!("{label}-tls"))),
    );
    let agentmux_in_front = |url: String, data: Option<&crate::procfs::DataDir>, extra: Vec<std::ffi::OsString>| {
        let mut command = Command::new(&settings.agentmux);
        command.args(["--addr", "127.0.0.1:0", "--upstream-url", &url]).args(extra);
        match data {
            Some(data) => command.arg("--data-dir").arg(data.path()),
            None => command.env("AGENTMUX_EPHEMERAL", "true"),
        };
        command
    };
    let command = agentmux_in_front(format!("http://{}/v1", upstream.addr), plain_data.as_ref(), Vec::new());
    let agentmux =
        spawn_announcing(command, logs.join(format!("{label}-agentmux.log")), "agentmux listening", within).await?;
    let ca = vec!["--upstream-ca-file".into(), tls_dir.join("ca.pem").into_os_string()];
    let command = agentmux_in_front(format!("https://{tls_addr}/v1"), tls_data.as_ref(), ca);
    let agentmux_tls =
        spawn_announcing(command, logs.join(format!("{label}-agentmux-tls.log")), "agentmux listening", within).await?;

    let master_key = format!("sk-relay-{:032x}", rand::random::<u128>());
    let proxy = match &litellm {
        Ok(litellm) => litellm
            .start(MODEL, upstream.addr, &master_key, &label, Duration::from_secs(180))
            .await
            .map_err(|e| e.to_string()),
        Err(why) => Err(why.clone()),
    };
    if let (Ok(_), Err(why)) = (&litellm, &proxy) {
        eprintln!("relay: LiteLLM did not start in run {run}, measuring direct and agentmux only: {why}");
    }

    let mut targets = vec![(TARGETS[0], upstream.addr, upstream.pid().to_owned())];
    targets.push((TARGETS[1], agentmux.addr, agentmux.pid().to_owned()));
    targets.push((TARGETS[2], agentmux_tls.addr, agentmux_tls.pid().to_owned()));
    if let Ok(proxy) = &proxy {
        targets.push((LITELLM_TARGET, proxy.addr, proxy.pid().to_owned()));
    }
    let stream_s = relay.pace.interval.as_secs_f64() * relay.pace.chunks as f64;
    let keys = targets.iter().map(|(name, _, _)| (*name == LITELLM_TARGET).then(|| master_key.clone())).collect();
    let plan = Plan {
        targets: targets.clone(),
        keys,
        upstream_pid: upstream.pid().to_owned(),
        warmup: relay.warmup,
        requests: relay.requests,
        chunks: relay.pace.chunks,
        limit: Duration::from_secs_f64(10.0 + 4.0 * stream_s),
    };
    let (mut measured, upstream_cpu, seconds) =
        on_own_thread(move || measure(plan)).await.map_err(|_| io::Error::other("the relay client stopped"))?;

    let servers: Vec<&Server> =
        [Some(&upstream), Some(&agentmux), Some(&agentmux_tls), proxy.as_ref().ok()].into_iter().flatten().collect();
    let mut rows = Vec::new();
    for (((target, _, _), measured), server) in targets.iter().zip(measured.iter_mut()).zip(servers) {
        let mut row = RunResult {
            scenario: name.to_owned(),
            target: (*target).to_owned(),
            run,
            connections: 1,
            messages: measured.requests,
            deliveries: measured.chunks.len() as u64,
            seconds,
            deliveries_per_s: measured.chunks.len() as f64 / seconds.max(1e-9),
            latency_samples: measured.ttft.len() as u64,
            p50_ms: quantile_ms(&mut measured.ttft, 0.5),
            p99_ms: quantile_ms(&mut measured.ttft, 0.99),
            server_cpu_s: if *target == TARGETS[0] { upstream_cpu.total() } else { measured.cpu.total() },
            server_peak_rss_mib: server.peak_rss_kib() as f64 / 1024.0,
            errors: measured.errors,
            ..RunResult::default()
        };
        measured.notes.iter().for_each(|n| row.note(n.clone()));
        let mut put = |key: &str, value: Option<f64>| {
            if let Some(value) = value {
                row.extra.insert(key.into(), value);
            }
        };
        put("ttft_p50_ms", row.p50_ms);
        put("ttft_p99_ms", row.p99_ms);
        put("chunk_p50_ms", quantile_ms(&mut measured.chunks, 0.5));
        put("chunk_p99_ms", quantile_ms(&mut measured.chunks, 0.99));
        // The upstream served every target's requests: its CPU per request it answered.
        let served = if *target == TARGETS[0] {
            measured.requests as f64 * targets.len() as f64
        } else {
            measured.requests as f64
        };
        put("cpu_ms_per_request", (served > 0.0).then(|| row.server_cpu_s * 1e3 / served));
        let requests = measured.requests as f64;
        put("request_ms", (requests > 0.0).then(|| measured.busy_ns as f64 / 1e6 / requests));
        if *target == LITELLM_TARGET
            && let Ok(litellm) = &litellm
        {
            row.note(format!("LiteLLM {}", litellm.version));
        }
        rows.push(row);
    }
    added(&mut rows);
    if let Err(why) = &proxy
        && let Some(row) = rows.iter_mut().find(|r| r.target == TARGETS[1])
    {
        row.note(format!("LiteLLM not measured: {why}"));
    }
    Ok(rows)
}

/// Each proxy's figures less the direct ones of the same run, and LiteLLM's added TTFT p50 over agentmux's.
fn added(rows: &mut [RunResult]) {
    let Some(direct) = rows.iter().find(|r| r.target == TARGETS[0]).map(|r| r.extra.clone()) else { return };
    for row in rows.iter_mut().filter(|r| r.target != TARGETS[0]) {
        for figure in ["ttft_p50", "ttft_p99", "chunk_p50", "chunk_p99"] {
            let key = format!("{figure}_ms");
            if let (Some(mine), Some(base)) = (row.extra.get(&key), direct.get(&key)) {
                let value = mine - base;
                row.extra.insert(format!("added_{key}"), value);
            }
        }
    }
    let added_p50 = |rows: &[RunResult], target: &str| {
        rows.iter().find(|r| r.target == target).and_then(|r| r.extra.get("added_ttft_p50_ms").copied())
    };
    if let (Some(agentmux), Some(litellm)) = (added_p50(rows, TARGETS[1]), added_p50(rows, LITELLM_TARGET))
        && agentmux > 0.0
        && let Some(row) = rows.iter_mut().find(|r| r.target == LITELLM_TARGET)
    {
        row.extra.insert("added_ttft_p50_over_agentmux".into(), litellm / agentmux);
    }
}

/// What the relay's JSON report adds: the settings, LiteLLM, the targets of the issue and whether they were
/// met (from the medians).
#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    chunks: usize,
    interval_ms: f64,
    requests: usize,
    warmup: usize,
    litellm_version: Option<String>,
    litellm_missing: Option<String>,
    agentmux_added_ttft_p50_ms: Option<f64>,
    /// The same through agentmux with its upstream over HTTPS.
    agentmux_tls_added_ttft_p50_ms: Option<f64>,
    litellm_added_ttft_p50_ms: Option<f64>,
    /// LiteLLM's added TTFT p50 over agentmux's, from the medians.
    litellm_over_agentmux: Option<f64>,
    /// Target: agentmux's added TTFT p50 under 1 ms.
    added_ttft_p50_under_1ms: Option<bool>,
    /// Target: at least 5 times less than LiteLLM's.
    at_least_5x_less_than_litellm: Option<bool>,
}

fn figure(rows: &[RunResult], target: &str, key: &str) -> Option<f64> {
    rows.iter().find(|r| r.scenario == "relay" && r.target == target).and_then(|r| r.extra.get(key).copied())
}

/// The summary of the median `rows`, if the relay ran.
pub(crate) fn summary(relay: &Relay, rows: &[RunResult]) -> Option<Summary> {
    rows.iter().find(|r| r.scenario == "relay")?;
    let agentmux = figure(rows, TARGETS[1], "added_ttft_p50_ms");
    let litellm = figure(rows, LITELLM_TARGET, "added_ttft_p50_ms");
    let ratio = match (agentmux, litellm) {
        (Some(a), Some(l)) if a > 0.0 => Some(l / a),
        _ => None,
    };
    let state = LITELLM.get().cloned();
    Some(Summary {
        chunks: relay.pace.chunks,
        interval_ms: relay.pace.interval.as_secs_f64() * 1e3,
        requests: relay.requests,
        warmup: relay.warmup,
        litellm_version: state.as_ref().and_then(|s| s.as_ref().ok()).map(|l| l.version.clone()),
        litellm_missing: match (&state, litellm) {
            (Some(Err(why)), _) => Some(why.clone()),
            (_, None) => Some(if relay.no_litellm { "left out (--relay-no-litellm)" } else { "did not start" }.into()),
            _ => None,
        },
        agentmux_added_ttft_p50_ms: agentmux,
        agentmux_tls_added_ttft_p50_ms: figure(rows, TARGETS[2], "added_ttft_p50_ms"),
        litellm_added_ttft_p50_ms: litellm,
        litellm_over_agentmux: ratio,
        added_ttft_p50_under_1ms: agentmux.map(|a| a < 1.0),
        at_least_5x_less_than_litellm: match (agentmux, litellm) {
            (Some(a), Some(l)) => Some(a <= 0.0 || l / a >= 5.0),
            _ => None,
        },
    })
}

fn ms(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.3}"))
}

/// The relay's own table, from the median rows.
pub(crate) fn print_table(relay: &Relay, rows: &[RunResult], runs: usize) {
    let Some(summary) = summary(relay, rows) else { return };
    let header = [
        "target",
        "TTFT p50",
        "TTFT p99",
        "chunk p50",
        "chunk p99",
        "added TTFT p50",
        "added TTFT p99",
        "added chunk p50",
        "added chunk p99",
        "request",
        "CPU ms/req",
        "requests",
        "errors",
    ];
    let mut lines = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for row in rows.iter().filter(|r| r.scenario == "relay") {
        let get = |key: &str| row.extra.get(key).copied();
        let cpu = get("cpu_ms_per_request").map_or("-".into(), |v| format!("{v:.2}"));
        lines.push(vec![
            row.target.clone(),
            ms(get("ttft_p50_ms")),
            ms(get("ttft_p99_ms")),
            ms(get("chunk_p50_ms")),
            ms(get("chunk_p99_ms")),
            ms(get("added_ttft_p50_ms")),
            ms(get("added_ttft_p99_ms")),
            ms(get("added_chunk_p50_ms")),
            ms(get("added_chunk_p99_ms")),
            get("request_ms").map_or("-".into(), |v| format!("{v:.1}")),
            cpu,
            row.messages.to_string(),
            row.errors.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..header.len()).map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0)).collect();
    println!();
    println!(
        "relay ({} content chunks {:.1} ms apart; {} requests per target after {} warm-up, interleaved; {}; ms):",
        summary.chunks,
        summary.interval_ms,
        summary.requests,
        summary.warmup,
        if runs > 1 { format!("medians of {runs} runs") } else { "one run".into() }
    );
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(i, c)| if i == 0 { format!("{c:<w$}", w = widths[i]) } else { format!("{c:>w$}", w = widths[i]) })
            .collect();
        println!("{}", cells.join("  "));
    }
    let verdict = |met: Option<bool>| match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    match (&summary.litellm_version, &summary.litellm_missing) {
        (Some(version), None) => println!("LiteLLM {version} (litellm[proxy], one worker, its defaults)"),
        (version, Some(why)) => {
            println!("LiteLLM{} not measured: {why}", version.as_ref().map(|v| format!(" {v}")).unwrap_or_default())
        }
        (None, None) => {}
    }
    println!(
        "LiteLLM's added TTFT p50 / agentmux's: {}",
        summary.litellm_over_agentmux.map_or("-".into(), |r| format!("{r:.1}x"))
    );
    println!(
        "TLS to the upstream: agentmux-tls's added TTFT p50 {} ms against agentmux's {} ms over plain HTTP",
        ms(summary.agentmux_tls_added_ttft_p50_ms),
        ms(summary.agentmux_added_ttft_p50_ms)
    );
    println!(
        "targets: agentmux's added TTFT p50 {} ms under 1 ms: {}; at least 5x less than LiteLLM's: {}",
        ms(summary.agentmux_added_ttft_p50_ms),
        verdict(summary.added_ttft_p50_under_1ms),
        verdict(summary.at_least_5x_less_than_litellm)
    );
    println!(
        "TTFT: request written to first content chunk read; chunk: a content chunk read less the time the upstream \
         stamped in it; added: the proxy's quantile less the direct one of the same run (median over runs); request: \
         the mean time from writing a request to the end of its answer; CPU: the server process per counted \
         request (direct: the upstream, which served every target)."
    );
}

/// The keys of a relay row's figures, for the main table's notes.
pub(crate) fn notes(extra: &BTreeMap<String, f64>) -> Option<String> {
    let chunk_p50 = extra.get("chunk_p50_ms")?;
    let get = |key: &str| extra.get(key).map_or("-".into(), |v| format!("{v:.3}"));
    let mut text =
        format!("p50/p99: time to first token; per chunk p50 {chunk_p50:.3} / p99 {} ms", get("chunk_p99_ms"));
    if extra.contains_key("added_ttft_p50_ms") {
        text.push_str(&format!(
            "; added TTFT p50 {} / p99 {} ms, per chunk p50 {} / p99 {} ms",
            get("added_ttft_p50_ms"),
            get("added_ttft_p99_ms"),
            get("added_chunk_p50_ms"),
            get("added_chunk_p99_ms")
        ));
    }
    if let Some(cpu) = extra.get("cpu_ms_per_request") {
        text.push_str(&format!("; {cpu:.2} ms CPU/request"));
    }
    Some(text)
}

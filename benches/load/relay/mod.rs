//! The `relay` scenarios (issue "A relay benchmark", then "The gateway under load"): what agentmux adds to
//! the time to first token and to each chunk when it relays a fast OpenAI-compatible upstream, side by side in
//! one run with LiteLLM's proxy in front of the same upstream. Not in the default set: `./bench --relay` (or
//! `--only relay`) runs `relay` (one request at a time) and `relay-50`, `relay-200` (that many concurrent
//! streaming runs, `concurrent.rs`).
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
//!   first time), and a second one, `litellm-tls`, in front of its HTTPS side (trusting the CA through
//!   `SSL_VERIFY`). If it cannot be installed or started, a line says why and the run measures the others.
//!
//! Then, in `relay`, one client (`stream.rs`, on a thread of its own) sends streaming chat requests one at a
//! time, interleaved: the upstream directly (the baseline), agentmux, LiteLLM, again (each round starting one
//! target further on, so each follows every other as often), `warmup` rounds that are not counted, then
//! `requests` rounds that are, so noise meets every target alike. Per target: time to first
//! token (request written to first content chunk read) and per-chunk latency (chunk read less its stamp),
//! p50 and p99, exact over the samples. Added TTFT is measured request by request: that request's TTFT less
//! the upstream's own (its first chunk made less the request received, both stamped in the chunk), so a
//! slow moment of the machine is taken out of the request it slowed, not compared with another moment's
//! (the direct target's figure is the floor: the loopback hops and the client). Added per chunk is a
//! target's quantile less the direct one's of the same run (the plain upstream's, for the TLS targets too:
//! what TLS costs is part of what they add). The tables
//! (`report.rs`) show the medians over the runs of every figure, and LiteLLM's added TTFT over agentmux's.

mod concurrent;
mod litellm;
mod report;
mod stream;
mod tls;
pub(crate) mod upstream;

pub(crate) use report::{Summary, notes, print_tables, summary};

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// Streaming runs in flight at once: 1 is `relay` (one request at a time, `requests` of them, after
    /// `warmup`), more is a concurrent scenario (`concurrent.rs`: `rounds` counted rounds).
    pub(crate) concurrency: usize,
    /// Counted rounds of a concurrent scenario.
    pub(crate) rounds: usize,
}

/// The targets, in the order each round visits them.
pub(crate) const TARGETS: [&str; 5] = ["direct", "agentmux", "agentmux-tls", "litellm", "litellm-tls"];
const LITELLM_TARGET: &str = TARGETS[3];
const LITELLM_TLS_TARGET: &str = TARGETS[4];

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
    /// Per request, its TTFT less the upstream's own ([`stream::Answer::added_ttft_ns`]).
    added_ttft: Vec<u64>,
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

impl Measured {
    /// One answer (`took` nanoseconds from writing the request to its end) of `chunks` expected: its samples
    /// when `counted`, its error (counted or not) when it failed.
    fn record(&mut self, answer: io::Result<stream::Answer>, took: u64, chunks: usize, counted: bool) {
        let why = match &answer {
            Err(e) => Some(e.to_string()),
            Ok(a) if !a.done || a.chunk_ns.len() != chunks || a.ttft_ns.is_none() => {
                Some(format!("short answer: {} stamped chunks of {chunks}, [DONE] {}", a.chunk_ns.len(), a.done))
            }
            Ok(_) => None,
        };
        self.failing = if why.is_some() { self.failing + 1 } else { 0 };
        if self.failing == GIVE_UP {
            self.notes.push(format!("left out after {GIVE_UP} failures in a row"));
        }
        if let Some(why) = why {
            let why = if counted { why } else { format!("warm-up: {why}") };
            self.errors += 1;
            if self.notes.len() < 4 && !self.notes.contains(&why) {
                self.notes.push(why);
            }
        }
        if !counted {
            return;
        }
        self.requests += 1;
        self.busy_ns += took;
        if let Ok(answer) = answer {
            self.ttft.extend(answer.ttft_ns);
            self.added_ttft.extend(answer.added_ttft_ns);
            self.chunks.extend(answer.chunk_ns);
        }
    }
}

/// What a measurement gives: every target's samples and CPU over the counted part, the upstream's CPU,
/// the counted part's wall time, and the load generator's own CPU over it.
struct Outcome {
    measured: Vec<Measured>,
    upstream_cpu: procfs::Cpu,
    seconds: f64,
    load_cpu: procfs::Cpu,
    /// The load generator's CPU in cores where it was highest (a concurrent scenario's busiest visit);
    /// `None`: over the whole counted part.
    load_cores: Option<f64>,
}

/// The CPU of every target's server, the upstream's and the load generator's, and the time: taken when the
/// counted part starts and again when it ends.
struct Marks {
    targets: Vec<procfs::Cpu>,
    upstream: procfs::Cpu,
    load: procfs::Cpu,
    at: u64,
}

impl Marks {
    fn now(plan: &Plan) -> Marks {
        Marks {
            targets: plan.targets.iter().map(|(_, _, pid)| procfs::cpu_seconds(pid)).collect(),
            upstream: procfs::cpu_seconds(&plan.upstream_pid),
            load: procfs::cpu_seconds(&std::process::id().to_string()),
            at: wall_ns(),
        }
    }

    /// The outcome of `measured` since these marks.
    fn outcome(self, plan: &Plan, mut measured: Vec<Measured>) -> Outcome {
        let end = Marks::now(plan);
        for ((measured, before), after) in measured.iter_mut().zip(self.targets).zip(end.targets) {
            measured.cpu = after.since(before);
        }
        Outcome {
            measured,
            upstream_cpu: end.upstream.since(self.upstream),
            seconds: end.at.saturating_sub(self.at) as f64 / 1e9,
            load_cpu: end.load.since(self.load),
            load_cores: None,
        }
    }
}

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
    /// How long one answer streams.
    stream: Duration,
}

/// The body of every request.
fn chat_body() -> Vec<u8> {
    serde_json::json!({
        "model": MODEL,
        "stream": true,
        "messages": [{"role": "user", "content": "Say something."}],
    })
    .to_string()
    .into_bytes()
}

/// The interleaved rounds, one request at a time.
async fn measure(plan: Plan) -> Outcome {
    let body = chat_body();
    let mut clients: Vec<Client> =
        plan.targets.iter().zip(&plan.keys).map(|(&(_, addr, _), key)| Client::new(addr, key.clone())).collect();
    let mut out: Vec<Measured> = plan.targets.iter().map(|_| Measured::default()).collect();
    let mut marks = Marks::now(&plan);
    for round in 0..plan.warmup + plan.requests {
        if round == plan.warmup {
            marks = Marks::now(&plan);
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
            measured.record(answer, wall_ns().saturating_sub(began), plan.chunks, counted);
        }
    }
    marks.outcome(&plan, out)
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

/// The servers of one run: the upstream, the two agentmux and the LiteLLM proxies that started.
struct Servers {
    upstream: Server,
    agentmux: Server,
    agentmux_tls: Server,
    /// LiteLLM in front of the plain upstream and of its HTTPS side, or why not.
    litellm: [Result<Server, String>; 2],
    master_key: String,
    /// Fresh data directories, removed with the servers.
    _data: Vec<procfs::DataDir>,
}

/// Starts the servers of one run labelled `label`.
async fn start(
    relay: &Relay,
    label: &str,
    settings: &Settings,
    litellm: &Result<LiteLlm, String>,
) -> io::Result<Servers> {
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
    let data: Vec<procfs::DataDir> = if settings.store {
        vec![procfs::DataDir::fresh(label), procfs::DataDir::fresh(&format!("{label}-tls"))]
    } else {
        Vec::new()
    };
    let agentmux_in_front = |url: String, data: Option<&procfs::DataDir>, extra: Vec<std::ffi::OsString>| {
        let mut command = Command::new(&settings.agentmux);
        command.args(["--addr", "127.0.0.1:0", "--upstream-url", &url]).args(extra);
        match data {
            Some(data) => command.arg("--data-dir").arg(data.path()),
            None => command.env("AGENTMUX_EPHEMERAL", "true"),
        };
        command
    };
    let command = agentmux_in_front(format!("http://{}/v1", upstream.addr), data.first(), Vec::new());
    let agentmux =
        spawn_announcing(command, logs.join(format!("{label}-agentmux.log")), "agentmux listening", within).await?;
    let ca_file = tls_dir.join("ca.pem");
    let ca = vec!["--upstream-ca-file".into(), ca_file.clone().into_os_string()];
    let command = agentmux_in_front(format!("https://{tls_addr}/v1"), data.get(1), ca);
    let agentmux_tls =
        spawn_announcing(command, logs.join(format!("{label}-agentmux-tls.log")), "agentmux listening", within).await?;

    let master_key = format!("sk-relay-{:032x}", rand::random::<u128>());
    let proxy = |base: String, ca: Option<PathBuf>, label: String| {
        let master_key = master_key.clone();
        async move {
            match litellm {
                Ok(litellm) => litellm
                    .start(MODEL, &base, ca.as_deref(), &master_key, &label, Duration::from_secs(180))
                    .await
                    .map_err(|e| e.to_string()),
                Err(why) => Err(why.clone()),
            }
        }
    };
    let plain = proxy(format!("http://{}/v1", upstream.addr), None, label.to_owned()).await;
    let tls = proxy(format!("https://{tls_addr}/v1"), Some(ca_file), format!("{label}-tls")).await;
    for (which, proxy) in [("", &plain), (" (TLS upstream)", &tls)] {
        if let (Ok(_), Err(why)) = (litellm, proxy) {
            eprintln!("relay: LiteLLM{which} did not start in {label}: {why}");
        }
    }
    Ok(Servers { upstream, agentmux, agentmux_tls, litellm: [plain, tls], master_key, _data: data })
}

/// One run: the servers, the rounds, a row per target.
pub(crate) async fn run(relay: &Relay, name: &str, run: usize, settings: &Settings) -> io::Result<Vec<RunResult>> {
    let label = format!("{name}-run{run}");
    let litellm = litellm(relay).await;
    let servers = start(relay, &label, settings, &litellm).await?;
    let mut listed: Vec<(&'static str, &Server)> =
        vec![(TARGETS[0], &servers.upstream), (TARGETS[1], &servers.agentmux), (TARGETS[2], &servers.agentmux_tls)];
    for (target, proxy) in [LITELLM_TARGET, LITELLM_TLS_TARGET].into_iter().zip(&servers.litellm) {
        if let Ok(proxy) = proxy {
            listed.push((target, proxy));
        }
    }
    let targets: Vec<_> = listed.iter().map(|(name, server)| (*name, server.addr, server.pid().to_owned())).collect();
    let stream_s = relay.pace.interval.as_secs_f64() * relay.pace.chunks as f64;
    let concurrency = relay.concurrency;
    let is_litellm = |name: &str| name == LITELLM_TARGET || name == LITELLM_TLS_TARGET;
    let keys = targets.iter().map(|(name, _, _)| is_litellm(name).then(|| servers.master_key.clone())).collect();
    let plan = Plan {
        targets: targets.clone(),
        keys,
        upstream_pid: servers.upstream.pid().to_owned(),
        warmup: relay.warmup,
        requests: relay.requests,
        chunks: relay.pace.chunks,
        // Concurrent runs may queue behind each other in a saturated proxy: they get longer, so that a slow
        // answer is measured as slow rather than counted as an error.
        limit: Duration::from_secs_f64(10.0 + 4.0 * stream_s * concurrency.min(15) as f64),
        stream: Duration::from_secs_f64(stream_s),
    };
    let rounds = relay.rounds;
    let outcome = on_own_thread(move || async move {
        if concurrency > 1 { concurrent::measure(plan, concurrency, rounds).await } else { measure(plan).await }
    })
    .await
    .map_err(|_| io::Error::other("the relay client stopped"))?;
    let mut rows = rows(name, run, &targets, &listed, outcome);
    rows.iter_mut().for_each(|row| row.connections = concurrency);
    if let (Some(row), Err(why)) = (rows.iter_mut().find(|r| r.target == TARGETS[1]), &servers.litellm[0]) {
        row.note(format!("LiteLLM not measured: {why}"));
    }
    if let (Ok(litellm), Some(row)) = (&litellm, rows.iter_mut().find(|r| is_litellm(&r.target))) {
        row.note(format!("LiteLLM {}", litellm.version));
    }
    Ok(rows)
}

/// A row per target of one run's `outcome`.
fn rows(
    name: &str,
    run: usize,
    targets: &[(&'static str, SocketAddr, String)],
    servers: &[(&'static str, &Server)],
    mut outcome: Outcome,
) -> Vec<RunResult> {
    let seconds = outcome.seconds;
    let mut rows = Vec::new();
    for (((target, _, _), measured), (_, server)) in targets.iter().zip(outcome.measured.iter_mut()).zip(servers) {
        let direct = *target == TARGETS[0];
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
            server_cpu_s: if direct { outcome.upstream_cpu.total() } else { measured.cpu.total() },
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
        // Per request: what the path added to it (the direct target's: the loopback hops and the client).
        put("added_ttft_p50_ms", quantile_ms(&mut measured.added_ttft, 0.5));
        put("added_ttft_p99_ms", quantile_ms(&mut measured.added_ttft, 0.99));
        put("chunk_p50_ms", quantile_ms(&mut measured.chunks, 0.5));
        put("chunk_p99_ms", quantile_ms(&mut measured.chunks, 0.99));
        // The upstream served every target's requests: its CPU per request it answered.
        let served = if direct { measured.requests as f64 * targets.len() as f64 } else { measured.requests as f64 };
        put("cpu_ms_per_request", (served > 0.0).then(|| row.server_cpu_s * 1e3 / served));
        let requests = measured.requests as f64;
        put("request_ms", (requests > 0.0).then(|| measured.busy_ns as f64 / 1e6 / requests));
        // The load generator's own CPU over the counted part, in cores: it must stay well under one (its
        // client runs on one thread) for the figures to be the servers'.
        if direct {
            let overall = (seconds > 0.0).then(|| outcome.load_cpu.total() / seconds);
            put("load_cpu_cores", outcome.load_cores.or(overall));
        }
        rows.push(row);
    }
    added(&mut rows);
    rows
}

/// Each proxy's per-chunk figures less the direct ones of the same run (its added TTFT is measured per
/// request, in `rows`), and LiteLLM's added TTFT p50 and p99 over agentmux's.
fn added(rows: &mut [RunResult]) {
    let Some(direct) = rows.iter().find(|r| r.target == TARGETS[0]).map(|r| r.extra.clone()) else { return };
    for row in rows.iter_mut().filter(|r| r.target != TARGETS[0]) {
        for figure in ["chunk_p50", "chunk_p99"] {
            let key = format!("{figure}_ms");
            if let (Some(mine), Some(base)) = (row.extra.get(&key), direct.get(&key)) {
                let value = mine - base;
                row.extra.insert(format!("added_{key}"), value);
            }
        }
    }
    let get = |rows: &[RunResult], target: &str, key: &str| {
        rows.iter().find(|r| r.target == target).and_then(|r| r.extra.get(key).copied())
    };
    // Each LiteLLM beside the agentmux in front of the same upstream.
    for (litellm_target, agentmux_target) in [(LITELLM_TARGET, TARGETS[1]), (LITELLM_TLS_TARGET, TARGETS[2])] {
        for quantile in ["p50", "p99"] {
            let key = format!("added_ttft_{quantile}_ms");
            if let (Some(agentmux), Some(litellm)) = (get(rows, agentmux_target, &key), get(rows, litellm_target, &key))
                && agentmux > 0.0
                && let Some(row) = rows.iter_mut().find(|r| r.target == litellm_target)
            {
                row.extra.insert(format!("added_ttft_{quantile}_over_agentmux"), litellm / agentmux);
            }
        }
    }
}

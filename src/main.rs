//! The `agentmux` command: a thin shell over the library.
//!
//! `agentmux serve` (also what the bare command does) runs the HTTP service on its embedded defaults: no
//! config file, no other service. Every flag has an `AGENTMUX_*` environment twin. Logs go to stderr through
//! `tracing` (`RUST_LOG` sets the level; `info` by default).
//!
//! `agentmux render` reads a producer's messages (JSON Lines on standard input), validates each one, and
//! prints what a client of the chosen format receives: a way to see how an agent's output will look to a
//! CUI frontend or an OpenAI client before wiring anything up. A message that fails validation, or a delta
//! the reducer refuses, stops it with the reason and exit code 2, as a stream would refuse it.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentmux::adapter::{
    Adapter, AgUiAdapter, AgUiOptions, AnthropicAdapter, AnthropicOptions, CuiAdapter, OpenAiAdapter, OpenAiCompletion,
    OpenAiOptions, ReasoningField, ResponsesAdapter, ResponsesOptions, UiMessageAdapter, UiMessageOptions,
};
use agentmux::agent::UpstreamConfig;
use agentmux::cluster::ClusterConfig;
use agentmux::http::{KeySpec, Origins, Settings, budgets, check_key, thread_budgets};
use agentmux::hub::Limits;
use agentmux::node::{self, Node, NodeConfig, NodeError};
use agentmux::output::{Metadata, Outcome, OutputMessage, Reducer, check_name};
use agentmux::thread::ThreadConfig;
use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

/// jemalloc rather than the system's allocator: it keeps no header beside a block, so the untouched part of a
/// connection's idle buffers costs no memory; see `docs/benchmarks-history.md` (session 7).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "agentmux", version, about = "Carries the output of LLM agents to every client that watches it")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no command: serve, with these flags.
    #[command(flatten)]
    serve: Serve,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP service (the default).
    Serve(Box<Serve>),
    /// Render messages (JSON Lines on stdin) as a client of FORMAT receives them.
    Render {
        /// The wire format.
        #[arg(long, value_enum, default_value = "openai")]
        format: Format,
        /// The model name OpenAI chunks report.
        #[arg(long, default_value = "agentmux")]
        model: String,
        /// Send the usage chunk (needs --outcome with usage).
        #[arg(long)]
        include_usage: bool,
        /// Where OpenAI chunks carry reasoning.
        #[arg(long, value_enum, default_value = "reasoning-content")]
        reasoning: Reasoning,
        /// How the stream ends, as JSON: {"status": "completed" | "cancelled" | "error", "usage"?, "error"?}.
        #[arg(long)]
        outcome: Option<String>,
    },
    /// Write the contract's JSON Schemas (the output message, the outcome, the error envelope) and the
    /// OpenAPI document of every endpoint.
    Schemas {
        /// Where to write the schemas.
        #[arg(long, default_value = "docs/schemas")]
        out: std::path::PathBuf,
        /// Where to write the OpenAPI document.
        #[arg(long, default_value = "docs/openapi.json")]
        openapi: std::path::PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// The typed messages as SSE events.
    Cui,
    /// `chat.completion.chunk` SSE events.
    Openai,
    /// One non-streaming `chat.completion`.
    OpenaiJson,
    /// The Vercel AI SDK's UI message stream.
    UiMessage,
    /// AG-UI events.
    AgUi,
    /// Anthropic Messages stream events.
    Anthropic,
    /// OpenAI Responses stream events.
    Responses,
    /// The final state of every message after its deltas, as JSON Lines.
    State,
}

#[derive(Clone, Copy, ValueEnum)]
enum Reasoning {
    /// `reasoning_content`
    #[value(name = "reasoning-content")]
    Content,
    /// `reasoning`
    #[value(name = "reasoning")]
    Plain,
    /// Both.
    Both,
}

/// Where streams are kept.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Engine {
    /// The embedded store (`--data-dir`), or memory with `--ephemeral`.
    Store,
    /// Redis (`--redis-url`), shared by every node.
    Redis,
}

#[derive(clap::Args)]
struct Serve {
    /// Address to listen on.
    #[arg(long, env = "AGENTMUX_ADDR", default_value = "127.0.0.1:8080")]
    addr: String,
    /// A `: ping` after this long without an event (0s: no pings).
    #[arg(long, env = "AGENTMUX_KEEP_ALIVE", default_value = "15s", value_parser = humantime::parse_duration)]
    keep_alive: Duration,
    /// How long an ended stream stays readable [default: 24h with the store, 10m with --ephemeral].
    #[arg(long, env = "AGENTMUX_RETENTION", value_parser = humantime::parse_duration)]
    retention: Option<Duration>,
    /// Where the store keeps streams, threads and the audit log (created on first start).
    #[arg(long, env = "AGENTMUX_DATA_DIR", default_value = "agentmux-data")]
    data_dir: std::path::PathBuf,
    /// Keep everything in memory only: a restart loses every stream and thread.
    #[arg(long, env = "AGENTMUX_EPHEMERAL")]
    ephemeral: bool,
    /// Where streams are kept: the embedded store (one node), or Redis, through which any number of nodes
    /// serve the same streams.
    #[arg(long, env = "AGENTMUX_ENGINE", value_enum, default_value = "store")]
    engine: Engine,
    /// The Redis server of `--engine redis`.
    #[arg(long, env = "AGENTMUX_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// With `--engine redis` and a `rediss://` URL: the CA (PEM) the Redis server's certificate chains to
    /// [default: the system's roots].
    #[arg(long, env = "AGENTMUX_REDIS_CA_FILE")]
    redis_ca_file: Option<std::path::PathBuf>,
    /// The URL other nodes reach this one at, with `--engine redis` [default: http:// and the address
    /// listened on].
    #[arg(long, env = "AGENTMUX_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// With `--engine redis`, how long a stream written on another node stays followed here once no client
    /// of this node uses it (a later request follows it again).
    #[arg(long, env = "AGENTMUX_DROP_FOLLOWED_AFTER", default_value = "30s", value_parser = humantime::parse_duration)]
    drop_followed_after: Duration,
    /// With `--engine redis`, how long a node's lease in Redis lasts unless renewed (renewed five times as
    /// often); the same on every node. A writer whose lease lapsed is taken for dead, and a node that has no
    /// answer from Redis for this long tells the readers of the streams it follows `lagged`.
    #[arg(long, env = "AGENTMUX_REDIS_LEASE", default_value = "5s", value_parser = lease_duration)]
    redis_lease: Duration,
    /// With `--engine redis`, how long an append Redis does not take is tried before its stream ends with the
    /// error `store_unavailable` (what Redis did not take is still written, in order, once it is back).
    #[arg(long, env = "AGENTMUX_REDIS_WRITE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    redis_write_timeout: Duration,
    /// The largest request body in bytes.
    #[arg(long, env = "AGENTMUX_BODY_LIMIT", default_value_t = 8 << 20)]
    body_limit: usize,
    /// The largest WebSocket message from a client, in bytes.
    #[arg(long, env = "AGENTMUX_WS_MAX_MESSAGE", default_value_t = 1 << 20)]
    ws_max_message: usize,
    /// The model (agent) a chat request without one gets (at most 256 bytes).
    #[arg(long, env = "AGENTMUX_DEFAULT_MODEL", default_value = "demo")]
    default_model: String,
    /// On shutdown, how long open streams get to finish (producers may still append and end them).
    #[arg(long, env = "AGENTMUX_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
    /// On shutdown, after the grace, how long connections get to send what they owe before they are dropped.
    #[arg(long, env = "AGENTMUX_SHUTDOWN_DRAIN", default_value = "5s", value_parser = humantime::parse_duration)]
    shutdown_drain: Duration,
    /// An open stream with no append for this long ends with the error `idle_timeout` (0s: never).
    #[arg(long, env = "AGENTMUX_IDLE_TIMEOUT", default_value = "10m", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// How long a request body may take to arrive before the request is refused (408).
    #[arg(long, env = "AGENTMUX_BODY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    body_timeout: Duration,
    /// The most streams held at once, open or retained.
    #[arg(long, env = "AGENTMUX_MAX_STREAMS", default_value_t = 100_000)]
    max_streams: usize,
    /// The most messages one stream holds, its own lifecycle events included (at least 2).
    #[arg(long, env = "AGENTMUX_MAX_STREAM_MESSAGES", default_value_t = Limits::default().messages_per_stream as u64,
          value_parser = clap::value_parser!(u64).range(2..))]
    max_stream_messages: u64,
    /// The most bytes of messages (as JSON) one stream holds (at least 65536).
    #[arg(long, env = "AGENTMUX_MAX_STREAM_BYTES", default_value_t = Limits::default().stream_bytes,
          value_parser = clap::value_parser!(u64).range(65_536..))]
    max_stream_bytes: u64,
    /// The largest message, as JSON once stamped (at least 4096).
    #[arg(long, env = "AGENTMUX_MAX_MESSAGE_BYTES", default_value_t = Limits::default().message_bytes,
          value_parser = clap::value_parser!(u64).range(4096..))]
    max_message_bytes: u64,
    /// The most bytes of messages the service holds in memory, in every stream and every format in use (at
    /// least 1048576).
    #[arg(long, env = "AGENTMUX_MAX_HUB_BYTES", default_value_t = Limits::default().hub_bytes,
          value_parser = clap::value_parser!(u64).range(1 << 20..))]
    max_hub_bytes: u64,
    /// The most streams one client (its API key; without keys its peer address, an IPv6 /64) may hold at
    /// once, open or ended until evicted; past it, its oldest ended stream is evicted [default: a tenth of
    /// --max-streams].
    #[arg(long, env = "AGENTMUX_CLIENT_STREAMS")]
    client_streams: Option<usize>,
    /// The most streams one client may create in a minute (0: no limit).
    #[arg(long, env = "AGENTMUX_CLIENT_STREAMS_PER_MINUTE", default_value_t = 0)]
    client_streams_per_minute: u32,
    /// The most connections served at once; one more is answered 503 [default: nine tenths of the open-file
    /// limit, which is raised to its hard limit at start].
    #[arg(long, env = "AGENTMUX_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// The most connections one client address (an IPv6 /64) holds at once, whatever they do (request heads
    /// arriving, idle keep-alive, event streams, WebSockets); one more is answered 429 [default: a tenth of
    /// --max-connections, at least 64].
    #[arg(long, env = "AGENTMUX_CONNECTIONS_PER_CLIENT", value_parser = clap::value_parser!(u64).range(1..))]
    connections_per_client: Option<u64>,
    /// How long a connection gets to send a request's head, from when it opens or its previous response
    /// ended: a slow head, and an idle keep-alive connection, are closed after it.
    #[arg(long, env = "AGENTMUX_HEAD_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    head_timeout: Duration,
    /// A WebSocket is pinged this often (0s: never, and no idle timeout either).
    #[arg(long, env = "AGENTMUX_WS_PING_INTERVAL", default_value = "20s", value_parser = humantime::parse_duration)]
    ws_ping_interval: Duration,
    /// A WebSocket from which nothing (no pong, no frame) arrived for this long is closed with 1008 (longer
    /// than --ws-ping-interval).
    #[arg(long, env = "AGENTMUX_WS_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    ws_idle_timeout: Duration,
    /// A server-side thread unused this long is evicted (0s: never).
    #[arg(long, env = "AGENTMUX_THREAD_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    thread_ttl: Duration,
    /// The most server-side threads kept at once.
    #[arg(long, env = "AGENTMUX_MAX_THREADS", default_value_t = 100_000)]
    max_threads: usize,
    /// The most server-side threads one client (as for --client-streams) may keep at once [default: a tenth
    /// of --max-threads].
    #[arg(long, env = "AGENTMUX_CLIENT_THREADS")]
    client_threads: Option<usize>,
    /// An OpenAI-compatible model server (its base URL, ending in /v1): every model no built-in agent has goes
    /// there.
    #[arg(long, env = "AGENTMUX_UPSTREAM_URL")]
    upstream_url: Option<String>,
    /// A named upstream, NAME=URL (repeatable; the variable takes several, comma-separated): a request for
    /// NAME/model goes to it, asking for model. Its key is read from AGENTMUX_UPSTREAM_<NAME>_KEY (NAME
    /// upper-cased, other characters as _); the --upstream-* timeouts and CA apply to it.
    #[arg(long = "upstream", env = "AGENTMUX_UPSTREAMS", value_delimiter = ',', value_name = "NAME=URL")]
    upstreams: Vec<String>,
    /// A TOML file of upstreams (kind, url, key_env, ca_file, timeouts, headers, models, text_mode) and
    /// aliases (a model, or several tried in order); see docs/providers.md.
    #[arg(long, env = "AGENTMUX_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// The upstream's API key (sent as a bearer token; never logged). Prefer the environment variable.
    #[arg(long, env = "AGENTMUX_UPSTREAM_KEY", hide_env_values = true)]
    upstream_key: Option<String>,
    /// The upstream's models, comma-separated [default: read from its GET /models at start, and every 5 min].
    #[arg(long, env = "AGENTMUX_UPSTREAM_MODELS", value_delimiter = ',')]
    upstream_models: Option<Vec<String>>,
    /// Models without native tool calling, comma-separated: they get text-mode tool instructions.
    #[arg(long, env = "AGENTMUX_UPSTREAM_TEXT_MODE", value_delimiter = ',')]
    upstream_text_mode: Vec<String>,
    /// A private CA (PEM) the upstream's certificate may chain to, trusted beside the bundled web PKI roots
    /// and the system's. The proxy is the environment's (HTTPS_PROXY, HTTP_PROXY, NO_PROXY).
    #[arg(long, env = "AGENTMUX_UPSTREAM_CA_FILE")]
    upstream_ca_file: Option<std::path::PathBuf>,
    /// How long connecting to the upstream may take.
    #[arg(long, env = "AGENTMUX_UPSTREAM_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    upstream_connect_timeout: Duration,
    /// How long the upstream may take to send the first byte of an answer.
    #[arg(long, env = "AGENTMUX_UPSTREAM_FIRST_BYTE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    upstream_first_byte_timeout: Duration,
    /// How long the upstream may pause between chunks.
    #[arg(long, env = "AGENTMUX_UPSTREAM_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    upstream_idle_timeout: Duration,
    /// How many times the model is asked in one run (the tool loop's rounds).
    #[arg(long, env = "AGENTMUX_MAX_TOOL_ROUNDS", default_value_t = 25)]
    max_tool_rounds: usize,
    /// How long one tool the service runs may take.
    #[arg(long, env = "AGENTMUX_TOOL_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    tool_timeout: Duration,
    /// An API key callers must send (`Authorization: Bearer <key>`); repeat it for several. With none, the
    /// service serves loopback only. The variable takes several, comma-separated.
    #[arg(long = "api-key", env = "AGENTMUX_API_KEYS", value_delimiter = ',', hide_env_values = true)]
    api_keys: Vec<String>,
    /// A file of API keys, one per line: the key, then optionally `name=`, `streams=` (held at once),
    /// `streams_per_minute=` (created, runs included), `threads=` (kept at once) and `connections=`
    /// (requests in flight, WebSockets included); blank lines and lines starting with `#` are skipped.
    #[arg(long, env = "AGENTMUX_API_KEYS_FILE")]
    api_keys_file: Option<std::path::PathBuf>,
    /// Serve addresses other than loopback without API keys: anyone who reaches the service may then do
    /// anything with it.
    #[arg(long, env = "AGENTMUX_INSECURE_NO_AUTH")]
    insecure_no_auth: bool,
    /// An origin whose pages may call the service from a browser (`https://app.example.com`); repeat it for
    /// several, or `*` to let any page read (not write). The variable takes several, comma-separated.
    #[arg(long = "cors-origin", env = "AGENTMUX_CORS_ORIGINS", value_delimiter = ',')]
    cors_origins: Vec<String>,
    /// How log lines look: `text` for people, `json` (one object per line) for collectors.
    #[arg(long, env = "AGENTMUX_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// How log lines look.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the request's span fields.
    Json,
}

/// The keys from `--api-key` and `--api-keys-file`, each checked.
/// `--redis-lease`: a duration of at least half a second (a shorter lease would lapse under ordinary delays).
fn lease_duration(text: &str) -> Result<Duration, String> {
    let lease = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if lease < Duration::from_millis(500) {
        return Err("a lease shorter than 500ms would lapse under ordinary delays".into());
    }
    Ok(lease)
}

fn api_keys(serve: &Serve) -> Result<Vec<KeySpec>, String> {
    let mut keys = Vec::new();
    for (index, key) in serve.api_keys.iter().enumerate() {
        check_key(key.trim()).map_err(|e| format!("API key {}: {e}", index + 1))?;
        keys.push(KeySpec::from(key.trim()));
    }
    if let Some(path) = &serve.api_keys_file {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("reading the keys file {}: {e}", path.display()))?;
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let spec: KeySpec = line.parse().map_err(|e| format!("{} line {}: {e}", path.display(), number + 1))?;
            keys.push(spec);
        }
        if keys.is_empty() {
            return Err(format!("the keys file {} holds no key", path.display()));
        }
    }
    let mut names: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("two API keys are named {}: a name is a key's budget, so names differ", twice[0]));
    }
    Ok(keys)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve(Box::new(cli.serve)));
    match command {
        Command::Serve(serve) => run_serve(*serve),
        Command::Render { format, model, include_usage, reasoning, outcome } => {
            render_command(format, model, include_usage, reasoning, outcome)
        }
        Command::Schemas { out, openapi } => write_schemas(&out, &openapi),
    }
}

fn write_schemas(out: &std::path::Path, openapi: &std::path::Path) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(out) {
        return fail(&format!("creating {}: {e}", out.display()));
    }
    let schemas = agentmux::schema::schemas().into_iter().map(|(name, schema)| (out.join(name), schema));
    for (path, document) in schemas.chain([(openapi.to_owned(), agentmux::http::openapi_json())]) {
        if let Err(e) = std::fs::write(&path, agentmux::schema::render(&document)) {
            return fail(&format!("writing {}: {e}", path.display()));
        }
        println!("{}", path.display());
    }
    ExitCode::SUCCESS
}

fn run_serve(serve: Serve) -> ExitCode {
    // A model name is bounded: a default no stream could report would refuse every chat without a model.
    if let Err(error) = check_name("--default-model", &serve.default_model) {
        return fail(&error.to_string());
    }
    // Dropped when serving ends: what is still buffered is written then.
    let (log, _log_flush) = agentmux::logs::LogBuffer::stderr();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(log);
    match serve.log_format {
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => logs.json().with_current_span(true).with_span_list(false).init(),
    }
    let runtime = match agentmux::http::runtime() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("starting the runtime: {e}")),
    };
    let api_keys = match api_keys(&serve) {
        Ok(keys) => keys,
        Err(e) => return fail(&e),
    };
    let cors_origins = match Origins::new(&serve.cors_origins) {
        Ok(origins) => origins,
        Err(e) => return fail(&e),
    };
    let open_files = raise_open_file_limit();
    runtime.block_on(async move {
        // Checked before binding: without keys, nothing but loopback is ever listened on.
        let loopback = match tokio::net::lookup_host(&serve.addr).await {
            Ok(mut addresses) => addresses.all(|a| a.ip().is_loopback()),
            Err(e) => return fail(&format!("listening on {}: {e}", serve.addr)),
        };
        if api_keys.is_empty() && !loopback && !serve.insecure_no_auth {
            return fail(&format!(
                "{} is not a loopback address and no API key is set: anyone who reaches it could read, write \
                 and end every stream. Add --api-key <key> (or --api-keys-file), or --insecure-no-auth to serve \
                 it open anyway",
                serve.addr
            ));
        }
        let listener = match agentmux::node::listen(&serve.addr).await {
            Ok(listener) => listener,
            Err(e) => return fail(&format!("listening on {}: {e}", serve.addr)),
        };
        let config = match node_config(&serve, &listener, api_keys, cors_origins, open_files) {
            Ok(config) => config,
            Err(e) => return fail(&e),
        };
        let (max_connections, connections_per_client) =
            (config.settings.max_connections, config.settings.client_connections());
        let node = match Node::open(config).await {
            Ok(node) => node,
            Err(e @ NodeError::Store(_)) => return fail(&format!("{e} (use --ephemeral to run without a store)")),
            Err(e) => return fail(&e.to_string()),
        };
        let app = node.app();
        if !app.agents.contains(&serve.default_model) {
            tracing::warn!(
                default_model = serve.default_model,
                "--default-model names no agent: a chat request without a model will get 404 model_not_found"
            );
        }
        let address = listener.local_addr().map(|a| a.to_string()).unwrap_or(serve.addr.clone());
        tracing::info!(
            %address,
            models = ?app.agents.names(),
            open_files,
            max_connections,
            connections_per_client,
            "agentmux listening"
        );
        if !app.credentials.keyed() {
            if loopback {
                tracing::info!(
                    "no API key: serving loopback only, open to any local caller (add --api-key <key> to require one)"
                );
            } else {
                tracing::warn!("no API key and --insecure-no-auth: anyone who reaches this address may do anything");
            }
        }
        match node.serve(listener, shutdown_signal()).await {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("serving: {e}")),
        }
    })
}

/// The node the flags describe: `--engine`, `--data-dir`/`--ephemeral`, the hub's limits, the settings, the
/// upstream. `listener` is where this node listens (the URL other nodes reach it at defaults to it).
fn node_config(
    serve: &Serve,
    listener: &tokio::net::TcpListener,
    api_keys: Vec<KeySpec>,
    cors_origins: Origins,
    open_files: u64,
) -> Result<NodeConfig, String> {
    let engine = match serve.engine {
        Engine::Redis => {
            let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or(serve.addr.clone());
            let unspecified = listener.local_addr().is_ok_and(|a| a.ip().is_unspecified());
            if serve.advertise_url.is_none() && unspecified {
                tracing::warn!(
                    "listening on {bound} without --advertise-url: other nodes would be sent to http://{bound}, \
                     which they cannot reach; set --advertise-url to the URL they reach this node at"
                );
            }
            // Its idle timeout and retention are the hub's: the node sets them when it opens.
            node::Engine::Redis(ClusterConfig {
                redis_url: serve.redis_url.clone(),
                ca_pem: read_ca("--redis-ca-file", serve.redis_ca_file.as_deref())?,
                advertise_url: serve.advertise_url.clone().unwrap_or_else(|| format!("http://{bound}")),
                idle_timeout: serve.idle_timeout,
                retention: Duration::ZERO,
                let_go_after: serve.drop_followed_after,
                lease: serve.redis_lease,
                write_timeout: serve.redis_write_timeout,
            })
        }
        Engine::Store if serve.ephemeral => node::Engine::Memory,
        Engine::Store => node::Engine::Store(serve.data_dir.clone()),
    };
    check_connection_timeouts(serve)?;
    let mut config = NodeConfig::new(engine);
    let streams_per_client = serve.client_streams.unwrap_or((serve.max_streams / 10).max(1));
    let threads_per_client = serve.client_threads.unwrap_or((serve.max_threads / 10).max(1));
    config.hub.limits = Limits {
        message_bytes: serve.max_message_bytes,
        messages_per_stream: usize::try_from(serve.max_stream_messages).unwrap_or(usize::MAX),
        stream_bytes: serve.max_stream_bytes,
        hub_bytes: serve.max_hub_bytes,
        streams: serve.max_streams,
        streams_per_client,
        streams_per_client_per_minute: serve.client_streams_per_minute,
        // A key with a budget of its own in the keys file: the hub counts its streams by its name.
        client_budgets: budgets(&api_keys, streams_per_client, serve.client_streams_per_minute),
    };
    if let Some(retention) = serve.retention {
        config.hub.retention = retention;
    }
    config.hub.idle_timeout = serve.idle_timeout;
    config.settings = Settings {
        keep_alive: serve.keep_alive,
        body_limit: serve.body_limit,
        body_timeout: serve.body_timeout,
        max_connections: serve.max_connections.unwrap_or_else(|| connections_for(open_files)),
        connections_per_client: serve.connections_per_client.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        head_timeout: serve.head_timeout,
        ws_ping_interval: serve.ws_ping_interval,
        ws_idle_timeout: serve.ws_idle_timeout,
        ws_max_message: serve.ws_max_message,
        shutdown_grace: serve.shutdown_grace,
        shutdown_drain: serve.shutdown_drain,
        default_model: serve.default_model.clone(),
        threads: ThreadConfig {
            ttl: serve.thread_ttl,
            max_threads: serve.max_threads,
            threads_per_client,
            client_budgets: thread_budgets(&api_keys),
            ..ThreadConfig::default()
        },
        api_keys,
        // Opened beyond loopback without keys on purpose: every name it is reached by is its own.
        cors_origins: if serve.insecure_no_auth { cors_origins.any_host() } else { cors_origins },
    };
    add_upstreams(&mut config, serve)?;
    Ok(config)
}

/// The upstreams of the flags (`--upstream-url`, the unnamed one; `--upstream NAME=URL`) and of the config
/// file into `config`; the `--upstream-*` timeouts, CA and tool limits are every upstream's defaults. A name
/// defined twice (by two flags, or by a flag and the file) is an error.
fn add_upstreams(config: &mut NodeConfig, serve: &Serve) -> Result<(), String> {
    let defaults = UpstreamConfig {
        connect_timeout: serve.upstream_connect_timeout,
        first_byte_timeout: serve.upstream_first_byte_timeout,
        idle_timeout: serve.upstream_idle_timeout,
        ca_pem: read_ca("--upstream-ca-file", serve.upstream_ca_file.as_deref())?,
        max_rounds: serve.max_tool_rounds,
        tool_timeout: serve.tool_timeout,
        ..UpstreamConfig::new("")
    };
    config.upstream = serve.upstream_url.as_ref().map(|url| UpstreamConfig {
        base_url: url.clone(),
        key: serve.upstream_key.clone().filter(|k| !k.is_empty()),
        models: serve.upstream_models.clone(),
        text_mode: serve.upstream_text_mode.clone(),
        ..defaults.clone()
    });
    for flag in &serve.upstreams {
        let Some((name, url)) = flag.split_once('=').filter(|(name, url)| !name.is_empty() && !url.is_empty()) else {
            return Err(format!("--upstream {flag:?}: expected NAME=URL"));
        };
        if !url.starts_with("http://") && !url.starts_with("https://") {
            return Err(format!("--upstream {name}={url}: the URL is not http:// or https://"));
        }
        let key = std::env::var(node::key_variable(name)).ok().filter(|k| !k.is_empty());
        let upstream = UpstreamConfig { base_url: url.to_owned(), key, ..defaults.clone() };
        if config.upstreams.insert(name.to_owned(), upstream).is_some() {
            return Err(format!("--upstream {name}: the upstream {name:?} is defined twice"));
        }
    }
    if let Some(path) = &serve.config {
        let file = node::ConfigFile::read(path, &defaults)?;
        for (name, upstream) in file.upstreams {
            if config.upstreams.insert(name.clone(), upstream).is_some() {
                return Err(format!("{}: the upstream {name:?} is defined twice (also by --upstream)", path.display()));
            }
        }
        config.aliases = file.aliases;
    }
    Ok(())
}

/// The connection timeouts make sense together: a head gets some time, and a WebSocket that is pinged is
/// pinged before it is given up on.
fn check_connection_timeouts(serve: &Serve) -> Result<(), String> {
    if serve.head_timeout.is_zero() {
        return Err("--head-timeout must be more than 0s: a client needs time to send a request".into());
    }
    if !serve.ws_ping_interval.is_zero() && serve.ws_idle_timeout <= serve.ws_ping_interval {
        return Err(format!(
            "--ws-idle-timeout ({}) must be longer than --ws-ping-interval ({}): a client answers a ping only \
             after it is sent",
            humantime::format_duration(serve.ws_idle_timeout),
            humantime::format_duration(serve.ws_ping_interval)
        ));
    }
    Ok(())
}

/// The bytes of the CA file `flag` names, if it names one; a file that cannot be read is an error naming it.
/// (What the file holds is checked where it is used: the upstream's client and the Redis client refuse a file
/// without a PEM certificate.)
fn read_ca(flag: &str, path: Option<&std::path::Path>) -> Result<Option<Vec<u8>>, String> {
    path.map(|path| std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))).transpose()
}

/// Raises the soft limit on open files to the hard one (1,024 by default on Linux, a few hundred stalled
/// connections' worth); returns the limit now in force.
fn raise_open_file_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(error) => {
            tracing::warn!(%error, "the open-file limit could not be raised");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
        }
    }
}

/// The default connection cap: nine tenths of the open-file limit, leaving the rest (at least 64) for
/// everything else the process opens.
fn connections_for(open_files: u64) -> usize {
    let spare = (open_files / 10).max(64);
    open_files.saturating_sub(spare).max(16) as usize
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

fn render_command(
    format: Format,
    model: String,
    include_usage: bool,
    reasoning: Reasoning,
    outcome: Option<String>,
) -> ExitCode {
    let outcome = match outcome.as_deref().map(serde_json::from_str::<Outcome>).transpose() {
        Ok(outcome) => outcome.unwrap_or_default(),
        Err(e) => return fail(&format!("--outcome: {e}")),
    };
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut options = OpenAiOptions::new(format!("chatcmpl-{created}"), created, model);
    options.include_usage = include_usage;
    options.reasoning = match reasoning {
        Reasoning::Content => ReasoningField::ReasoningContent,
        Reasoning::Plain => ReasoningField::Reasoning,
        Reasoning::Both => ReasoningField::Both,
    };

    let mut messages = Vec::new();
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let line = match line {
            Ok(line) => line,
            Err(e) => return fail(&format!("reading stdin: {e}")),
        };
        if line.trim().is_empty() {
            continue;
        }
        match OutputMessage::from_json(&line) {
            Ok(mut message) => {
                let trace_id = message.metadata.take().and_then(|m| m.trace_id);
                message.metadata =
                    Some(Metadata { sequence: Some(messages.len() as u64 + 1), timestamp: None, trace_id });
                messages.push(message);
            }
            Err(e) => return fail(&format!("line {}: {e}", i + 1)),
        }
    }

    // Refuse what a stream would refuse: a delta that cannot apply.
    let mut reducer = Reducer::default();
    for (i, message) in messages.iter().enumerate() {
        if let Err(e) = reducer.apply(message) {
            return fail(&format!("message {}: {e}", i + 1));
        }
    }

    let mut out = Vec::new();
    match format {
        Format::Cui => render(&mut CuiAdapter, &messages, &outcome, &mut out),
        Format::Openai => render(&mut OpenAiAdapter::new(options), &messages, &outcome, &mut out),
        Format::Responses => {
            let options = ResponsesOptions { id: format!("resp_{created}"), created_at: created, model: options.model };
            render(&mut ResponsesAdapter::new(options), &messages, &outcome, &mut out);
        }
        Format::Anthropic => {
            let options = AnthropicOptions { id: format!("msg_{created}"), model: options.model };
            render(&mut AnthropicAdapter::new(options), &messages, &outcome, &mut out);
        }
        Format::AgUi => {
            let options = AgUiOptions { thread_id: format!("thread-{created}"), run_id: format!("run-{created}") };
            render(&mut AgUiAdapter::new(options), &messages, &outcome, &mut out);
        }
        Format::UiMessage => {
            let options = UiMessageOptions { message_id: format!("msg-{created}") };
            render(&mut UiMessageAdapter::new(options), &messages, &outcome, &mut out);
        }
        Format::OpenaiJson => {
            let mut completion = OpenAiCompletion::new(options);
            messages.iter().for_each(|m| completion.push(m));
            let body = completion.finish(&outcome).unwrap_or_else(|error| error.to_json());
            out.extend_from_slice(&body);
            out.push(b'\n');
        }
        Format::State => {
            for state in reducer.messages() {
                match serde_json::to_vec(state) {
                    Ok(json) => out.extend_from_slice(&json),
                    Err(e) => return fail(&e.to_string()),
                }
                out.push(b'\n');
            }
        }
    }
    match std::io::stdout().lock().write_all(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("writing stdout: {e}")),
    }
}

fn render(adapter: &mut dyn Adapter, messages: &[OutputMessage], outcome: &Outcome, out: &mut Vec<u8>) {
    let mut frames = Vec::new();
    for message in messages {
        adapter.push(message, &mut frames);
    }
    adapter.finish(outcome, &mut frames);
    frames.iter().for_each(|frame| out.extend_from_slice(&agentmux::render::encode_sse(frame)));
}

fn fail(message: &str) -> ExitCode {
    eprintln!("agentmux: {message}");
    ExitCode::from(2)
}

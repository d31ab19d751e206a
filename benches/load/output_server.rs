//! The in-process producer of the token-streaming scenarios: agentmux's HTTP service, built from the
//! library as `agentmux --ephemeral` builds it, in a child process of its own (`load --output-server`), in
//! which text deltas are emitted through an [`Output`] handle one at a time, as an agent emits them, instead
//! of arriving over HTTP. Comparing it with the same load posted one message per POST shows what a message
//! costs apart from HTTP.
//!
//! The load generator creates the stream and subscribes over HTTP as usual, then asks for the deltas on the
//! server's standard input: `emit <stream id> <messages> <deltas per message> <clock base>` (the clock base:
//! the load generator's [`crate::client::now_ns`] zero, in nanoseconds of the system clock, so the latency
//! stamps in the deltas are on its clock). The server emits them, yielding to the runtime after each one
//! (as an agent awaiting its next token does), ends the stream and answers one line on standard output:
//! `emitted <messages> <first ns> <last ns>`, or `failed <why>`.

use std::io::{self, BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentmux::agent::Output;
use agentmux::hub::Hub;
use agentmux::node::{Engine, Node, NodeConfig};
use agentmux::output::Outcome;

use crate::procfs::Server;
use crate::scenarios::FILLER;

/// Nanoseconds of the system clock.
fn system_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The load generator's clock zero on the system clock: what `emit` passes.
pub(crate) fn clock_base() -> u64 {
    system_ns().saturating_sub(crate::client::now_ns())
}

/// What one `emit` did.
#[derive(Debug, Default)]
pub(crate) struct Emitted {
    pub(crate) messages: u64,
    pub(crate) first_ns: u64,
    pub(crate) last_ns: u64,
}

/// Emits `messages` text deltas onto stream `id` through an [`Output`], a new message every
/// `deltas_per_message`, then ends the stream completed.
async fn emit(hub: Hub, id: String, messages: usize, deltas_per_message: usize, base: u64) -> Result<Emitted, String> {
    let stream = hub.get(&id).ok_or_else(|| format!("no stream {id}"))?;
    let output = Output::new(stream);
    let now = || system_ns().saturating_sub(base);
    let mut out = Emitted { first_ns: now(), ..Emitted::default() };
    let mut message = output.stream_text();
    for i in 0..messages {
        if i > 0 && i % deltas_per_message.max(1) == 0 {
            message.end().map_err(|e| format!("message end: {e}"))?;
            message = output.stream_text();
        }
        message.append(format!("@@{:013} {FILLER}", now())).map_err(|e| format!("append: {e}"))?;
        out.messages += 1;
        tokio::task::yield_now().await;
    }
    message.end().map_err(|e| format!("message end: {e}"))?;
    out.last_ns = now();
    output.stream().end(Outcome::completed());
    Ok(out)
}

/// Answers the load generator's `emit` lines until its standard input closes. Each emit runs as a task on
/// the service's runtime, as an agent's run does.
fn commands(hub: Hub, runtime: tokio::runtime::Handle) {
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { return };
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["emit", id, messages, per_message, base] => match (messages.parse(), per_message.parse(), base.parse()) {
                (Ok(messages), Ok(per_message), Ok(base)) => {
                    let task = runtime.spawn(emit(hub.clone(), id.to_string(), messages, per_message, base));
                    match runtime.block_on(task) {
                        Ok(Ok(e)) => format!("emitted {} {} {}", e.messages, e.first_ns, e.last_ns),
                        Ok(Err(why)) => format!("failed {why}"),
                        Err(e) => format!("failed the emitting task: {e}"),
                    }
                }
                _ => format!("failed bad numbers in {line:?}"),
            },
            _ => format!("failed unknown command {line:?}"),
        };
        let mut stdout = io::stdout().lock();
        if writeln!(stdout, "{answer}").and_then(|()| stdout.flush()).is_err() {
            return;
        }
    }
}

/// `load --output-server --addr A`: serves agentmux's API on `A` and emits on command until killed.
pub(crate) fn main(addr: &str) -> ExitCode {
    // As agentmux logs: `RUST_LOG`, `info` by default, to stderr (the run's log file).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(io::stderr)
        .with_ansi(false)
        .init();
    let addr: SocketAddr = match addr.parse() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("output server: bad --addr {addr}: {e}");
            return ExitCode::from(2);
        }
    };
    let open_files = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024);
    // The service's own runtime (its allocator is the load generator's: the system's).
    let runtime = match agentmux::http::runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("output server: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async move {
        // As agentmux listens (a backlog of 4,096).
        let listener = match agentmux::node::listen(&addr.to_string()).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("output server: listening on {addr}: {e}");
                return ExitCode::from(2);
            }
        };
        // agentmux `--ephemeral`'s node: in memory, ended streams kept 10 minutes, as many connections as
        // the open-file limit leaves room for.
        let mut config = NodeConfig::new(Engine::Memory);
        let spare = (open_files / 10).max(64);
        config.settings.max_connections = open_files.saturating_sub(spare).max(16) as usize;
        // The load comes from a few loopback addresses: any of them may hold the whole cap.
        config.settings.connections_per_client = Some(config.settings.max_connections);
        let node = match Node::open(config).await {
            Ok(node) => node,
            Err(e) => {
                eprintln!("output server: {e}");
                return ExitCode::from(2);
            }
        };
        let hub = node.hub().clone();
        let handle = tokio::runtime::Handle::current();
        std::thread::spawn(move || commands(hub, handle));
        match node.serve(listener, std::future::pending()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("output server: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The load generator's end of a running output server: its standard input and output.
pub(crate) struct Emitter {
    commands: ChildStdin,
    answers: BufReader<ChildStdout>,
}

impl Emitter {
    /// Asks for `messages` deltas onto stream `id` and waits until they are emitted and the stream ended
    /// (once per server: a run's).
    pub(crate) async fn emit(
        mut self,
        id: &str,
        messages: usize,
        deltas_per_message: usize,
    ) -> Result<Emitted, String> {
        let command = format!("emit {id} {messages} {deltas_per_message} {}\n", clock_base());
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            self.commands
                .write_all(command.as_bytes())
                .and_then(|()| self.commands.flush())
                .and_then(|()| self.answers.read_line(&mut line))
                .map(|_| line)
        })
        .await
        .map_err(|e| format!("emit: {e}"))?
        .map_err(|e| format!("emit: {e}"))?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["emitted", messages, first, last] => match (messages.parse(), first.parse(), last.parse()) {
                (Ok(messages), Ok(first_ns), Ok(last_ns)) => Ok(Emitted { messages, first_ns, last_ns }),
                _ => Err(format!("emit: bad answer {:?}", line.trim())),
            },
            ["failed", ..] => Err(format!("emit: {}", line.trim())),
            _ => Err(format!("emit: no answer ({:?})", line.trim())),
        }
    }
}

/// Starts the output server (this executable, `--output-server`) on a free loopback port and waits until
/// it serves; the server is killed when dropped, like the others.
pub(crate) async fn start(label: &str) -> io::Result<(Server, Emitter)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let logs = PathBuf::from("target/bench/logs");
    std::fs::create_dir_all(&logs)?;
    let log = std::fs::File::create(logs.join(format!("{label}-output.log")))?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--output-server")
        .arg("--addr")
        .arg(addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()?;
    let (Some(commands), Some(answers)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(io::Error::other("the output server's standard input and output were not piped"));
    };
    let mut server = Server::adopt(child, addr);
    server.wait_healthy("output server", Duration::from_secs(10)).await?;
    Ok((server, Emitter { commands, answers: BufReader::new(answers) }))
}

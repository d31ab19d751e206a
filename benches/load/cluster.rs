//! The cluster scenarios: agentmux nodes started with `--engine redis` sharing one `redis-server`, so one
//! node against three can be read side by side in one run.
//!
//! Redis runs as a child on a free loopback port with its append-only file on and fsynced once a second
//! (`appendfsync everysec`, what most deployments run), in a fresh directory under `target/bench/`. Each
//! run starts its own Redis and nodes, so no run inherits another's keys. The scenario's producer posts to
//! the first node, which writes the stream; the subscribers take turns over the nodes (or over the others
//! alone, to measure what crossing nodes costs). Besides the writer's own figures, a run reports the CPU of
//! every node and of Redis, and how many commands Redis ran per message (from `INFO`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::procfs::{DataDir, Server, Target};
use crate::scenarios::RunResult;

/// Where Debian's package puts it (`./bench --cluster` installs it when missing).
const REDIS_SERVER: &str = "/usr/bin/redis-server";

/// One Redis and the nodes through it; all stopped when dropped (the nodes first).
pub(crate) struct Cluster {
    nodes: Vec<Server>,
    redis: Server,
    _dir: DataDir,
}

/// What a run cost the whole cluster, read before and after.
pub(crate) struct Counters {
    nodes_cpu_s: f64,
    redis_cpu_s: f64,
    redis_commands: u64,
}

impl Cluster {
    /// Starts Redis, then `nodes` agentmux nodes through it, and waits until each answers.
    pub(crate) async fn start(agentmux: &Path, label: &str, nodes: usize) -> io::Result<Cluster> {
        if !Path::new(REDIS_SERVER).exists() {
            return Err(io::Error::other(format!(
                "{REDIS_SERVER} not found (install redis-server: ./bench --cluster does)"
            )));
        }
        let dir = DataDir::fresh(&format!("{label}-redis"));
        std::fs::create_dir_all(dir.path())?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(REDIS_SERVER)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(dir.path())
            .args(["--appendonly", "yes", "--appendfsync", "everysec", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let redis = Server::adopt(child, addr);
        let started = Instant::now();
        while command(addr, "PING").is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err(io::Error::other("redis-server did not answer PING"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let args = ["--engine", "redis", "--redis-url", &format!("redis://{addr}")].map(str::to_owned);
        let mut started = Vec::with_capacity(nodes);
        for n in 0..nodes.max(1) {
            started.push(Server::start_with(Target::Agentmux, agentmux, &format!("{label}-node{n}"), &args).await?);
        }
        Ok(Cluster { nodes: started, redis, _dir: dir })
    }

    /// The node the producer posts to, which writes the stream.
    pub(crate) fn writer(&self) -> &Server {
        &self.nodes[0]
    }

    /// Where the subscribers go: every node, or (`remote`, with more than one) every node but the writer.
    pub(crate) fn readers_at(&self, remote: bool) -> Vec<SocketAddr> {
        let skip = usize::from(remote && self.nodes.len() > 1);
        self.nodes.iter().skip(skip).map(|node| node.addr).collect()
    }

    /// The nodes' CPU, Redis's, and the commands Redis has run, now.
    pub(crate) async fn counters(&self) -> io::Result<Counters> {
        let info = command(self.redis.addr, "INFO stats")?;
        let redis_commands = info
            .lines()
            .find_map(|line| line.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| io::Error::other("INFO stats has no total_commands_processed"))?;
        Ok(Counters {
            nodes_cpu_s: self.nodes.iter().map(|node| node.cpu_seconds().total()).sum(),
            redis_cpu_s: self.redis.cpu_seconds().total(),
            redis_commands,
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The nodes before Redis, so none of them spends the end of the run reconnecting.
        self.nodes.clear();
    }
}

impl Counters {
    /// What happened between `before` and now.
    pub(crate) fn since(&self, before: &Counters) -> Counters {
        Counters {
            nodes_cpu_s: self.nodes_cpu_s - before.nodes_cpu_s,
            redis_cpu_s: self.redis_cpu_s - before.redis_cpu_s,
            redis_commands: self.redis_commands.saturating_sub(before.redis_commands),
        }
    }

    /// Into the run's figures: every node's CPU, Redis's, and per message published its commands and the
    /// whole cluster's CPU per delivery.
    pub(crate) fn report(&self, result: &mut RunResult) {
        let messages = result.messages.max(1) as f64;
        result.extra.insert("nodes_cpu_s".into(), self.nodes_cpu_s);
        result.extra.insert("redis_cpu_s".into(), self.redis_cpu_s);
        // Two more `INFO` calls than the run's own: this benchmark's.
        result
            .extra
            .insert("redis_commands_per_message".into(), self.redis_commands.saturating_sub(1) as f64 / messages);
        let deliveries = result.deliveries.max(1) as f64;
        result
            .extra
            .insert("cluster_cpu_us_per_delivery".into(), (self.nodes_cpu_s + self.redis_cpu_s) * 1e6 / deliveries);
    }
}

/// One inline command to Redis over a fresh connection: the reply's text (a bulk string's contents).
fn command(addr: SocketAddr, line: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{line}\r\n").as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply);
        // `+PONG\r\n`, or `$<len>\r\n<body>\r\n` complete.
        if text.starts_with('+') && text.ends_with("\r\n") {
            return Ok(text.into_owned());
        }
        if let Some((head, body)) = text.strip_prefix('$').and_then(|t| t.split_once("\r\n"))
            && let Ok(len) = head.parse::<usize>()
            && body.len() >= len + 2
        {
            return Ok(body[..len].to_owned());
        }
        if text.starts_with('-') {
            return Err(io::Error::other(text.trim().to_owned()));
        }
    }
    Err(io::Error::other("Redis closed the connection"))
}

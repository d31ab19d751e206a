//! CPU time and memory of a process from `/proc`, and the child server processes the harness runs.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::client;

fn getconf(name: &str, default: f64) -> f64 {
    Command::new("getconf")
        .arg(name)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| getconf("CLK_TCK", 100.0))
}

/// CPU seconds of a process, in user space and in the kernel (system calls, and the TCP work they do).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    pub(crate) user: f64,
    pub(crate) system: f64,
}

impl Cpu {
    pub(crate) fn total(self) -> f64 {
        self.user + self.system
    }

    /// The CPU used since `earlier`.
    pub(crate) fn since(self, earlier: Cpu) -> Cpu {
        Cpu { user: self.user - earlier.user, system: self.system - earlier.system }
    }
}

/// The CPU seconds of a process (`"self"` or a pid) so far.
pub(crate) fn cpu_seconds(pid: &str) -> Cpu {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Cpu::default();
    };
    // The command name is in parentheses and may hold spaces: count fields after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // fields[0] is field 3 (state); utime is field 14, stime field 15.
    Cpu { user: ticks(11) / clock_ticks(), system: ticks(12) / clock_ticks() }
}

/// A `kB` line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in KiB.
pub(crate) fn status_kib(pid: &str, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Kernel slab memory in KiB (`Slab` of `/proc/meminfo`): where socket structures live.
pub(crate) fn slab_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("Slab:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Connections dropped because a listen queue was full, machine-wide (`TcpExt: ListenOverflows`).
pub(crate) fn listen_overflows() -> u64 {
    let netstat = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "ListenOverflows")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0)
}

/// The processes whose parent is `pid` (from each `/proc/<pid>/stat`), zombies left out.
pub(crate) fn children_of(pid: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(candidate) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{candidate}/stat")) else {
            continue;
        };
        // After the parenthesised command name: the state, then the parent's pid.
        let mut fields = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace();
        if let (Some(state), Some(parent)) = (fields.next(), fields.next())
            && parent == pid
            && state != "Z"
        {
            children.push(candidate.to_owned());
        }
    }
    children
}

/// Which server a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Agentmux,
    /// The coalescing ceiling (`ceiling.rs`).
    Ceiling,
    /// The naive ceiling: the same server without the gathering.
    CeilingNaive,
    /// nginx with the nchan module (`nchan.rs`), started by `nchan::start`.
    Nchan,
}

impl Target {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Target::Agentmux => "agentmux",
            Target::Ceiling => "ceiling",
            Target::CeilingNaive => "ceiling-naive",
            Target::Nchan => "nchan",
        }
    }
}

/// A server child process on a free loopback port; killed when dropped.
pub(crate) struct Server {
    child: Child,
    pid: String,
    pub(crate) addr: SocketAddr,
    /// Its own child processes are part of it (nginx's workers): its CPU and memory are theirs and its own
    /// summed, and they are stopped with it.
    with_children: bool,
}

impl Server {
    /// Starts `target` and waits until `/healthz` answers.
    pub(crate) async fn start(target: Target, agentmux: &Path, label: &str) -> io::Result<Server> {
        Server::start_with(target, agentmux, label, &[]).await
    }

    /// The same, with more flags for the server.
    pub(crate) async fn start_with(
        target: Target,
        agentmux: &Path,
        label: &str,
        args: &[String],
    ) -> io::Result<Server> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let logs = PathBuf::from("target/bench/logs");
        std::fs::create_dir_all(&logs)?;
        let log = File::create(logs.join(format!("{label}-{}.log", target.name())))?;
        let mut command = match target {
            Target::Nchan => return Err(io::Error::other("nchan is started by nchan::start")),
            Target::Agentmux => {
                let mut c = Command::new(agentmux);
                // In memory, as every figure so far (the store has its own comparison); by the environment,
                // which servers from before the store ignore.
                if !args.iter().any(|a| a == "--data-dir") {
                    c.env("AGENTMUX_EPHEMERAL", "true");
                }
                // Room for the longest fan-out (a stream holds 100,000 messages and 64 MiB by default), so
                // that a run lasts seconds rather than one; by the environment, which servers from before
                // the flags ignore.
                c.env("AGENTMUX_MAX_STREAM_MESSAGES", "1000000").env("AGENTMUX_MAX_STREAM_BYTES", "268435456");
                // The load comes from a few loopback addresses (`client::source_ip`), each holding thousands
                // of connections: no share per address below the cap (the cap itself is the server's).
                c.env("AGENTMUX_CONNECTIONS_PER_CLIENT", "100000000");
                c
            }
            Target::Ceiling | Target::CeilingNaive => {
                let mut c = Command::new(std::env::current_exe()?);
                c.arg("--ceiling-server");
                if target == Target::CeilingNaive {
                    c.arg("--ceiling-naive");
                }
                c
            }
        };
        command.arg("--addr").arg(addr.to_string()).args(args);
        let child = command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn().map_err(|e| {
            io::Error::new(e.kind(), format!("starting {}: {e} (build it: cargo build --release)", agentmux.display()))
        })?;
        let mut server = Server::adopt(child, addr);
        server.wait_healthy(target.name(), Duration::from_secs(10)).await?;
        Ok(server)
    }

    /// Waits until `GET /healthz` answers 200 (up to `within`); an error if it does not or the server exits.
    pub(crate) async fn wait_healthy(&mut self, name: &str, within: Duration) -> io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(mut conn) = client::Conn::open(self.addr, client::source_ip(0)).await
                && let Ok((200, _)) = conn.request("GET", "/healthz", None, b"").await
            {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(io::Error::other(format!("{name} exited ({status}) before answering /healthz")));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!("{name} did not answer /healthz on {}", self.addr)));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A server started elsewhere, listening on `addr`; killed when dropped like the others.
    pub(crate) fn adopt(child: Child, addr: SocketAddr) -> Server {
        Server { pid: child.id().to_string(), child, addr, with_children: false }
    }

    /// The same for a server whose child processes are part of it (nginx's master and its workers).
    pub(crate) fn adopt_with_children(child: Child, addr: SocketAddr) -> Server {
        Server { pid: child.id().to_string(), child, addr, with_children: true }
    }

    /// Its pid and, when they count, its children's.
    fn processes(&self) -> Vec<String> {
        let mut pids = vec![self.pid.clone()];
        if self.with_children {
            pids.extend(children_of(&self.pid));
        }
        pids
    }

    /// Its process id, for `/proc`.
    pub(crate) fn pid(&self) -> &str {
        &self.pid
    }

    /// How it exited, if it did.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Its CPU so far (with its children's, when they count: a worker's while it lives).
    pub(crate) fn cpu_seconds(&self) -> Cpu {
        self.processes()
            .iter()
            .map(|pid| cpu_seconds(pid))
            .fold(Cpu::default(), |sum, cpu| Cpu { user: sum.user + cpu.user, system: sum.system + cpu.system })
    }

    /// Its resident memory (summed with its children's when they count: memory they share, such as nginx's
    /// shared memory zone, is counted in each).
    pub(crate) fn rss_kib(&self) -> u64 {
        self.processes().iter().map(|pid| status_kib(pid, "VmRSS")).sum()
    }

    /// Its peak resident memory (`VmHWM`; with children, the sum of each one's peak).
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        self.processes().iter().map(|pid| status_kib(pid, "VmHWM")).sum()
    }

    /// Stops a server with children: SIGTERM to the parent, which stops and reaps its children (nginx's
    /// master does), then SIGKILL to whatever is left after 3 s. nginx's workers outlive a master killed
    /// outright, so they are never left to that alone. By the `kill` command: this crate has no unsafe code.
    fn stop_with_children(&mut self) {
        let children = children_of(&self.pid);
        let signal = |signal: &str, pids: &[String]| {
            let _ = Command::new("kill")
                .arg(signal)
                .args(pids)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        signal("-TERM", std::slice::from_ref(&self.pid));
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.exited().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let left: Vec<String> = children.into_iter().filter(|pid| status_kib(pid, "VmRSS") > 0).collect();
        if !left.is_empty() {
            signal("-KILL", &left);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.with_children {
            self.stop_with_children();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh data directory for one run of agentmux with its store (`target/bench/data/<label>`), removed
/// when dropped: declare it before the server it serves, so the server is gone first.
pub(crate) struct DataDir(PathBuf);

impl DataDir {
    pub(crate) fn fresh(label: &str) -> DataDir {
        let dir = PathBuf::from("target/bench/data").join(label);
        let _ = std::fs::remove_dir_all(&dir);
        DataDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

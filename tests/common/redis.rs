//! A real `redis-server` (Debian's package, installed here when missing) on a free loopback port, with its
//! append-only file on and fsynced on every write, in a directory of its own; killed when dropped. With
//! [`RedisServer::start_tls`] it also listens for TLS (`tls-port`, a certificate a test CA signed).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::browser::free_port;

/// Installs Debian's `redis-server` unless it is there.
pub(crate) fn ensure_redis() {
    super::command::ensure_debian_packages(
        || std::path::Path::new("/usr/bin/redis-server").exists(),
        &["redis-server"],
    );
}

/// A running `redis-server`; killed when dropped, its directory removed.
pub(crate) struct RedisServer {
    child: Option<Child>,
    pub(crate) port: u16,
    dir: PathBuf,
    /// With TLS: its port, and the `tls-*` arguments.
    tls: Option<(u16, Vec<String>)>,
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers.
    pub(crate) fn start() -> RedisServer {
        ensure_redis();
        let dir = std::env::temp_dir().join(format!("agentmux-redis-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("a directory for Redis");
        let mut server = RedisServer { child: None, port: free_port(), dir, tls: None };
        server.run();
        server
    }

    /// Starts one that also serves TLS on another port with `ca`'s server certificate (clients need not
    /// present one); the plain port stays, for the readiness check and the tests' own looks.
    pub(crate) fn start_tls(ca: &super::tls::TestCa) -> RedisServer {
        ensure_redis();
        let dir = std::env::temp_dir().join(format!("agentmux-redis-{}-{}", std::process::id(), free_port()));
        let (ca_file, cert, key) = ca.write(&dir.join("tls"));
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        let tls_port = free_port();
        let args = vec![
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            path(cert),
            "--tls-key-file".to_owned(),
            path(key),
            "--tls-ca-cert-file".to_owned(),
            path(ca_file),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        let mut server = RedisServer { child: None, port: free_port(), dir, tls: Some((tls_port, args)) };
        server.run();
        server
    }

    /// `rediss://127.0.0.1:<tls port>`, for a server started with [`RedisServer::start_tls`].
    pub(crate) fn tls_url(&self) -> String {
        let (port, _) = self.tls.as_ref().expect("a server started with TLS");
        format!("rediss://127.0.0.1:{port}")
    }

    /// `redis://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL, nothing flushed beyond what it already fsynced) and starts it again on the same
    /// port and directory, from its append-only file.
    pub(crate) fn restart(&mut self) {
        self.stop();
        self.run();
    }

    /// Starts it again after [`RedisServer::stop`], on the same port and directory.
    pub(crate) fn start_again(&mut self) {
        self.run();
    }

    /// Kills it, and waits until it is gone.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn run(&mut self) {
        let port = self.port.to_string();
        let dir = self.dir.to_string_lossy().into_owned();
        let child = Command::new("/usr/bin/redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--dir", &dir, "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no"])
            .args(self.tls.iter().flat_map(|(_, args)| args))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let what = format!("redis-server to answer on port {port}");
        super::wait::eventually_blocking(&what, Duration::from_secs(20), || ping(self.port));
    }
}

/// True when a Redis on `port` answers `PING` (and has loaded its data: it answers `-LOADING` until then).
fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut socket) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = socket.set_read_timeout(Some(Duration::from_secs(1)));
    let mut reply = [0u8; 16];
    socket.write_all(b"PING\r\n").is_ok() && socket.read(&mut reply).is_ok_and(|n| reply[..n].starts_with(b"+PONG"))
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    /// A counter of `INFO stats` (`total_commands_processed`, ...).
    pub(crate) fn stat(&self, name: &str) -> u64 {
        use std::io::{Read, Write};
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect to Redis");
        socket.set_read_timeout(Some(Duration::from_secs(2))).expect("a timeout");
        socket.write_all(b"INFO stats\r\n").expect("send INFO");
        let mut reply = Vec::new();
        let mut buf = [0u8; 8192];
        let prefix = format!("{name}:");
        loop {
            let n = socket.read(&mut buf).expect("read INFO");
            reply.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&reply);
            if let Some(value) = text.lines().find_map(|line| line.strip_prefix(&prefix)) {
                return value.trim().parse().expect("a number");
            }
            assert!(n > 0, "INFO stats has no {name}");
        }
    }
}

//! nchan, the nginx pub/sub module, as the third target of the fan-out, latency and idle scenarios: finds
//! Debian's nginx and its nchan module (`./bench` installs them when missing), fills in
//! `benches/nchan/nginx.conf` for a run and starts nginx as a child process: a master and two workers in
//! the foreground on a free loopback port, its pid file, error log and temporary files in
//! `target/bench/nchan/<run>`. Its CPU and memory are the master's and the workers' summed
//! ([`Server::adopt_with_children`]).
//!
//! The configuration gives nchan agentmux's URLs, so the scenarios drive it with the same client code; what
//! differs is what nchan's API makes differ: a message per POST, a channel ended by DELETE, and bodies sent
//! to subscribers as they came (so the producer adds the `metadata` agentmux stamps, for the same `data:`
//! lines: see `scenarios.rs`).

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::procfs::Server;

/// Where Debian's packages put nginx and the module (`nginx`, `libnginx-mod-nchan`).
const NGINX: &str = "/usr/sbin/nginx";
const MODULE: &str = "/usr/lib/nginx/modules/ngx_nchan_module.so";
const PACKAGES: &str = "nginx and libnginx-mod-nchan";

/// The configuration, with `@MODULE@`, `@DIR@`, `@PORT@` and `@WORKER_CONNECTIONS@` to fill in.
const CONFIG: &str = include_str!("../nchan/nginx.conf");

/// nginx and the nchan module, found and tried.
#[derive(Debug, Clone)]
pub(crate) struct Install {
    nginx: PathBuf,
    module: PathBuf,
    /// nginx's and the module package's versions, for the report.
    pub(crate) versions: String,
}

/// `<package>`'s installed version by `dpkg-query`, if it answers.
fn package_version(package: &str) -> Option<String> {
    let output = Command::new("dpkg-query").args(["-W", "-f", "${Version}", package]).output().ok()?;
    let version = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !version.is_empty()).then_some(version)
}

/// The configuration for one run in `dir`.
fn config(module: &Path, dir: &Path, port: u16, connections: usize) -> String {
    CONFIG
        .replace("@MODULE@", &module.display().to_string())
        .replace("@DIR@", &dir.display().to_string())
        .replace("@PORT@", &port.to_string())
        .replace("@WORKER_CONNECTIONS@", &(connections + 256).to_string())
}

/// A fresh directory for one run of nginx: `target/bench/nchan/<label>`, as an absolute path.
fn fresh_dir(label: &str) -> io::Result<PathBuf> {
    let dir = std::env::current_dir()?.join("target/bench/nchan").join(label);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// nginx with the run's directory as its prefix, `conf` as its configuration and its error log there.
fn nginx_command(nginx: &Path, dir: &Path, conf: &Path) -> Command {
    let mut command = Command::new(nginx);
    command.arg("-p").arg(dir).arg("-c").arg(conf).arg("-e").arg(dir.join("error.log")).stdin(Stdio::null());
    command
}

/// The last line nginx wrote, for an error message.
fn last_line(text: &[u8]) -> String {
    String::from_utf8_lossy(text).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_owned()
}

impl Install {
    /// nginx and the module where Debian puts them, tried with this benchmark's configuration
    /// (`nginx -t`); or why nchan cannot run here, in one line.
    pub(crate) fn find() -> Result<Install, String> {
        let (nginx, module) = (PathBuf::from(NGINX), PathBuf::from(MODULE));
        if !nginx.exists() || !module.exists() {
            let missing = if nginx.exists() { MODULE } else { NGINX };
            return Err(format!("{missing} not found (install {PACKAGES}: ./bench does when it can)"));
        }
        let dir = fresh_dir("check").map_err(|e| format!("target/bench/nchan: {e}"))?;
        let conf = dir.join("nginx.conf");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
            .port();
        std::fs::write(&conf, config(&module, &dir, port, 64)).map_err(|e| format!("{}: {e}", conf.display()))?;
        let test = nginx_command(&nginx, &dir, &conf).arg("-t").output().map_err(|e| format!("{NGINX} -t: {e}"))?;
        if !test.status.success() {
            return Err(format!("{NGINX} -t rejects benches/nchan/nginx.conf: {}", last_line(&test.stderr)));
        }
        let nginx_version = Command::new(&nginx)
            .arg("-v")
            .output()
            .ok()
            .map(|o| last_line(&o.stderr))
            .and_then(|line| line.rsplit_once('/').map(|(_, version)| version.to_owned()))
            .unwrap_or_else(|| "?".into());
        let versions = format!(
            "nginx {nginx_version} (package {}), libnginx-mod-nchan {}",
            package_version("nginx").unwrap_or_else(|| "?".into()),
            package_version("libnginx-mod-nchan").unwrap_or_else(|| "?".into()),
        );
        Ok(Install { nginx, module, versions })
    }
}

/// Starts nginx with nchan for `connections` clients and waits until it serves; killed (master and
/// workers) when the server is dropped.
pub(crate) async fn start(install: &Install, label: &str, connections: usize) -> io::Result<Server> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let dir = fresh_dir(label)?;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, config(&install.module, &dir, port, connections))?;
    let logs = PathBuf::from("target/bench/logs");
    std::fs::create_dir_all(&logs)?;
    let log = File::create(logs.join(format!("{label}-nchan.log")))?;
    let child = nginx_command(&install.nginx, &dir, &conf)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", install.nginx.display())))?;
    let mut server = Server::adopt_with_children(child, addr);
    server
        .wait_healthy("nchan", Duration::from_secs(10))
        .await
        .map_err(|e| io::Error::other(format!("{e} (see {})", dir.join("error.log").display())))?;
    Ok(server)
}

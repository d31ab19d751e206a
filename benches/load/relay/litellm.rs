//! LiteLLM's proxy for the relay benchmark: installed by the bench itself into a venv under `target/`
//! (once; reused while `import litellm` works there), configured to forward one model to the fast upstream,
//! and started as a child process on a free loopback port.
//!
//! Installing: `python3 -m venv target/litellm-venv`, then its pip installs `litellm[proxy]` from the
//! package registry (about a minute; the output goes to `target/bench/logs/litellm-install.log`). Whatever
//! fails is returned as one sentence, so the relay can say why LiteLLM is missing and still measure
//! agentmux against the upstream.
//!
//! Running: `litellm --config FILE --host 127.0.0.1 --port P` with the config mapping the model to
//! `openai/<model>` at the upstream's `/v1` (over HTTPS too: the upstream's CA is then given in `SSL_VERIFY`
//! and `SSL_CERT_FILE`, which LiteLLM's HTTP clients trust) with a dummy key, a random master key (the proxy refuses to start
//! without one; the client sends it), no database (spend and error logs off), no callbacks, and the environment kept off the network: the model cost map is the one the package ships
//! (`LITELLM_LOCAL_MODEL_COST_MAP`), telemetry has no destination, proxies are cleared. It is ready when
//! `GET /health/liveliness` answers 200.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::{self, source_ip};
use crate::procfs::Server;

/// A usable LiteLLM.
#[derive(Debug, Clone)]
pub(crate) struct LiteLlm {
    venv: PathBuf,
    /// Its package version.
    pub(crate) version: String,
}

/// The environment every LiteLLM command runs with: no network beyond loopback, quiet logs.
fn offline(command: &mut Command) -> &mut Command {
    for proxy in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        command.env_remove(proxy);
    }
    command
        .env_remove("DATABASE_URL")
        .env_remove("LITELLM_TELEMETRY_DESTINATION")
        .env_remove("LITELLM_TELEMETRY_ENDPOINT")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_LOG", "ERROR")
        .env("LITELLM_MODE", "PRODUCTION")
        .env("PYTHONUNBUFFERED", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
}

fn python(venv: &Path) -> PathBuf {
    venv.join("bin/python")
}

/// Runs `command` to the end, its output into `log`; the error as one sentence.
fn run(command: &mut Command, log: &Path, what: &str) -> Result<String, String> {
    let output = offline(command)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: cannot run {:?}: {e}", command.get_program()))?;
    let mut text = output.stdout.clone();
    text.extend_from_slice(&output.stderr);
    let _ = std::fs::write(log, &text);
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned());
    }
    let last =
        String::from_utf8_lossy(&output.stderr).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_owned();
    Err(format!("{what} failed ({}): {last} (see {})", output.status, log.display()))
}

/// The version of the LiteLLM in `venv`, if it imports.
fn installed(venv: &Path, logs: &Path) -> Result<String, String> {
    if !python(venv).exists() {
        return Err(format!("no venv at {}", venv.display()));
    }
    let check = "import importlib.metadata, litellm, uvicorn, fastapi; print(importlib.metadata.version('litellm'))";
    run(Command::new(python(venv)).args(["-c", check]), &logs.join("litellm-import.log"), "import litellm")
}

/// A usable LiteLLM in `venv`, installed there first when it is not (blocking: minutes at most).
pub(crate) fn ensure(venv: &Path) -> Result<LiteLlm, String> {
    let logs = PathBuf::from("target/bench/logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("creating {}: {e}", logs.display()))?;
    if let Ok(version) = installed(venv, &logs) {
        return Ok(LiteLlm { venv: venv.to_owned(), version });
    }
    eprintln!(
        "relay: installing LiteLLM's proxy into {} (pip install 'litellm[proxy]', about a minute)",
        venv.display()
    );
    let log = logs.join("litellm-install.log");
    if !python(venv).exists() {
        run(Command::new("python3").arg("-m").arg("venv").arg(venv), &log, "python3 -m venv")?;
    }
    run(
        Command::new(python(venv)).args(["-m", "pip", "install", "--quiet", "litellm[proxy]"]),
        &log,
        "pip install 'litellm[proxy]'",
    )?;
    let version = installed(venv, &logs)?;
    Ok(LiteLlm { venv: venv.to_owned(), version })
}

/// The proxy's configuration: `model` forwarded to the upstream as an OpenAI-compatible one.
fn config(model: &str, api_base: &str, master_key: &str) -> String {
    format!(
        "model_list:\n\
         \x20 - model_name: {model}\n\
         \x20   litellm_params:\n\
         \x20     model: openai/{model}\n\
         \x20     api_base: {api_base}\n\
         \x20     api_key: sk-relay-dummy\n\
         litellm_settings:\n\
         \x20 drop_params: true\n\
         \x20 telemetry: false\n\
         general_settings:\n\
         \x20 master_key: {master_key}\n\
         \x20 disable_spend_logs: true\n\
         \x20 disable_error_logs: true\n"
    )
}

impl LiteLlm {
    /// Starts the proxy in front of the upstream at `api_base` (`http://ADDR/v1`, or `https://` with its CA in
    /// `ca`) for `model`, and waits until it is alive (up to `within`). Clients must send `master_key` as a
    /// bearer token.
    pub(crate) async fn start(
        &self,
        model: &str,
        api_base: &str,
        ca: Option<&Path>,
        master_key: &str,
        label: &str,
        within: Duration,
    ) -> io::Result<Server> {
        let dir = PathBuf::from("target/bench/relay");
        std::fs::create_dir_all(&dir)?;
        let config_path = dir.join(format!("{label}-litellm.yaml"));
        std::fs::write(&config_path, config(model, api_base, master_key))?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let logs = PathBuf::from("target/bench/logs");
        std::fs::create_dir_all(&logs)?;
        let log_path = logs.join(format!("{label}-litellm.log"));
        let log = File::create(&log_path)?;
        let mut command = Command::new(self.venv.join("bin/litellm"));
        command
            .arg("--config")
            .arg(&config_path)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        offline(&mut command);
        // Its HTTP clients trust the CA of `SSL_VERIFY` (a path), and httpx's defaults that of `SSL_CERT_FILE`.
        if let Some(ca) = ca {
            command.env("SSL_VERIFY", ca).env("SSL_CERT_FILE", ca);
        }
        let child = command.spawn()?;
        let mut server = Server::adopt(child, addr);
        let deadline = Instant::now() + within;
        loop {
            if let Ok(mut conn) = client::Conn::open(addr, source_ip(0)).await
                && let Ok((200, _)) = conn.request("GET", "/health/liveliness", None, b"").await
            {
                return Ok(server);
            }
            if let Some(status) = server.exited() {
                return Err(io::Error::other(format!("litellm exited ({status}); see {}", log_path.display())));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "litellm did not answer /health/liveliness within {within:?}; see {}",
                    log_path.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

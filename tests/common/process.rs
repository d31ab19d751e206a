//! The `agentmux` binary as a child process on `127.0.0.1:0`, for tests of what only the process does:
//! signals, exit, the flags.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `agentmux`; killed when dropped.
pub(crate) struct ServerProcess {
    child: Child,
    /// `http://127.0.0.1:<port>`
    pub(crate) base: String,
    /// `127.0.0.1:<port>`
    pub(crate) addr: String,
    /// Everything it wrote to stderr so far.
    pub(crate) log: Arc<Mutex<String>>,
}

impl ServerProcess {
    /// Starts `agentmux serve --addr 127.0.0.1:0` with `args`, and waits until it listens. Without a
    /// `--data-dir` in `args` it runs `--ephemeral`, so no test writes a store in the working directory.
    pub(crate) fn spawn(args: &[&str]) -> ServerProcess {
        ServerProcess::spawn_with_env(&[], args)
    }

    /// As [`ServerProcess::spawn`], with the variables of `env` set in its environment.
    pub(crate) fn spawn_with_env(env: &[(&str, &str)], args: &[&str]) -> ServerProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentmux"));
        command.args(["serve", "--addr", "127.0.0.1:0"]).args(args).envs(env.iter().copied());
        if !args.contains(&"--data-dir") {
            command.arg("--ephemeral");
        }
        ServerProcess::start(command)
    }

    /// Starts it with a soft open-file limit of `soft` (through the shell's `ulimit`).
    pub(crate) fn spawn_with_open_files(soft: u64, args: &[&str]) -> ServerProcess {
        let script = format!("ulimit -Sn {soft} && exec \"$0\" serve --addr 127.0.0.1:0 --ephemeral \"$@\"");
        let mut command = Command::new("sh");
        command.args(["-c", &script, env!("CARGO_BIN_EXE_agentmux")]).args(args);
        ServerProcess::start(command)
    }

    fn start(mut command: Command) -> ServerProcess {
        let mut child = command
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start agentmux");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Into the log first: whoever learns the address may read the line at once.
                {
                    let mut log = sink.lock().unwrap_or_else(|p| p.into_inner());
                    log.push_str(&line);
                    log.push('\n');
                }
                if line.contains("agentmux listening") {
                    let address = line.split("address=").nth(1).and_then(|rest| rest.split_whitespace().next());
                    let _ = tx.send(address.map(str::to_owned));
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("agentmux did not say where it listens: {}", log.lock().expect("log")));
        ServerProcess { child, base: format!("http://{addr}"), addr, log }
    }

    /// `base` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Its process id (for what `/proc/<pid>` says of it).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it at once (SIGKILL), as a crash would, and waits until it is gone.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM.
    pub(crate) fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Sends a signal (`-STOP`, `-CONT`, `-TERM`) by the `kill` command.
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill {signal}");
    }

    /// Waits up to `within` for the process to exit; how long it took and whether it exited cleanly.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> (Duration, bool) {
        let started = Instant::now();
        match super::wait::until_blocking(within, || self.child.try_wait().ok().flatten()) {
            Some(status) => (started.elapsed(), status.success()),
            None => panic!("agentmux did not exit within {within:?}; its log:\n{}", self.log.lock().expect("log")),
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `agentmux serve --addr 127.0.0.1:0 --ephemeral` with `args`, which must stop the start: its exit code
/// and what it wrote to stderr. One still running after 30 s is killed (its code is then `None`).
pub(crate) fn failed_start(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmux"))
        .args(["serve", "--addr", "127.0.0.1:0", "--ephemeral"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start agentmux");
    let started = Instant::now();
    while child.try_wait().ok().flatten().is_none() && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("its output");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

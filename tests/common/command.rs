//! Client programs (a Python or Node script, an installer) run to their end from a test, with a time limit
//! and their output kept for the failure message.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs `command` to the end with its output captured; kills it after `timeout`. `Err` when it cannot be
/// started or runs too long.
pub(crate) fn run(command: &mut Command, timeout: Duration) -> Result<Output, String> {
    let described = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {described}: {e}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    // Exited (or `try_wait` failed, which is as final).
    let exited = super::wait::until_blocking(timeout, || child.try_wait().transpose());
    let status = match exited {
        Some(status) => status.map_err(|e| format!("waiting for {described}: {e}"))?,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            let out = String::from_utf8_lossy(&stdout.join().unwrap_or_default()).into_owned();
            let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
            return Err(format!(
                "{described} ran over {timeout:?} and was killed\n--- stdout\n{out}\n--- stderr\n{err}"
            ));
        }
    };
    Ok(Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() })
}

/// Panics with the command's output when it failed.
pub(crate) fn expect_success(what: &str, output: Result<Output, String>) -> Output {
    let output = output.unwrap_or_else(|e| panic!("{what}: {e}"));
    if !output.status.success() {
        panic!(
            "{what} failed ({})\n--- stdout\n{}\n--- stderr\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

/// Installs Debian `packages` with apt-get unless `ready` says they are there: once per machine, under a lock
/// in `target/` (tests that need them may start at once); panics saying why when it cannot (never skipped).
pub(crate) fn ensure_debian_packages(ready: impl Fn() -> bool, packages: &[&str]) {
    if ready() {
        return;
    }
    let lock_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/apt-install.lock");
    let lock = std::fs::File::create(&lock_path).expect("the install lock");
    lock.lock().expect("lock");
    if ready() {
        return;
    }
    let install = |args: &[&str]| {
        Command::new("apt-get").args(args).env("DEBIAN_FRONTEND", "noninteractive").status().is_ok_and(|s| s.success())
    };
    let mut install_packages = vec!["install", "-y"];
    install_packages.extend_from_slice(packages);
    assert!(
        install(&install_packages) || (install(&["update"]) && install(&install_packages)),
        "{packages:?} are needed: `apt-get install` failed (run the tests as root with apt)"
    );
    assert!(ready(), "{packages:?} installed but not where the tests look");
}

//! Node clients for the tests: Node 20 or later (Debian's `nodejs` and `npm`, installed with apt-get when `node` is
//! missing) and the npm packages the tests drive (the `ai` package at two majors, `@ag-ui/client`, `@anthropic-ai/sdk`,
//! `openai`, the AI SDK's `@ai-sdk/openai` and `@ai-sdk/anthropic`), installed into `target/node-clients` the first
//! time and reused; a lock file keeps two test processes from installing at once. Nothing is skipped: without Node or
//! the registry a test fails and says why. Scripts live in `tests/node/` and run from `target/node-clients`, so their
//! imports find the packages; they talk to 127.0.0.1 only (npm is the one thing that goes to the network).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::command::{expect_success, run};

/// Every package installed: (the name it is imported by, the package, its major version).
const PACKAGES: &[(&str, &str, &str)] = &[
    ("ai5", "ai", "5"),
    ("ai", "ai", "7"),
    ("@ag-ui/client", "@ag-ui/client", "1"),
    ("@anthropic-ai/sdk", "@anthropic-ai/sdk", "1"),
    ("openai", "openai", "7"),
    ("@ai-sdk/openai", "@ai-sdk/openai", "4"),
    ("@ai-sdk/anthropic", "@ai-sdk/anthropic", "4"),
];

fn target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target")
}

fn node_ready() -> bool {
    let check = "process.exit(+process.versions.node.split('.')[0] >= 20 ? 0 : 3)";
    run(Command::new("node").args(["-e", check]), Duration::from_secs(30)).is_ok_and(|output| output.status.success())
}

/// Held while installing: one test process installs Node or packages at a time (apt and npm each want to
/// be alone).
pub(crate) fn install_lock() -> File {
    let path = target().join("node-clients.lock");
    std::fs::create_dir_all(target()).unwrap_or_else(|e| panic!("create {}: {e}", target().display()));
    let lock = File::options().create(true).truncate(false).write(true).open(&path).expect("the install lock");
    lock.lock().expect("lock");
    lock
}

/// Node 20 or later on the path (call it holding [`install_lock`]): installs Debian's `nodejs` and `npm` with apt-get when it is not.
pub(crate) fn ensure_node() {
    if !node_ready() {
        let install = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        let packages = ["install", "-y", "nodejs", "npm"];
        assert!(
            install(&packages) || (install(&["update"]) && install(&packages)),
            "Node 20 or later is needed: `apt-get install nodejs npm` failed (run the tests as root with apt)"
        );
        assert!(node_ready(), "nodejs installed, but `node` is missing or older than 20");
    }
}

/// Node, and the packages of the package in `dir` (`npm install`, as its lock file pins them).
pub(crate) fn npm_install(dir: &Path) {
    let _lock = install_lock();
    ensure_node();
    let mut install = Command::new("npm");
    install.args(["install", "--no-audit", "--no-fund", "--loglevel=error"]).current_dir(dir);
    expect_success(&format!("npm install ({})", dir.display()), run(&mut install, Duration::from_secs(600)));
}

/// `target/node-clients`, with Node and every package installed.
fn ensure_packages() -> PathBuf {
    let dir = target().join("node-clients");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let _lock = install_lock();
    ensure_node();
    let installed = |alias: &str, name: &str, major: &str| {
        std::fs::read(dir.join("node_modules").join(alias).join("package.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .is_some_and(|package| {
                package["name"] == name
                    && package["version"].as_str().is_some_and(|v| v.starts_with(&format!("{major}.")))
            })
    };
    if PACKAGES.iter().all(|(alias, name, major)| installed(alias, name, major)) {
        return dir;
    }
    let dependencies: serde_json::Map<String, Value> = PACKAGES
        .iter()
        .map(|(alias, name, major)| ((*alias).to_owned(), json!(format!("npm:{name}@{major}"))))
        .collect();
    let manifest =
        json!({"name": "agentmux-node-clients", "private": true, "type": "module", "dependencies": dependencies});
    std::fs::write(dir.join("package.json"), manifest.to_string()).expect("write package.json");
    eprintln!("installing the Node clients into {} (npm needs the registry)", dir.display());
    expect_success(
        "npm install",
        run(
            Command::new("npm").args(["install", "--no-audit", "--no-fund", "--loglevel=error"]).current_dir(&dir),
            Duration::from_secs(600),
        ),
    );
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(alias, name, major)| !installed(alias, name, major))
        .map(|(alias, ..)| *alias)
        .collect();
    assert!(missing.is_empty(), "npm install left {missing:?} missing");
    dir
}

/// Puts every file of `tests/node/` next to the packages, so a script finds both them and the modules it shares
/// with others (`watching.mjs`). Each is written under a name of this run's and renamed over the last copy, so a
/// script another test is starting never reads a half-written file.
fn copy_scripts(dir: &Path, run_number: usize) {
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    for entry in std::fs::read_dir(&scripts).expect("list tests/node") {
        let source = entry.expect("an entry of tests/node").path();
        let Some(name) = source.file_name().and_then(|name| name.to_str()) else { continue };
        let partial = dir.join(format!(".{name}-{}-{run_number}", std::process::id()));
        std::fs::copy(&source, &partial).expect("copy a script next to the packages");
        std::fs::rename(&partial, dir.join(name)).expect("put a script in place");
    }
}

/// Runs `tests/node/<script>` with `config` (a JSON file it gets as its argument); what it prints, as JSON.
pub(crate) async fn run_script(script: &'static str, config: Value) -> Vec<Value> {
    tokio::task::spawn_blocking(move || {
        let dir = ensure_packages();
        // Tests of one process run at once: each run its own files.
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let run_number = RUNS.fetch_add(1, Ordering::Relaxed);
        copy_scripts(&dir, run_number);
        let path = dir.join(script);
        let config_path = dir.join(format!("config-{}-{run_number}-{script}.json", std::process::id()));
        std::fs::write(&config_path, config.to_string()).expect("config");
        let output = expect_success(
            &format!("node {script}"),
            run(
                Command::new("node")
                    .arg(&path)
                    .arg(&config_path)
                    .current_dir(&dir)
                    .env("NO_PROXY", "127.0.0.1,localhost")
                    .env("no_proxy", "127.0.0.1,localhost"),
                Duration::from_secs(120),
            ),
        );
        let _ = std::fs::remove_file(&config_path);
        serde_json::from_slice::<Vec<Value>>(&output.stdout).unwrap_or_else(|e| {
            panic!("{script}'s output is not JSON ({e}): {}", String::from_utf8_lossy(&output.stdout))
        })
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

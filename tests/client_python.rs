//! The official `openai` Python package against a real server: `tests/python/openai_client.py` runs every
//! case (text, reasoning, parallel tool calls raw and through the `.stream()` helper, an error mid-stream, the
//! usage chunk, error statuses, a two-turn server-side thread read back) and prints one JSON line per case.
//!
//! The package lives in a virtualenv at `target/py-venv`, made with `python3 -m venv` and `pip install` the
//! first time (or when the import fails) and reused afterwards; a lock file keeps two test processes from
//! building it at once. Nothing here is skipped: without `python3` or PyPI the test fails and says why. The
//! script talks to 127.0.0.1 only; pip is the one thing that goes to the network.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::command::{expect_success, run};
use common::server::TestServer;

/// The pin: 1.97.2 is the first release that does not wrap named SSE events (wire-compat.md §1).
const OPENAI_REQUIREMENT: &str = "openai>=1.97.2,<4";
/// Exits 0 when the venv's `openai` imports and satisfies [`OPENAI_REQUIREMENT`].
const CHECK_OPENAI: &str = "import sys, openai
v = tuple(int(p) for p in openai.__version__.split('.')[:3] if p.isdigit())
sys.exit(0 if (1, 97, 2) <= v < (4,) else 3)";
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// Every case the script runs, in its order.
const CASES: &[&str] = &[
    "text_stream_echo",
    "text_nonstream_echo",
    "text_stream_plain_text",
    "text_nonstream_plain_text",
    "reasoning_stream",
    "reasoning_nonstream",
    "tool_calls_stream_raw",
    "tool_calls_stream_helper",
    "tool_calls_stream_helper_strict",
    "tool_calls_nonstream",
    "error_mid_stream",
    "usage_stream",
    "usage_stream_last_chunk",
    "nonstream_error",
    "stream_error_at_end",
    "unknown_model",
    "thread_two_turns",
];

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) { venv.join("Scripts").join("python.exe") } else { venv.join("bin").join("python") }
}

/// Runs `tests/python/<name>` with `args` in the venv, talking to loopback only (no proxy, no OpenAI
/// settings from the environment); panics with its output unless it succeeds.
async fn run_script(python: PathBuf, name: &'static str, args: Vec<String>) -> Output {
    let script = manifest_dir().join("tests").join("python").join(name);
    let output = tokio::task::spawn_blocking(move || {
        run(
            Command::new(&python)
                .arg(&script)
                .args(&args)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .env("PYTHONUNBUFFERED", "1")
                .env("NO_PROXY", "127.0.0.1,localhost")
                .env("no_proxy", "127.0.0.1,localhost")
                .env_remove("OPENAI_BASE_URL")
                .env_remove("OPENAI_API_KEY"),
            SCRIPT_TIMEOUT,
        )
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    expect_success(&format!("tests/python/{name}"), output)
}

fn openai_ready(python: &Path) -> bool {
    python.is_file()
        && run(Command::new(python).args(["-c", CHECK_OPENAI]), Duration::from_secs(60))
            .is_ok_and(|output| output.status.success())
}

/// Makes sure `target/py-venv` has `openai`; returns the venv's python. Holds an exclusive lock on
/// `target/py-venv.lock` meanwhile, so a second test process waits and then finds the venv ready.
fn ensure_venv() -> PathBuf {
    let target = manifest_dir().join("target");
    std::fs::create_dir_all(&target).unwrap_or_else(|e| panic!("create {}: {e}", target.display()));
    let venv = target.join("py-venv");
    let python = venv_python(&venv);
    let lock_path = target.join("py-venv.lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap_or_else(|e| panic!("open {}: {e}", lock_path.display()));
    lock.lock().unwrap_or_else(|e| panic!("lock {}: {e}", lock_path.display()));
    if openai_ready(&python) {
        return python;
    }
    let started = Instant::now();
    eprintln!("creating {} with {OPENAI_REQUIREMENT} (pip needs PyPI)", venv.display());
    let system_python = std::env::var_os("PYTHON3").unwrap_or_else(|| "python3".into());
    expect_success(
        "python3 -m venv (is python3 with the venv module installed? set PYTHON3 to use another interpreter)",
        run(Command::new(&system_python).arg("-m").arg("venv").arg("--clear").arg(&venv), Duration::from_secs(300)),
    );
    expect_success(
        &format!("pip install {OPENAI_REQUIREMENT} into {}", venv.display()),
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input", OPENAI_REQUIREMENT])
                .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            INSTALL_TIMEOUT,
        ),
    );
    assert!(openai_ready(&python), "openai installed into {} but `{CHECK_OPENAI}` still fails", venv.display());
    eprintln!("venv ready in {:.1?}", started.elapsed());
    python
}

#[tokio::test(flavor = "multi_thread")]
async fn official_openai_python_client() {
    let started = Instant::now();
    let python =
        tokio::task::spawn_blocking(ensure_venv).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let setup = started.elapsed();

    let server = TestServer::start().await;
    let ran = Instant::now();
    let output = run_script(python, "openai_client.py", vec![server.url("/v1")]).await;
    let script_time = ran.elapsed();
    server.stop().await.expect("server stops");

    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut results: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut versions = None;
    for line in stdout.lines().filter(|line| !line.trim().is_empty()) {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line from the script ({e}): {line}"));
        if value.get("openai").is_some() {
            versions = Some(value);
            continue;
        }
        let case = value["case"].as_str().unwrap_or_else(|| panic!("a line without case: {line}")).to_owned();
        assert!(results.insert(case.clone(), value).is_none(), "case {case} reported twice");
    }
    let versions = versions.unwrap_or_else(|| panic!("the script did not print its versions\n--- stdout\n{stdout}"));
    eprintln!(
        "openai {} (python {})",
        versions["openai"].as_str().unwrap_or("?"),
        versions["python"].as_str().unwrap_or("?")
    );
    let missing: Vec<_> = CASES.iter().filter(|case| !results.contains_key(**case)).collect();
    assert!(missing.is_empty(), "cases missing from the script's output: {missing:?}\n--- stdout\n{stdout}");
    let unknown: Vec<_> = results.keys().filter(|case| !CASES.contains(&case.as_str())).collect();
    assert!(unknown.is_empty(), "cases the test does not know: {unknown:?}");
    for case in CASES {
        let result = &results[*case];
        match result["status"].as_str() {
            Some("ok") => eprintln!("ok      {case}"),
            other => panic!("case {case}: status {other:?}: {result}"),
        }
    }
    eprintln!("venv setup {setup:.1?}, script {script_time:.1?}");
}

/// The official client against a server with API keys (`tests/python/openai_keys.py`): with the key it
/// streams a chat and lists the models; with a wrong key, or none, it raises `AuthenticationError` (401).
#[tokio::test(flavor = "multi_thread")]
async fn official_openai_python_client_with_api_keys() {
    let python =
        tokio::task::spawn_blocking(ensure_venv).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let key = "sk-python-test";
    let settings = agentmux::http::Settings { api_keys: vec![key.into()], ..agentmux::http::Settings::default() };
    let server =
        TestServer::with(agentmux::hub::HubConfig::default(), settings, agentmux::agent::Agents::builtin()).await;
    let output = run_script(python, "openai_keys.py", vec![server.url("/v1"), key.to_owned()]).await;
    server.stop().await.expect("server stops");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let cases: BTreeMap<String, serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .map(|value| (value["case"].as_str().unwrap_or_default().to_owned(), value))
        .collect();
    assert!(cases["with_key"]["models"].as_array().is_some_and(|m| !m.is_empty()), "{stdout}");
    assert_eq!(cases["wrong_key"]["status_code"], 401, "{stdout}");
    assert_eq!(cases["wrong_key"]["code"], "invalid_api_key", "{stdout}");
    assert_eq!(cases["no_key"]["status_code"], 401, "{stdout}");
    assert_eq!(cases["no_key"]["code"], "missing_credentials", "no Authorization reached the server: {stdout}");
}

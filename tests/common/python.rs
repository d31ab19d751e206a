//! Python packages for the tests: the official `openai` and `anthropic` clients and the OpenAPI validator
//! `openapi-spec-validator`, in a virtualenv at
//! `target/py-venv`, made with `python3 -m venv` and `pip install` (`venv.rs`) the first time (or when an import fails)
//! and reused afterwards; a lock file keeps two test processes from building it at once. Nothing is skipped:
//! without `python3` or PyPI a test fails and says why. Scripts live in `tests/python/` and talk to 127.0.0.1
//! only; pip is the one thing that goes to the network.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use super::command::{expect_success, run};

/// The pins: `openai` 1.97.2 is the first release that does not wrap named SSE events (`docs/clients.md`, "OpenAI chat, streaming");
/// `anthropic` 2 is the current major; `openapi-spec-validator` 0.7 is the first that validates OpenAPI 3.1.
const REQUIREMENTS: &[&str] = &["openai>=1.97.2,<4", "anthropic>=2,<3", "openapi-spec-validator>=0.7,<1"];
/// Exits 0 when the venv's packages import and satisfy [`REQUIREMENTS`].
const CHECK: &str = "import sys, openai, anthropic, openapi_spec_validator
version = lambda m: tuple(int(p) for p in m.__version__.split('.')[:3] if p.isdigit())
sys.exit(0 if (1, 97, 2) <= version(openai) < (4,) and (2,) <= version(anthropic) < (3,) else 3)";
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `tests/python/<name>` with `args` in the venv, talking to loopback only (no proxy, no client
/// settings from the environment); panics with its output unless it succeeds.
pub(crate) async fn run_script(python: PathBuf, name: &'static str, args: Vec<String>) -> Output {
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
                .env_remove("OPENAI_API_KEY")
                .env_remove("ANTHROPIC_BASE_URL")
                .env_remove("ANTHROPIC_API_KEY"),
            SCRIPT_TIMEOUT,
        )
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    expect_success(&format!("tests/python/{name}"), output)
}

/// A script's output lines (one JSON object each, naming its `case`), by case.
pub(crate) fn cases(output: &Output) -> BTreeMap<String, Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .map(|value| (value["case"].as_str().unwrap_or_default().to_owned(), value))
        .collect()
}

fn ready(python: &Path) -> bool {
    python.is_file()
        && run(Command::new(python).args(["-c", CHECK]), Duration::from_secs(60))
            .is_ok_and(|output| output.status.success())
}

/// Makes sure `target/py-venv` has the packages (see `venv.rs`); returns the venv's python.
pub(crate) fn ensure_venv() -> PathBuf {
    let install: Vec<std::ffi::OsString> = REQUIREMENTS.iter().map(Into::into).collect();
    super::venv::locked("py-venv", &install, ready, |_| {})
}

//! The Python package (`clients/python`) passes its own pytest suite against the agentmux binary cargo
//! built: every producer helper and streaming handle read back by a snapshot and a CUI watcher; a 1,000-token
//! loop in far fewer POSTs, seen whole and in order by a reader; an append whose answer a proxy dropped,
//! retried and kept once; a refused append raised by the next call; the context manager's `error` end; a
//! watcher resumed across a connection cut mid-event (CUI and OpenAI) with every message once;
//! `LaggedError` and `EpochChangedError`; every fixture reduced as the service's snapshot; the generated
//! types current and the package type-checked (mypy --strict); refusals a retry may fix retried (a
//! `retry-after` waited), others not; sync and async alike. The venv is made by
//! `common::python_package::ensure_venv` (pip, the first time).

mod common;

use std::process::Command;
use std::time::Duration;

use common::command::{expect_success, run};

/// The suite's own tests; fewer passing means some were not collected.
const TESTS: u32 = 66;

#[test]
fn the_python_package_passes_its_own_tests() {
    let python = common::python_package::ensure_venv();
    let dir = common::python_package::package_dir();
    let mut pytest = Command::new(&python);
    pytest
        .args(["-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=120"])
        .current_dir(&dir)
        .env("AGENTMUX_BIN", env!("CARGO_BIN_EXE_agentmux"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    let output = expect_success("pytest (clients/python)", run(&mut pytest, Duration::from_secs(900)));
    let out = String::from_utf8_lossy(&output.stdout);
    let summary = out.lines().rev().find(|line| line.contains(" passed")).unwrap_or_default();
    // "47 passed in 12.1s", "1 failed, 46 passed in 12.1s": the number before each word.
    let count = |word: &str| {
        summary.split(',').find_map(|part| {
            let mut words = part.split_whitespace();
            let n = words.next()?.parse::<u32>().ok()?;
            (words.next() == Some(word)).then_some(n)
        })
    };
    let passed = count("passed");
    assert!(passed.is_some_and(|n| n >= TESTS), "pytest passed {passed:?} tests (at least {TESTS} expected):\n{out}");
    for word in ["failed", "error", "errors", "skipped", "xfailed", "xpassed"] {
        assert!(count(word).is_none(), "pytest: {summary}\n{out}");
    }
}

//! The TypeScript client (`clients/typescript`) passes its own tests, `npm test` in its folder, against the
//! agentmux binary cargo built: its generated types equal what `docs/schemas` generate, it compiles, every
//! fixture case reduced by its `reduce` serialises to the service's snapshot, and, in Node and in headless
//! Chromium (the page on an origin of its own, importing the module the service serves), its watcher resumes
//! a connection dropped mid-event exactly once, reads with a read token and is refused a write through one,
//! sees a cancel and an end, closes its connection on an abort, starts and watches a chat run, and reports
//! a changed epoch as an `EpochChangedError`, retries an append whose answer a proxy cut and lands it once,
//! chains appends with `after`, and ends a message and a block; in Node, a watcher left behind past the retention gets a
//! `LaggedError`; in Chromium, the React hook shows a run live and closes its connection when unmounted.
//! Node, the package's dependencies and Chromium are installed here when missing.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::command::{expect_success, run};

#[test]
fn the_typescript_client_passes_its_own_tests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients").join("typescript");
    common::node::npm_install(&dir);
    common::browser::ensure_chromium();
    let mut test = Command::new("npm");
    test.args(["test"]).current_dir(&dir).env("AGENTMUX_BIN", env!("CARGO_BIN_EXE_agentmux"));
    let output = expect_success("npm test (clients/typescript)", run(&mut test, Duration::from_secs(600)));
    let out = String::from_utf8_lossy(&output.stdout);
    let passed = out.lines().find_map(|line| line.strip_prefix("# pass ")).and_then(|n| n.trim().parse::<u32>().ok());
    assert!(passed.is_some_and(|n| n >= 46), "npm test passed {passed:?} tests:\n{out}");
    assert!(out.contains("# fail 0"), "{out}");
}

//! The Python package `clients/python` installed for the tests that run it (its own pytest suite,
//! `tests/client_python_package.rs`, and the bridges' tests): a virtualenv at `target/py-client-venv` with
//! `pip install -e 'clients/python[dev]'`, made the first time and again whenever `pyproject.toml` changes
//! (a stamp in the venv keeps the text it was installed from), so a dependency added to the `dev` extra is
//! installed by the next run. The lock and the install are `venv.rs`'s.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::command::run;

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The package's folder, `clients/python`.
pub(crate) fn package_dir() -> PathBuf {
    manifest_dir().join("clients").join("python")
}

/// Whether the venv has this checkout's package installed from the current `pyproject.toml`.
fn ready(python: &Path, stamp: &Path, pyproject: &str) -> bool {
    if !python.is_file() || std::fs::read_to_string(stamp).ok().as_deref() != Some(pyproject) {
        return false;
    }
    let src = package_dir().join("src");
    let check = format!(
        "import sys, pathlib, agentmux, httpx_sse, pytest\n\
         sys.exit(0 if pathlib.Path(agentmux.__file__).resolve().is_relative_to(pathlib.Path({:?}).resolve()) else 3)",
        src.display().to_string()
    );
    run(Command::new(python).args(["-c", &check]), Duration::from_secs(60)).is_ok_and(|output| output.status.success())
}

/// Makes sure `target/py-client-venv` has `clients/python[dev]` installed (editable); returns the venv's
/// python.
pub(crate) fn ensure_venv() -> PathBuf {
    let package = package_dir();
    let pyproject = std::fs::read_to_string(package.join("pyproject.toml"))
        .unwrap_or_else(|e| panic!("read {}: {e}", package.join("pyproject.toml").display()));
    let stamp = |venv: &Path| venv.join("agentmux-pyproject.stamp");
    let install = ["-e".into(), format!("{}[dev]", package.display()).into()];
    super::venv::locked(
        "py-client-venv",
        &install,
        |python| python.parent().and_then(Path::parent).is_some_and(|venv| ready(python, &stamp(venv), &pyproject)),
        |venv| {
            std::fs::write(stamp(venv), &pyproject).unwrap_or_else(|e| panic!("write {}: {e}", stamp(venv).display()))
        },
    )
}

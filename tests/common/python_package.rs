//! The Python package `clients/python` installed for the tests that run it (its own pytest suite,
//! `tests/client_python_package.rs`, and the bridges' tests): a virtualenv at `target/py-client-venv` with
//! `pip install -e 'clients/python[dev]'`, made the first time and again whenever `pyproject.toml` changes
//! (a stamp in the venv keeps the text it was installed from), so a dependency added to the `dev` extra is
//! installed by the next run. An exclusive lock on `target/py-client-venv.lock` keeps two test processes from
//! building it at once. Nothing is skipped: without `python3` or PyPI the test fails and says why.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::command::{expect_success, run};

const INSTALL_TIMEOUT: Duration = Duration::from_secs(900);

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The package's folder, `clients/python`.
pub(crate) fn package_dir() -> PathBuf {
    manifest_dir().join("clients").join("python")
}

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) { venv.join("Scripts").join("python.exe") } else { venv.join("bin").join("python") }
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
    let target = manifest_dir().join("target");
    std::fs::create_dir_all(&target).unwrap_or_else(|e| panic!("create {}: {e}", target.display()));
    let venv = target.join("py-client-venv");
    let python = venv_python(&venv);
    let stamp = venv.join("agentmux-pyproject.stamp");
    let package = package_dir();
    let pyproject = std::fs::read_to_string(package.join("pyproject.toml"))
        .unwrap_or_else(|e| panic!("read {}: {e}", package.join("pyproject.toml").display()));
    let lock_path = target.join("py-client-venv.lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap_or_else(|e| panic!("open {}: {e}", lock_path.display()));
    lock.lock().unwrap_or_else(|e| panic!("lock {}: {e}", lock_path.display()));
    if ready(&python, &stamp, &pyproject) {
        return python;
    }
    let started = Instant::now();
    eprintln!("installing {} into {} (pip needs PyPI)", package.display(), venv.display());
    if !python.is_file() {
        let system_python = std::env::var_os("PYTHON3").unwrap_or_else(|| "python3".into());
        expect_success(
            "python3 -m venv (is python3 with the venv module installed? set PYTHON3 to use another interpreter)",
            run(Command::new(&system_python).arg("-m").arg("venv").arg(&venv), Duration::from_secs(300)),
        );
    }
    expect_success(
        &format!("pip install -e '{}[dev]' into {}", package.display(), venv.display()),
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-e"])
                .arg(format!("{}[dev]", package.display()))
                .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            INSTALL_TIMEOUT,
        ),
    );
    std::fs::write(&stamp, &pyproject).unwrap_or_else(|e| panic!("write {}: {e}", stamp.display()));
    assert!(ready(&python, &stamp, &pyproject), "clients/python installed into {} but does not import", venv.display());
    eprintln!("venv ready in {:.1?}", started.elapsed());
    python
}

//! A Python virtualenv under `target/` that the tests make themselves: `locked` holds an exclusive lock on
//! `target/<name>.lock` (so a second test process waits, then finds the venv ready), makes the venv with
//! `python3 -m venv` when it has no interpreter, runs `pip install` with the given arguments when `ready`
//! says no, and checks `ready` again. `python.rs` (the official clients) and `python_package.rs`
//! (`clients/python`) differ only in what they install and how they tell it is there. Nothing is skipped:
//! without `python3` or PyPI the test fails and says why.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::command::{expect_success, run};

const INSTALL_TIMEOUT: Duration = Duration::from_secs(900);

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) { venv.join("Scripts").join("python.exe") } else { venv.join("bin").join("python") }
}

/// The venv `target/<name>`, ready by `ready(python)` once `pip install <install>` has run in it; returns
/// its python. `installed` runs after a successful install (e.g. to write a stamp), before `ready` is
/// checked again.
pub(crate) fn locked(
    name: &str,
    install: &[OsString],
    ready: impl Fn(&Path) -> bool,
    installed: impl FnOnce(&Path),
) -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&target).unwrap_or_else(|e| panic!("create {}: {e}", target.display()));
    let venv = target.join(name);
    let python = venv_python(&venv);
    let lock_path = target.join(format!("{name}.lock"));
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap_or_else(|e| panic!("open {}: {e}", lock_path.display()));
    lock.lock().unwrap_or_else(|e| panic!("lock {}: {e}", lock_path.display()));
    if ready(&python) {
        return python;
    }
    let started = Instant::now();
    eprintln!("installing {install:?} into {} (pip needs PyPI)", venv.display());
    if !python.is_file() {
        let system_python = std::env::var_os("PYTHON3").unwrap_or_else(|| "python3".into());
        expect_success(
            "python3 -m venv (is python3 with the venv module installed? set PYTHON3 to use another interpreter)",
            run(Command::new(&system_python).arg("-m").arg("venv").arg("--clear").arg(&venv), Duration::from_secs(300)),
        );
    }
    expect_success(
        &format!("pip install {install:?} into {}", venv.display()),
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input"])
                .args(install)
                .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            INSTALL_TIMEOUT,
        ),
    );
    installed(&venv);
    assert!(ready(&python), "{install:?} installed into {} but the check still fails", venv.display());
    eprintln!("venv ready in {:.1?}", started.elapsed());
    python
}

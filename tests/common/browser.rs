//! Headless Chromium for the tests: Debian's `chromium` and `chromium-driver`, installed with apt-get when
//! missing (never skipped), chromedriver on a loopback port, and a session driven by `fantoccini`.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpStream;

/// Installs Chromium and its driver when missing (as root, with apt-get), once per machine; panics saying
/// why when it cannot.
pub(crate) fn ensure_chromium() {
    let ready =
        || std::path::Path::new("/usr/bin/chromium").exists() && std::path::Path::new("/usr/bin/chromedriver").exists();
    super::command::ensure_debian_packages(ready, &["chromium", "chromium-driver"]);
}

/// A free loopback port (bound, then let go).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a port")
}

/// chromedriver on a loopback port; killed when dropped.
pub(crate) struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    /// Kills chromedriver's whole process group: the Chromium it started goes too, even when its session was
    /// not closed (a failed test), rather than live on as an orphan.
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn start_driver() -> Driver {
    ensure_chromium();
    let port = free_port();
    let child = Command::new("/usr/bin/chromedriver")
        .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()])
        // A group of its own, with the browsers it starts: see `Drop`.
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let driver = Driver { child, url: format!("http://127.0.0.1:{port}") };
    let listening = async || TcpStream::connect(("127.0.0.1", port)).await.is_ok();
    super::wait::eventually("chromedriver to listen", Duration::from_secs(20), listening).await;
    driver
}

pub(crate) async fn browser(driver: &Driver) -> fantoccini::Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        // Nothing outside loopback is ever reached (an image at https://example.com in a fixture stays unloaded).
        json!({"binary": "/usr/bin/chromium", "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        ]}),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    fantoccini::ClientBuilder::new(connector).capabilities(capabilities).connect(&driver.url).await.expect("a session")
}

/// Waits until `script` (a JS expression) is truthy in the page, and returns it.
pub(crate) async fn until(browser: &fantoccini::Client, script: &str, within: Duration) -> Value {
    let holds = async || {
        let value = browser.execute(&format!("return {script};"), vec![]).await.expect("execute");
        (!(value.is_null() || value == json!(false))).then_some(value)
    };
    super::wait::eventually(&format!("`{script}` to hold"), within, holds).await
}

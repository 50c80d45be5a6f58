//! A headless Chromium for the console's test, driven over the W3C WebDriver HTTP API of
//! Debian's `chromedriver` (packages `chromium` and `chromium-driver`; `.ci/run` installs
//! them): a session opens a page and runs scripts in it, so a test reads what the page drew
//! while the page keeps running (no reload between two reads). The driver and the browser
//! are stopped when the [`Browser`] is dropped, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether Chromium and chromedriver are installed; without them a test says so and passes,
/// unless `DISSEM_REQUIRE_CHROMIUM` is set (CI installs them and sets it), which fails it.
pub fn have_chromium() -> bool {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return true;
    }
    assert!(
        std::env::var_os("DISSEM_REQUIRE_CHROMIUM").is_none(),
        "DISSEM_REQUIRE_CHROMIUM is set but {CHROMIUM} or {CHROMEDRIVER} is missing \
         (apt-get install chromium chromium-driver)"
    );
    eprintln!("skipped: no Chromium (apt-get install chromium chromium-driver)");
    false
}

/// A chromedriver process with one headless Chromium session.
#[derive(Debug)]
pub struct Browser {
    driver: Child,
    addr: std::net::SocketAddr,
    session: String,
    profile: PathBuf,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a session (a fresh profile under `dir`).
    pub async fn start(dir: &Path) -> Browser {
        let addr = crate::free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={}", addr.port()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let profile = dir.join("chromium-profile");
        let mut b = Browser {
            driver,
            addr,
            session: String::new(),
            profile,
        };
        crate::wait_for(
            "chromedriver ready",
            Duration::from_secs(30),
            || async move {
                let (code, body) = tokio::time::timeout(
                    Duration::from_secs(5),
                    request(addr, "GET", "/status", ""),
                )
                .await
                .ok()?
                .ok()?;
                (code == 200 && body.contains("\"ready\":true")).then_some(())
            },
        )
        .await;
        // the flags that keep Chromium off the (closed) network and out of a sandbox it
        // cannot have as root in a container
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1200,1000",
        ];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", b.profile.display()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let v = b.call("POST", "/session", &caps).await;
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {v}"))
            .to_string();
        b
    }

    /// One WebDriver call: the answer's `value` (a WebDriver error panics, naming it).
    async fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let body = body.to_string();
        let (code, text) = tokio::time::timeout(
            Duration::from_secs(60),
            request(self.addr, method, path, &body),
        )
        .await
        .unwrap_or_else(|_| panic!("chromedriver {method} {path}: no answer within 60 s"))
        .unwrap_or_else(|e| panic!("chromedriver {method} {path}: {e}"));
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("chromedriver {method} {path}: {e}: {text}"));
        assert_eq!(code, 200, "chromedriver {method} {path}: {v}");
        v["value"].clone()
    }

    /// Opens `url` in the session's window.
    pub async fn open(&self, url: &str) {
        let path = format!("/session/{}/url", self.session);
        self.call("POST", &path, &json!({ "url": url })).await;
    }

    /// Runs `script` (a function body: `return ...`) in the page; its return value.
    pub async fn eval(&self, script: &str) -> Value {
        let path = format!("/session/{}/execute/sync", self.session);
        self.call("POST", &path, &json!({ "script": script, "args": [] }))
            .await
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // ends the session's Chromium; the driver is killed either way
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let addr = self.addr;
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(10),
                        request(addr, "DELETE", &path, ""),
                    )
                    .await
                    .ok()
                })
            })
            .join();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// One HTTP/1.1 request to chromedriver: (status, body). Chromedriver wants a loopback `Host`
/// and keeps the connection open after its answer, so the body is read by its length.
async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).await?;
    let code = status
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).await? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut buf = vec![0; len];
    r.read_exact(&mut buf).await?;
    Ok((code, String::from_utf8_lossy(&buf).into_owned()))
}

//! What a new user of the system expects on day one, through the real `dissem up` on
//! 127.0.0.1:0.

use std::time::Duration;

use tests::{Proc, dissem_bin, runtime, temp_dir, wait_for};

/// One HTTP/1.1 GET on `addr`: (status, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

/// The metrics port answers orchestrators' probes beside `/metrics`: `/healthz` when the
/// process runs, `/readyz` when its services answer.
#[test]
fn the_metrics_port_serves_health_and_readiness() {
    let dir = temp_dir("probes");
    // a free port for the metrics listener (the node prints only its gRPC address on stdout)
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let mut up = Proc::start(
        &dissem_bin(),
        &[
            "up".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--metrics-listen".into(),
            metrics.to_string(),
            "--data".into(),
            dir.join("data").display().to_string(),
        ],
    );
    runtime().block_on(async {
        let _ = up.url();
        let ready = wait_for(
            "the readiness probe",
            Duration::from_secs(30),
            || async move {
                http_get(metrics, "/readyz")
                    .await
                    .ok()
                    .filter(|r| r.0 == 200)
            },
        )
        .await;
        assert_eq!(ready.1.trim(), "ready");
        let (code, body) = http_get(metrics, "/healthz").await.expect("healthz");
        assert_eq!((code, body.trim()), (200, "ok"));
        let (code, body) = http_get(metrics, "/metrics").await.expect("metrics");
        assert_eq!(code, 200);
        assert!(body.contains("# TYPE dissem_"), "{body}");
        let (code, _) = http_get(metrics, "/nope").await.expect("404");
        assert_eq!(code, 404);
    });
    up.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Logs written to a pipe or a file carry no terminal colour codes.
#[test]
fn logs_to_a_pipe_are_plain_text() {
    use std::io::BufRead;
    let dir = temp_dir("plain-logs");
    let mut child = std::process::Command::new(dissem_bin())
        .args(["up", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.join("data"))
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dissem up");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("INFO")) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        seen.iter().any(|l| l.contains("INFO")),
        "no info line within 30 s: {seen:?}"
    );
    assert!(
        seen.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in piped logs: {seen:?}"
    );
}

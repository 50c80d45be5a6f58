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

//! Serving a service's operations endpoints: `/metrics` through `metrics-exporter-prometheus`'s
//! own listener, and `/healthz` (liveness) and `/readyz` (readiness) through a few lines on a
//! tokio `TcpListener`. Used by `examples/ops.rs` and by `tests/ops.rs`, which includes it with
//! `#[path = "../examples/common/ops_http.rs"]`.

use std::net::SocketAddr;
use std::time::SystemTime;

use inoutbox::telemetry::{metric, Health};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Installs the Prometheus recorder, serving `/metrics` on `addr`, with histogram buckets for
/// inoutbox's durations and batch sizes; then describes every inoutbox metric. Call it before
/// building consumers and relays (they take their metric handles when built).
pub fn install_prometheus(
    addr: SocketAddr,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    const SECONDS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0];
    const SIZES: &[f64] = &[1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0];
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)?
        .set_buckets_for_metric(Matcher::Full(metric::INBOX_BATCH_SIZE.into()), SIZES)?
        .install()?;
    metric::describe();
    Ok(())
}

/// Answers `GET /healthz` (200 when every component is live, else 503) and `GET /readyz` (200
/// when every one is ready), with a JSON body of each component's state; 404 otherwise.
pub async fn serve_health(listener: TcpListener, components: Vec<(&'static str, Health)>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let components = components.clone();
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let n = stream.read(&mut request).await.unwrap_or(0);
            let line = String::from_utf8_lossy(&request[..n]);
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let (ok, known) = match path {
                "/healthz" => (components.iter().all(|(_, h)| h.live()), true),
                "/readyz" => (components.iter().all(|(_, h)| h.ready()), true),
                _ => (false, false),
            };
            let status = match (known, ok) {
                (false, _) => "404 Not Found",
                (true, true) => "200 OK",
                (true, false) => "503 Service Unavailable",
            };
            let body = report(&components);
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

/// `{"consumer":{"live":true,"ready":true,...},...}`.
pub fn report(components: &[(&'static str, Health)]) -> String {
    let parts: Vec<String> = components
        .iter()
        .map(|(name, h)| {
            let ago = h
                .last_cycle()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .map_or("null".to_owned(), |d| format!("{:.3}", d.as_secs_f64()));
            format!(
                "\"{name}\":{{\"live\":{},\"ready\":{},\"joined\":{},\"database\":{},\
                 \"last_cycle_seconds_ago\":{ago}}}",
                h.live(),
                h.ready(),
                h.joined(),
                h.database_reachable()
            )
        })
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// `GET path` on `addr`: the status code and the body (for the example's self-check and the
/// test).
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned());
    Ok((status, body))
}

//! [`OpsEndpoint`]: the three paths, answered over hyper's HTTP/1 server until shutdown.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::prometheus::{Prometheus, UPKEEP};
use crate::shutdown::CancellationToken;
use crate::telemetry::Health;

/// The longest a client may take to send its request line and headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The operations endpoint: `/metrics` from a [`Prometheus`] recorder, `/healthz` and
/// `/readyz` from the [`Health`] of each part (see the [module docs](super)).
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct OpsEndpoint {
    parts: Vec<(String, Health)>,
    metrics: Option<Prometheus>,
}

/// What one request gets: status, content type, body.
struct Answer {
    status: StatusCode,
    content_type: &'static str,
    body: String,
}

impl OpsEndpoint {
    /// An endpoint with no part and no metrics: add them with [`part`](Self::part) and
    /// [`metrics`](Self::metrics).
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `/metrics` from `prometheus` (without it, `/metrics` answers 404).
    pub fn metrics(mut self, prometheus: Prometheus) -> Self {
        self.metrics = Some(prometheus);
        self
    }

    /// A part whose health the probes report under `name` (a consumer group, `relay`, ...).
    pub fn part(mut self, name: impl Into<String>, health: Health) -> Self {
        self.parts.push((name.into(), health));
        self
    }

    /// Answers requests on `listener` until `shutdown` is cancelled (a connection in hand
    /// finishes its request).
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        let this = Arc::new(self);
        let upkeep = this.metrics.clone().map(|prometheus| {
            let stop = shutdown.clone();
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    prometheus.upkeep();
                    tokio::select! {
                        () = tokio::time::sleep(UPKEEP) => {}
                        () = stop.cancelled() => {}
                    }
                }
            })
        });
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = shutdown.cancelled() => break,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, say: wait a little rather than spin.
                    tracing::warn!(target: "inoutbox::ops", %error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            tokio::spawn(connection(this.clone(), stream));
        }
        if let Some(upkeep) = upkeep {
            upkeep.abort();
        }
    }

    /// The answer to `method path`.
    fn answer(&self, method: &Method, path: &str) -> Answer {
        if method != Method::GET && method != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".to_owned());
        }
        let probe = |ok: bool| Answer {
            status: if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            content_type: "application/json",
            body: self.report(),
        };
        match path {
            "/metrics" => match &self.metrics {
                Some(prometheus) => Answer {
                    status: StatusCode::OK,
                    content_type: PROMETHEUS_TEXT,
                    body: prometheus.render(),
                },
                None => text(
                    StatusCode::NOT_FOUND,
                    "no Prometheus recorder: this endpoint serves health only\n".to_owned(),
                ),
            },
            "/healthz" => probe(self.parts.iter().all(|(_, h)| h.live())),
            "/readyz" => probe(self.parts.iter().all(|(_, h)| h.ready())),
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: GET /metrics, /healthz or /readyz\n".to_owned(),
            ),
        }
    }

    /// `{"billing":{"live":true,"ready":true,"joined":true,"database":true,
    /// "last_cycle_seconds_ago":0.25},...}`.
    fn report(&self) -> String {
        let parts: serde_json::Map<String, serde_json::Value> = self
            .parts
            .iter()
            .map(|(name, h)| {
                let ago = h
                    .last_cycle()
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .map(|d| d.as_secs_f64());
                let state = serde_json::json!({
                    "live": h.live(),
                    "ready": h.ready(),
                    "joined": h.joined(),
                    "database": h.database_reachable(),
                    "last_cycle_seconds_ago": ago,
                });
                (name.clone(), state)
            })
            .collect();
        let mut body = serde_json::Value::Object(parts).to_string();
        body.push('\n');
        body
    }
}

fn text(status: StatusCode, body: String) -> Answer {
    Answer {
        status,
        content_type: "text/plain; charset=utf-8",
        body,
    }
}

/// Serves one connection (HTTP/1, keep-alive allowed).
async fn connection(endpoint: Arc<OpsEndpoint>, stream: tokio::net::TcpStream) {
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let answer = endpoint.answer(request.method(), request.uri().path());
        let head = request.method() == Method::HEAD;
        async move {
            let body = if head { String::new() } else { answer.body };
            let mut response = Response::new(Full::new(Bytes::from(body)));
            *response.status_mut() = answer.status;
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(answer.content_type),
            );
            Ok::<_, Infallible>(response)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(error) = served {
        tracing::debug!(target: "inoutbox::ops", %error, "an operations endpoint connection failed");
    }
}

#[cfg(test)]
mod tests {
    use super::{Method, OpsEndpoint, StatusCode};
    use crate::telemetry::Health;

    #[test]
    fn probes_follow_every_part_and_unknown_paths_are_not_found() {
        let (consumer, relay) = (Health::default(), Health::default());
        let endpoint = OpsEndpoint::new()
            .part("billing", consumer.clone())
            .part("relay", relay.clone());
        let status = |path: &str| endpoint.answer(&Method::GET, path).status;
        assert_eq!(status("/healthz"), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status("/readyz"), StatusCode::SERVICE_UNAVAILABLE);
        for h in [&consumer, &relay] {
            h.set_live(true);
        }
        assert_eq!(status("/healthz"), StatusCode::OK);
        assert_eq!(
            status("/readyz"),
            StatusCode::SERVICE_UNAVAILABLE,
            "not joined"
        );
        consumer.set_joined(true);
        assert_eq!(
            status("/readyz"),
            StatusCode::SERVICE_UNAVAILABLE,
            "relay not joined"
        );
        relay.set_joined(true);
        assert_eq!(status("/readyz"), StatusCode::OK);
        let body = endpoint.answer(&Method::GET, "/readyz").body;
        assert!(
            body.contains(r#""billing":{"database":true,"joined":true"#),
            "{body}"
        );
        relay.set_live(false);
        assert_eq!(status("/healthz"), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status("/metrics"), StatusCode::NOT_FOUND, "no recorder");
        assert_eq!(status("/"), StatusCode::NOT_FOUND);
        let post = endpoint.answer(&Method::POST, "/readyz").status;
        assert_eq!(post, StatusCode::METHOD_NOT_ALLOWED);
    }
}

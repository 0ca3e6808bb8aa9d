//! (Feature `http`.) The operations endpoint of an [`App`]: `/metrics`, `/healthz` and
//! `/readyz` for every part it runs (see [`crate::ops`]).

use std::net::SocketAddr;

use super::{App, AppError};
use crate::ops::{install_labelled, OpsEndpoint, OpsError};
use crate::shutdown::CancellationToken;
use crate::telemetry::metric::LABEL_TRANSPORT;

impl App {
    /// Serves the operations endpoint on `addr` while the app runs: `GET /metrics` (every
    /// inoutbox metric in the Prometheus text format), `GET /healthz` (200 while every part
    /// is live, else 503) and `GET /readyz` (200 while every part is ready: joined, its
    /// database answering), the probes with a JSON body of each part's [`Health`](crate::telemetry::Health).
    ///
    /// [`run`](Self::run) installs the process-wide Prometheus recorder
    /// ([`ops::install_prometheus`](crate::ops::install_prometheus)) before it builds the
    /// parts, with the label `transport` (`kafka` or `nats`: [`App::transport`]) on every
    /// metric (unless that function installed it before: its labels stay), and fails with
    /// [`AppError::Ops`] if another `metrics` recorder is installed or `addr` cannot be bound.
    /// The endpoint answers until every part has stopped.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), inoutbox::AppError> {
    /// inoutbox::App::from_env()
    ///     .await?
    ///     .consumer("billing", ["orders"])
    ///     .relay()
    ///     .ops_endpoint(([0, 0, 0, 0], 9000).into())
    ///     .run()
    ///     .await
    /// # }
    /// ```
    pub fn ops_endpoint(mut self, addr: SocketAddr) -> Self {
        self.ops = Some(addr);
        self
    }

    /// Installs the recorder, binds the endpoint's address and serves it until the returned
    /// token is cancelled; `None` without [`ops_endpoint`](Self::ops_endpoint).
    pub(super) async fn start_ops(&self) -> Result<Option<CancellationToken>, AppError> {
        let Some(addr) = self.ops else {
            return Ok(None);
        };
        let prometheus = install_labelled(&[(LABEL_TRANSPORT, self.transport())])?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| OpsError::Bind { addr, source })?;
        let endpoint = self
            .health()
            .iter()
            .fold(OpsEndpoint::new().metrics(prometheus), |e, (name, h)| {
                e.part(name.clone(), h.clone())
            });
        let stop = CancellationToken::new();
        tokio::spawn(endpoint.serve(listener, stop.clone()));
        tracing::info!(target: "inoutbox::app", %addr, "operations endpoint: /metrics, /healthz, /readyz");
        Ok(Some(stop))
    }
}

//! (Feature `http`.) The operations endpoint of a service: `GET /metrics` (every inoutbox
//! metric in the Prometheus text format), `GET /healthz` (liveness: 200 while every part
//! runs) and `GET /readyz` (readiness: 200 while every part is joined and its database
//! answers), each probe with a JSON body of every part's state.
//!
//! [`App::ops_endpoint`](crate::app::App::ops_endpoint) serves it for the parts of an app; a
//! service built from the builders serves it with [`OpsEndpoint`]:
//!
//! ```no_run
//! # async fn demo(consumer: inoutbox::Consumer<inoutbox::PgStore, inoutbox::KafkaConfig>) -> Result<(), Box<dyn std::error::Error>> {
//! use inoutbox::ops::{install_prometheus, OpsEndpoint};
//!
//! // First the recorder: consumers and relays take their metric handles when built.
//! let prometheus = install_prometheus()?;
//! let endpoint = OpsEndpoint::new()
//!     .metrics(prometheus)
//!     .part("billing", consumer.health());
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:9000").await?;
//! let stop = inoutbox::shutdown::CancellationToken::new();
//! tokio::spawn(endpoint.serve(listener, stop.clone()));
//! consumer.run_until_cancelled(stop).await?;
//! # Ok(()) }
//! ```
//!
//! Built on hyper's HTTP/1 server alone (no router, no TLS: put it behind the cluster's
//! network policy; it serves nothing secret, and reads nothing but the request line and
//! headers, with a 10 s limit on them).

mod prometheus;
mod serve;

pub(crate) use prometheus::install_labelled;
pub use prometheus::{install_prometheus, Prometheus};
pub use serve::OpsEndpoint;

/// Why the operations endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The Prometheus recorder could not be installed (another `metrics` recorder is already
    /// installed in this process, or a bucket setting was refused).
    #[error("cannot install the Prometheus recorder: {0}")]
    Recorder(String),
    /// The listening address could not be bound.
    #[error("cannot listen on {addr} for the operations endpoint: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

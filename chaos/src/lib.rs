//! A fault-injecting TCP proxy for inoutbox's tests and benchmarks, in the manner of Toxiproxy's
//! toxics: it sits between a service and PostgreSQL or a broker, on 127.0.0.1, and the test
//! changes what the network does while it runs.
//!
//! - **latency** with uniform **jitter**, per chunk, in each direction (order is kept);
//! - **bandwidth**: bytes per second, per direction of each connection;
//! - **blackhole**: a partition as TCP sees it: bytes are read and dropped, nothing is
//!   forwarded, no socket is closed (a close or reset crosses only when the link heals);
//!   a new connection is accepted and connected upstream only after the heal;
//! - **reset**: every open connection is closed with RST (`SO_LINGER` 0) on both sides;
//! - **refuse**: the listening socket is closed, so new connections are refused
//!   (`ECONNREFUSED`); open ones carry on.
//!
//! Each proxy runs on a thread of its own (a single-threaded Tokio runtime), so it is used the
//! same way from synchronous code, a test's runtime or a benchmark, and keeps forwarding while
//! the caller blocks.
//!
//! ```
//! use std::io::{Read, Write};
//! use std::time::{Duration, Instant};
//! use inoutbox_chaos::Proxy;
//!
//! // An echo server stands in for PostgreSQL or the broker.
//! let server = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let upstream = server.local_addr()?;
//! std::thread::spawn(move || {
//!     for mut conn in server.incoming().flatten() {
//!         std::thread::spawn(move || std::io::copy(&mut conn.try_clone()?, &mut conn));
//!     }
//! });
//!
//! let proxy = Proxy::start(upstream)?;
//! proxy.set_latency(Duration::from_millis(20), Duration::from_millis(5));
//! let mut client = std::net::TcpStream::connect(proxy.addr())?;
//! let started = Instant::now();
//! client.write_all(b"ping")?;
//! let mut answer = [0u8; 4];
//! client.read_exact(&mut answer)?;
//! assert_eq!(&answer, b"ping");
//! assert!(started.elapsed() >= Duration::from_millis(30), "15..25 ms each way");
//!
//! proxy.blackhole();          // a partition: writes succeed, nothing arrives, nothing closes
//! proxy.heal();
//! proxy.reset_all();          // RST to both sides of every open connection
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! To fault only some clients of a proxy (one consumer process among several that all reach
//! the broker through it), give them a [`Link`] of their own with [`Proxy::link`].

#![warn(missing_docs)]

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};

mod conn;
mod link;
mod timer;

use link::{lock, PeerFilter};
pub use link::{Link, Stats, Toxics};

/// The links chosen by predicates, in the order they were added.
type Links = Arc<Mutex<Vec<(PeerFilter, Link)>>>;

/// A fault-injecting TCP proxy listening on 127.0.0.1, forwarding to one upstream address.
///
/// The toxic setters of `Proxy` apply to its default link: every connection that no
/// [`Proxy::link`] predicate picked. Dropping the proxy closes its listener and connections.
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    default: Link,
    links: Links,
    refuse: watch::Sender<bool>,
    listening: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("toxics", &self.toxics())
            .finish()
    }
}

impl Proxy {
    /// Starts a proxy on a free port of 127.0.0.1, forwarding to `upstream` (which need not
    /// be listening yet: each connection connects upstream when it is accepted).
    pub fn start(upstream: impl ToSocketAddrs) -> io::Result<Proxy> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream)
    }

    /// Starts a proxy listening on `listen`, forwarding to `upstream`.
    pub fn start_on(listen: SocketAddr, upstream: impl ToSocketAddrs) -> io::Result<Proxy> {
        let upstream = upstream
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no upstream address"))?;
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let default = Link::default();
        let links: Links = Arc::default();
        let (refuse, refused) = watch::channel(false);
        let (listening_tx, listening) = watch::channel(true);
        let (stop, stopped) = oneshot::channel();
        let accept = Acceptor {
            addr,
            upstream,
            default: default.clone(),
            links: links.clone(),
            refuse: refused,
            listening: listening_tx,
        };
        let thread = std::thread::Builder::new()
            .name(format!("inoutbox-chaos {addr}"))
            .spawn(move || runtime.block_on(accept.run(listener, stopped)))?;
        Ok(Proxy {
            addr,
            upstream,
            default,
            links,
            refuse,
            listening,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// A link of its own for the clients `matches` picks (by their address, when their
    /// connection is accepted; the first matching link wins). Its toxics start cleared and
    /// are independent of the proxy's.
    pub fn link(&self, matches: impl Fn(SocketAddr) -> bool + Send + Sync + 'static) -> Link {
        let link = Link::default();
        lock(&self.links).push((Box::new(matches), link.clone()));
        link
    }

    /// The default link (every connection no [`Proxy::link`] picked).
    pub fn default_link(&self) -> Link {
        self.default.clone()
    }

    /// The default link's toxics.
    pub fn toxics(&self) -> Toxics {
        self.default.toxics()
    }

    /// Replaces every toxic of the default link.
    pub fn set_toxics(&self, toxics: Toxics) {
        self.default.set_toxics(toxics);
    }

    /// Adds `latency` ± `jitter` (uniform) to every chunk in each direction.
    pub fn set_latency(&self, latency: Duration, jitter: Duration) {
        self.default.set_latency(latency, jitter);
    }

    /// Limits each direction of each connection to `bytes_per_second` (`None`: no limit).
    pub fn set_bandwidth(&self, bytes_per_second: Option<u64>) {
        self.default.set_bandwidth(bytes_per_second);
    }

    /// Starts (`true`) or heals (`false`) a partition; see [`Link::set_blackhole`].
    pub fn set_blackhole(&self, on: bool) {
        self.default.set_blackhole(on);
    }

    /// Starts a partition; see [`Link::set_blackhole`].
    pub fn blackhole(&self) {
        self.default.blackhole();
    }

    /// Ends a partition.
    pub fn heal(&self) {
        self.default.heal();
    }

    /// Removes every toxic of the default link and accepts connections again.
    pub fn clear(&self) {
        self.default.clear();
        self.set_refuse(false);
    }

    /// Closes every open connection of every link with a reset (RST) on both sides; returns
    /// how many there were.
    pub fn reset_all(&self) -> usize {
        let links = lock(&self.links);
        self.default.reset() + links.iter().map(|(_, l)| l.reset()).sum::<usize>()
    }

    /// Refuses new connections (`true`: the listening socket is closed, connecting fails with
    /// `ECONNREFUSED`) or accepts them again on the same port (`false`). Open connections are
    /// not touched. Returns once the listener is closed or listening again.
    pub fn set_refuse(&self, on: bool) {
        self.refuse.send_replace(on);
        let deadline = Instant::now() + Duration::from_secs(10);
        while *self.listening.borrow() == on && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Counters summed over every link.
    pub fn stats(&self) -> Stats {
        let links = lock(&self.links);
        links
            .iter()
            .fold(self.default.stats(), |sum, (_, l)| sum + l.stats())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The proxy's accept loop, on its thread.
struct Acceptor {
    addr: SocketAddr,
    upstream: SocketAddr,
    default: Link,
    links: Links,
    refuse: watch::Receiver<bool>,
    listening: watch::Sender<bool>,
}

impl Acceptor {
    async fn run(mut self, listener: std::net::TcpListener, mut stop: oneshot::Receiver<()>) {
        let mut listener = TcpListener::from_std(listener).ok();
        loop {
            let refusing = *self.refuse.borrow_and_update();
            if refusing {
                listener = None;
            } else if listener.is_none() {
                listener = self.rebind().await;
            }
            self.listening.send_replace(listener.is_some());
            let Some(l) = &listener else {
                tokio::select! {
                    changed = self.refuse.changed() => if changed.is_err() { return },
                    _ = &mut stop => return,
                }
                continue;
            };
            tokio::select! {
                accepted = l.accept() => {
                    if let Ok((stream, peer)) = accepted {
                        let link = self.link_for(peer);
                        tokio::spawn(conn::serve(stream, peer, self.upstream, link));
                    }
                }
                changed = self.refuse.changed() => if changed.is_err() { return },
                _ = &mut stop => return,
            }
        }
    }

    fn link_for(&self, peer: SocketAddr) -> Link {
        lock(&self.links)
            .iter()
            .find(|(matches, _)| matches(peer))
            .map_or_else(|| self.default.clone(), |(_, link)| link.clone())
    }

    /// Listens on the proxy's address again, retrying while the port is briefly taken.
    async fn rebind(&self) -> Option<TcpListener> {
        for _ in 0..1000 {
            let socket = if self.addr.is_ipv4() {
                TcpSocket::new_v4()
            } else {
                TcpSocket::new_v6()
            }
            .ok()?;
            let _ = socket.set_reuseaddr(true);
            if socket.bind(self.addr).is_ok() {
                if let Ok(l) = socket.listen(1024) {
                    return Some(l);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }
}

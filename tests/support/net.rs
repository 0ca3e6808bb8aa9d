//! A bad network for the integration tests: PostgreSQL and a Tansu broker behind
//! fault-injecting proxies (`inoutbox-chaos`), and a way to fault only one child process's
//! connections.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use inoutbox_chaos::Proxy;

use super::{database_url, free_port, Broker, TestDb};

/// A Tansu broker whose every client stays behind a proxy: Tansu listens on one port and
/// advertises the proxy's, so the addresses clients learn from metadata lead through it too.
pub struct ProxiedBroker {
    pub broker: Broker,
    pub proxy: Proxy,
}

impl ProxiedBroker {
    pub fn start() -> Self {
        let listen = free_port();
        let proxy = Proxy::start(("127.0.0.1", listen)).expect("start the broker's proxy");
        let listener = format!("tcp://127.0.0.1:{listen}");
        let advertised = format!("tcp://{}", proxy.addr());
        let bin = std::env::var("TANSU_BIN").unwrap_or_else(|_| "tansu".to_owned());
        let child = Command::new(&bin)
            .args(["broker", "--listener-url", &listener])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start the Tansu broker (`{bin}`): {e}\ninstall it with: scripts/install-tansu")
            });
        let addr = format!("127.0.0.1:{listen}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "Tansu did not listen on {addr} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let broker = Broker {
            child,
            brokers: proxy.addr().to_string(),
        };
        Self { broker, proxy }
    }

    /// The bootstrap address clients use: the proxy's.
    pub fn brokers(&self) -> &str {
        &self.broker.brokers
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        self.broker.create_topic(topic, partitions).await
    }
}

/// The address of the test's PostgreSQL server (from `DATABASE_URL`).
pub fn postgres_addr() -> SocketAddr {
    server_addr(&database_url(), 5432)
}

/// The server address a database URL names (`default_port` when it names none).
fn server_addr(url: &str, default_port: u16) -> SocketAddr {
    let (_, authority, _) = split_authority(url);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let with_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    };
    with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("cannot resolve the server address of {url}"))
}

/// A proxy in front of the MariaDB server `url` names, and `url` through it.
#[cfg(feature = "mysql")]
pub fn mysql_proxy(url: &str) -> (Proxy, String) {
    let proxy = Proxy::start(server_addr(url, 3306)).expect("start the MariaDB proxy");
    let through = url_through(url, &proxy, &[]);
    (proxy, through)
}

/// A proxy in front of the test's PostgreSQL server.
pub fn postgres_proxy() -> Proxy {
    Proxy::start(postgres_addr()).expect("start the PostgreSQL proxy")
}

/// `db`'s connection URL (its schema on the search path), through `proxy`, with `extra` query
/// parameters (e.g. `application_name=relay-1`).
pub fn url_via(db: &TestDb, proxy: &Proxy, extra: &[&str]) -> String {
    url_through(&db.url(), proxy, extra)
}

/// `url` with `proxy` for its host and port, and `extra` query parameters.
fn url_through(url: &str, proxy: &Proxy, extra: &[&str]) -> String {
    let (scheme, authority, rest) = split_authority(url);
    let user = authority
        .rsplit_once('@')
        .map_or(String::new(), |(u, _)| format!("{u}@"));
    let mut out = format!("{scheme}{user}{}{rest}", proxy.addr());
    for param in extra {
        out.push(if out.contains('?') { '&' } else { '?' });
        out.push_str(param);
    }
    out
}

/// `(scheme://, authority, /path?query)` of a URL.
fn split_authority(url: &str) -> (&str, &str, &str) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    (&url[..start], &url[start..end], &url[end..])
}

/// A predicate for [`Proxy::link`]: whether a client connection to `proxy` comes from process
/// `pid` (Linux: the client socket's inode, from /proc/net/tcp, among the process's fds).
pub fn from_process(pid: u32, proxy: SocketAddr) -> impl Fn(SocketAddr) -> bool + Send + Sync {
    move |peer| socket_inode(peer, proxy).is_some_and(|inode| has_socket(pid, inode))
}

/// The inode of the socket whose local address is `local` and remote address `remote`.
fn socket_inode(local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        ),
        SocketAddr::V6(v6) => format!("{:04X}", v6.port()),
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == local && f[2] == remote)
            .then(|| f[9].parse().ok())
            .flatten()
    })
}

fn has_socket(pid: u32, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| target.to_string_lossy() == want)
    })
}

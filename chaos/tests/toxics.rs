//! Each toxic of the proxy against a recording echo server, with plain blocking sockets.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use inoutbox_chaos::Proxy;

/// What the upstream saw on its connections.
#[derive(Debug, PartialEq)]
enum Seen {
    Connected,
    Data(Vec<u8>),
    Eof,
    Error(ErrorKind),
}

/// An echo server that reports what it sees; it half-closes after the client's EOF.
struct Upstream {
    addr: SocketAddr,
    seen: mpsc::Receiver<Seen>,
}

impl Upstream {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, seen) = mpsc::channel();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let tx = tx.clone();
                thread::spawn(move || {
                    let _ = tx.send(Seen::Connected);
                    let mut buf = [0u8; 64 * 1024];
                    loop {
                        match conn.read(&mut buf) {
                            Ok(0) => {
                                let _ = tx.send(Seen::Eof);
                                let _ = conn.shutdown(Shutdown::Write);
                                return;
                            }
                            Ok(n) => {
                                let _ = tx.send(Seen::Data(buf[..n].to_vec()));
                                if conn.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                            Err(e) => {
                                let _ = tx.send(Seen::Error(e.kind()));
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self { addr, seen }
    }

    /// The next event, if one comes within `within`.
    fn next(&self, within: Duration) -> Option<Seen> {
        self.seen.recv_timeout(within).ok()
    }

    /// Events until `within` passes with none.
    fn drain(&self, within: Duration) -> Vec<Seen> {
        std::iter::from_fn(|| self.next(within)).collect()
    }

    /// Every byte of `Data` events until `n` bytes came (or 10 s passed).
    fn bytes(&self, n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < n {
            match self.next(Duration::from_secs(10)) {
                Some(Seen::Data(d)) => out.extend(d),
                Some(_) => {}
                None => break,
            }
        }
        out
    }
}

fn connect(proxy: &Proxy) -> TcpStream {
    let s = TcpStream::connect(proxy.addr()).expect("connect to the proxy");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Sends `msg` and reads its echo; returns the round trip.
fn ping(s: &mut TcpStream, msg: &[u8]) -> Duration {
    let started = Instant::now();
    s.write_all(msg).expect("write");
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).expect("echo");
    assert_eq!(back, msg);
    started.elapsed()
}

/// Whether a read gets nothing (no data, no EOF, no error) for `within`.
fn silent(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 16];
    let quiet = matches!(s.read(&mut buf), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut));
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    quiet
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn forwards_both_ways_and_passes_a_half_close_on() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let mut c = connect(&proxy);
    c.write_all(b"hello").expect("write");
    c.shutdown(Shutdown::Write).expect("half-close");
    let mut back = Vec::new();
    c.read_to_end(&mut back)
        .expect("read to the upstream's close");
    assert_eq!(back, b"hello");
    assert_eq!(
        up.drain(Duration::from_millis(200)),
        [Seen::Connected, Seen::Data(b"hello".to_vec()), Seen::Eof]
    );
    let stats = proxy.stats();
    assert_eq!(
        (stats.accepted, stats.bytes_up, stats.bytes_down),
        (1, 5, 5)
    );
    wait_until("the connection to end", || proxy.stats().open == 0);
}

#[test]
fn latency_delays_each_direction() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let mut c = connect(&proxy);
    let direct = ping(&mut c, b"warm-up");
    proxy.set_latency(Duration::from_millis(40), Duration::ZERO);
    let rtt = ping(&mut c, b"ping");
    assert!(
        rtt >= Duration::from_millis(80) && rtt < Duration::from_millis(400) + direct * 2,
        "40 ms each way: round trip {rtt:?}"
    );
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    assert!(ping(&mut c, b"fast") < Duration::from_millis(40));
}

#[test]
fn a_millisecond_of_latency_adds_a_millisecond_each_way_not_a_timer_tick_more() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let mut c = connect(&proxy);
    let mut direct: Vec<Duration> = (0..50).map(|_| ping(&mut c, b"x")).collect();
    proxy.set_latency(Duration::from_millis(1), Duration::ZERO);
    let mut delayed: Vec<Duration> = (0..100).map(|_| ping(&mut c, b"x")).collect();
    direct.sort();
    delayed.sort();
    let (direct, delayed) = (direct[direct.len() / 2], delayed[delayed.len() / 2]);
    assert!(
        delayed >= Duration::from_millis(2) && delayed < Duration::from_millis(3) + direct * 2,
        "median round trip {delayed:?} with 1 ms each way ({direct:?} without)"
    );
}

#[test]
fn jitter_spreads_latency_uniformly_and_keeps_order() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    proxy.set_latency(Duration::from_millis(15), Duration::from_millis(10));
    let mut c = connect(&proxy);
    let rtts: Vec<Duration> = (0..40)
        .map(|i| ping(&mut c, format!("p{i:02}").as_bytes()))
        .collect();
    let (min, max) = (rtts.iter().min().unwrap(), rtts.iter().max().unwrap());
    assert!(
        *min >= Duration::from_millis(10),
        "5..25 ms each way: min {min:?}"
    );
    // Generous: a busy machine adds scheduling delay, never takes any away.
    assert!(
        *max <= Duration::from_millis(250),
        "5..25 ms each way: max {max:?}"
    );
    assert!(
        *max - *min >= Duration::from_millis(8),
        "jitter shows: {min:?}..{max:?}"
    );

    // Many small writes, each a chunk with its own draw: they still arrive in order.
    let sent: Vec<u8> = (0..200u8).collect();
    for b in &sent {
        c.write_all(&[*b]).expect("write");
        thread::sleep(Duration::from_micros(300));
    }
    let mut back = vec![0u8; sent.len()];
    c.read_exact(&mut back).expect("echo");
    assert_eq!(back, sent, "jitter never reorders");
}

#[test]
fn bandwidth_limits_bytes_per_second_in_each_direction() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let mut c = connect(&proxy);
    let payload = vec![7u8; 50_000];
    let unlimited = ping(&mut c, &payload);

    proxy.set_bandwidth(Some(100_000));
    let started = Instant::now();
    c.write_all(&payload).expect("write");
    let arrived = up.bytes(payload.len() * 2); // the warm-up's echo and this one
    let upstream_took = started.elapsed();
    assert_eq!(arrived.len(), payload.len() * 2);
    assert!(
        upstream_took >= Duration::from_millis(450) && upstream_took < Duration::from_secs(3),
        "50 kB up at 100 kB/s: {upstream_took:?} (unlimited: {unlimited:?})"
    );

    // Downstream: a server that sends 50 kB as soon as a client connects.
    let server = TcpListener::bind("127.0.0.1:0").expect("bind");
    let blob_addr = server.local_addr().expect("addr");
    thread::spawn(move || {
        for mut conn in server.incoming().flatten() {
            let _ = conn.write_all(&[9u8; 50_000]);
        }
    });
    let proxy = Proxy::start(blob_addr).expect("proxy");
    proxy.set_bandwidth(Some(100_000));
    let started = Instant::now();
    let mut c = connect(&proxy);
    let mut blob = vec![0u8; 50_000];
    c.read_exact(&mut blob).expect("the blob");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "50 kB down at 100 kB/s: {took:?}"
    );
}

#[test]
fn blackhole_drops_bytes_and_closes_nothing_until_it_heals() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let mut c = connect(&proxy);
    ping(&mut c, b"before");
    up.drain(Duration::from_millis(100));

    proxy.blackhole();
    c.write_all(b"lost")
        .expect("writes still succeed in a partition");
    assert!(
        silent(&mut c, Duration::from_millis(300)),
        "no answer, no close, no error"
    );
    assert_eq!(
        up.drain(Duration::from_millis(100)),
        [],
        "the upstream got nothing"
    );
    wait_until("the bytes to be dropped", || proxy.stats().dropped >= 4);

    // A close in the partition is withheld until the heal.
    c.shutdown(Shutdown::Write).expect("half-close");
    assert_eq!(up.drain(Duration::from_millis(300)), [], "the FIN is held");
    proxy.heal();
    assert_eq!(
        up.next(Duration::from_secs(5)),
        Some(Seen::Eof),
        "the FIN crosses after the heal"
    );
    let mut rest = Vec::new();
    c.read_to_end(&mut rest)
        .expect("the upstream's close comes back");
    assert_eq!(rest, b"", "the dropped bytes are gone for good");
}

#[test]
fn blackhole_accepts_new_connections_and_connects_them_only_after_the_heal() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    proxy.blackhole();
    let mut c = connect(&proxy);
    c.write_all(b"hello?").expect("write");
    assert!(silent(&mut c, Duration::from_millis(300)));
    assert_eq!(
        up.drain(Duration::from_millis(100)),
        [],
        "not even connected upstream"
    );
    assert_eq!(proxy.stats().accepted, 1);

    proxy.heal();
    assert_eq!(up.next(Duration::from_secs(5)), Some(Seen::Connected));
    ping(&mut c, b"after the heal");
}

#[test]
fn reset_all_closes_both_sides_with_rst() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let mut c = connect(&proxy);
    ping(&mut c, b"x");
    up.drain(Duration::from_millis(100));

    assert_eq!(proxy.reset_all(), 1);
    let mut buf = [0u8; 8];
    let client = c.read(&mut buf);
    assert!(
        matches!(&client, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the client sees a reset, not a clean close: {client:?}"
    );
    assert_eq!(
        up.next(Duration::from_secs(5)),
        Some(Seen::Error(ErrorKind::ConnectionReset)),
        "the upstream sees a reset"
    );
    wait_until("the reset to be counted", || proxy.stats().resets == 1);
    // The reset is counted as the connection's sockets close; it is no longer open once its
    // task has ended, just after.
    wait_until("the connection to end", || proxy.stats().open == 0);
    assert_eq!(proxy.stats().resets, 1, "one reset, counted once");
}

#[test]
fn a_reset_by_one_side_is_passed_on_as_a_reset() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let mut c = connect(&proxy);
    ping(&mut c, b"x");
    up.drain(Duration::from_millis(100));
    // Closing with unread data in the receive buffer makes the kernel send RST.
    proxy.set_latency(Duration::from_millis(50), Duration::ZERO);
    c.write_all(b"echoed into a closed socket").expect("write");
    thread::sleep(Duration::from_millis(150));
    drop(c);
    let seen = up.drain(Duration::from_millis(500));
    assert!(
        seen.contains(&Seen::Error(ErrorKind::ConnectionReset)),
        "the upstream is reset too: {seen:?}"
    );
}

#[test]
fn refuse_closes_the_listener_and_leaves_open_connections_alone() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let mut open = connect(&proxy);
    ping(&mut open, b"accepted"); // not waiting in the listener's backlog any more
    proxy.set_refuse(true);
    let refused = TcpStream::connect(proxy.addr());
    assert!(
        matches!(&refused, Err(e) if e.kind() == ErrorKind::ConnectionRefused),
        "{refused:?}"
    );
    ping(&mut open, b"still here");
    proxy.set_refuse(false);
    let mut again = connect(&proxy);
    ping(&mut again, b"same port again");
}

#[test]
fn a_link_faults_only_the_clients_it_picks() {
    let up = Upstream::start();
    let proxy = Proxy::start(up.addr).expect("proxy");
    let pick = Arc::new(AtomicBool::new(true));
    let link = {
        let pick = pick.clone();
        proxy.link(move |_peer| pick.load(Ordering::SeqCst))
    };
    let mut picked = connect(&proxy);
    ping(&mut picked, b"on the link");
    pick.store(false, Ordering::SeqCst);
    let mut other = connect(&proxy);
    ping(&mut other, b"on the default link");

    link.blackhole();
    picked.write_all(b"lost").expect("write");
    assert!(silent(&mut picked, Duration::from_millis(300)));
    ping(&mut other, b"unaffected");
    assert_eq!(link.stats().accepted, 1);
    assert!(link.stats().dropped >= 4);
    assert_eq!(proxy.default_link().stats().dropped, 0);

    // The proxy's own toxics are the default link's: they leave the link alone.
    link.heal();
    proxy.blackhole();
    picked.write_all(b"back").expect("write");
    let mut buf = [0u8; 4];
    picked.read_exact(&mut buf).expect("the link healed");
    assert_eq!(
        &buf, b"back",
        "the bytes lost in the partition never arrive"
    );
    other.write_all(b"lost").expect("write");
    assert!(silent(&mut other, Duration::from_millis(300)));
    assert_eq!(proxy.reset_all(), 2, "reset_all covers every link");
}

//! One proxied connection: two directions, each a reader (which applies the blackhole and
//! stamps each chunk with its delivery time) and a writer (which waits for that time, applies
//! the bandwidth limit and writes).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

use crate::link::{lock, Counters, Link};
use crate::timer;

/// Bytes read at once; also the largest chunk a latency applies to.
const CHUNK: usize = 16 * 1024;
/// Chunks in flight per direction before the reader stops reading (backpressure).
const IN_FLIGHT: usize = 64;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What a reader hands its writer.
enum Item {
    Data {
        at: Instant,
        bytes: Vec<u8>,
    },
    /// The source closed its sending side (FIN).
    Eof,
    /// The source failed (reset, or another error).
    Reset,
}

/// How a direction ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// Closed in order: the close was passed on.
    Closed,
    /// A side reset or failed: the whole connection is reset.
    Reset,
}

#[derive(Clone, Copy)]
enum Dir {
    Up,
    Down,
}

/// Serves one accepted client until the connection ends.
pub(crate) async fn serve(client: TcpStream, peer: SocketAddr, upstream: SocketAddr, link: Link) {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let reset = Arc::new(Notify::new());
    lock(&link.state.conns).insert(id, reset.clone());
    let counters = &link.state.counters;
    Counters::add(&counters.accepted, 1);
    Counters::add(&counters.open, 1);
    let _ = client.set_nodelay(true);
    let seed = id ^ u64::from(peer.port()) << 32;
    if let Some(upstream) = connect(client, upstream, &link, &reset).await {
        run(upstream.0, upstream.1, &link, &reset, seed).await;
    }
    lock(&link.state.conns).remove(&id);
    counters.open.fetch_sub(1, Ordering::Relaxed);
}

/// Connects upstream once the link is not blackholed; meanwhile the client's bytes are read
/// and dropped. `None` when the client left first, the upstream refused (the client is reset),
/// or the connection was reset.
async fn connect(
    mut client: TcpStream,
    upstream: SocketAddr,
    link: &Link,
    reset: &Notify,
) -> Option<(TcpStream, TcpStream)> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if !link.blackholed() {
            break;
        }
        tokio::select! {
            () = link.healed() => break,
            read = client.read(&mut buf) => match read {
                // The client gave up during the partition: nothing to pass on.
                Ok(0) | Err(_) => return None,
                Ok(n) => Counters::add(&link.state.counters.dropped, n),
            },
            () = reset.notified() => {
                abort(&client, link);
                return None;
            }
        }
    }
    match TcpStream::connect(upstream).await {
        Ok(up) => {
            let _ = up.set_nodelay(true);
            Some((client, up))
        }
        Err(_) => {
            // As if the upstream had refused the client.
            abort(&client, link);
            None
        }
    }
}

/// Closes `stream` with a reset when it is dropped.
fn abort(stream: &TcpStream, link: &Link) {
    let _ = stream.set_zero_linger();
    Counters::add(&link.state.counters.resets, 1);
}

async fn run(client: TcpStream, upstream: TcpStream, link: &Link, reset: &Notify, seed: u64) {
    let (mut client_r, mut client_w) = client.into_split();
    let (mut up_r, mut up_w) = upstream.into_split();
    let end = {
        let up = direction(&mut client_r, &mut up_w, link, Dir::Up, seed);
        let down = direction(&mut up_r, &mut client_w, link, Dir::Down, !seed);
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                end = &mut up, if !up_done => {
                    if end == End::Reset { break End::Reset; }
                    up_done = true;
                }
                end = &mut down, if !down_done => {
                    if end == End::Reset { break End::Reset; }
                    down_done = true;
                }
                () = reset.notified() => break End::Reset,
            }
            if up_done && down_done {
                break End::Closed;
            }
        }
    };
    if end == End::Reset {
        // Whole sockets again: a dropped write half would send a FIN before the close.
        if let (Ok(client), Ok(upstream)) = (client_r.reunite(client_w), up_r.reunite(up_w)) {
            let _ = client.set_zero_linger();
            let _ = upstream.set_zero_linger();
        }
        Counters::add(&link.state.counters.resets, 1);
    }
}

/// Forwards `src` to `dst` through the link's toxics until one side closes or fails.
async fn direction(
    src: &mut OwnedReadHalf,
    dst: &mut OwnedWriteHalf,
    link: &Link,
    dir: Dir,
    seed: u64,
) -> End {
    let (tx, rx) = mpsc::channel(IN_FLIGHT);
    let reader = read_side(src, tx, link, seed);
    let writer = write_side(dst, rx, link, dir);
    tokio::pin!(reader, writer);
    let mut reading = true;
    loop {
        // The writer decides; the reader may still wait on a source that says nothing.
        tokio::select! {
            end = &mut writer => return end,
            () = &mut reader, if reading => reading = false,
        }
    }
}

async fn read_side(src: &mut OwnedReadHalf, tx: mpsc::Sender<Item>, link: &Link, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; CHUNK];
    let mut last = Instant::now();
    loop {
        let item = match src.read(&mut buf).await {
            Ok(0) => Item::Eof,
            Err(_) => Item::Reset,
            Ok(n) => {
                let toxics = link.toxics();
                if toxics.blackhole {
                    Counters::add(&link.state.counters.dropped, n);
                    continue;
                }
                let delay = rng.around(toxics.latency, toxics.jitter);
                // Jitter never reorders: a chunk is not delivered before the one read before it.
                let at = (Instant::now() + delay).max(last);
                last = at;
                Item::Data {
                    at,
                    bytes: buf[..n].to_vec(),
                }
            }
        };
        let end = !matches!(item, Item::Data { .. });
        if tx.send(item).await.is_err() || end {
            return;
        }
    }
}

async fn write_side(
    dst: &mut OwnedWriteHalf,
    mut rx: mpsc::Receiver<Item>,
    link: &Link,
    dir: Dir,
) -> End {
    let counters = &link.state.counters;
    let forwarded = match dir {
        Dir::Up => &counters.bytes_up,
        Dir::Down => &counters.bytes_down,
    };
    let mut next_free = Instant::now();
    while let Some(item) = rx.recv().await {
        match item {
            Item::Data { at, bytes } => {
                timer::sleep_until(at).await;
                let toxics = link.toxics();
                if toxics.blackhole {
                    // Lost in the partition while in flight.
                    Counters::add(&counters.dropped, bytes.len());
                    continue;
                }
                let written = match toxics.bandwidth {
                    None => dst.write_all(&bytes).await,
                    Some(rate) => throttled(dst, &bytes, rate, &mut next_free).await,
                };
                if written.is_err() {
                    return End::Reset;
                }
                Counters::add(forwarded, bytes.len());
            }
            Item::Eof => {
                // A close crosses a partition only when it heals.
                link.healed().await;
                let _ = dst.shutdown().await;
                return End::Closed;
            }
            Item::Reset => {
                link.healed().await;
                return End::Reset;
            }
        }
    }
    End::Closed
}

/// Writes `bytes` in slices of about a hundredth of a second's worth, each no earlier than the
/// bandwidth allows.
async fn throttled(
    dst: &mut OwnedWriteHalf,
    bytes: &[u8],
    rate: u64,
    next_free: &mut Instant,
) -> std::io::Result<()> {
    let slice = usize::try_from(rate / 100).unwrap_or(CHUNK).clamp(1, CHUNK);
    for part in bytes.chunks(slice) {
        let start = (*next_free).max(Instant::now());
        timer::sleep_until(start).await;
        dst.write_all(part).await?;
        *next_free = start + Duration::from_secs_f64(part.len() as f64 / rate as f64);
    }
    Ok(())
}

/// xorshift64*: enough randomness for jitter, without a dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self((seed ^ time) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `base - spread ..= base + spread`, at least zero.
    fn around(&mut self, base: Duration, spread: Duration) -> Duration {
        if spread.is_zero() {
            return base;
        }
        let spread_ns = spread.as_nanos().min(u128::from(u64::MAX / 4)) as u64;
        let offset = self.next() % (2 * spread_ns + 1);
        let ns = base.as_nanos() as i128 + i128::from(offset) - i128::from(spread_ns);
        Duration::from_nanos(ns.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_is_uniform_within_its_bounds() {
        let mut rng = Rng::new(7);
        let (base, spread) = (Duration::from_millis(5), Duration::from_millis(2));
        let draws: Vec<Duration> = (0..10_000).map(|_| rng.around(base, spread)).collect();
        assert!(draws
            .iter()
            .all(|d| *d >= base - spread && *d <= base + spread));
        let mean = draws.iter().sum::<Duration>() / draws.len() as u32;
        assert!(mean > Duration::from_micros(4_900) && mean < Duration::from_micros(5_100));
        let low = draws.iter().filter(|d| **d < base).count();
        assert!(
            (4_500..5_500).contains(&low),
            "{low} of 10000 below the mean"
        );
    }

    #[test]
    fn jitter_never_goes_below_zero() {
        let mut rng = Rng::new(1);
        for _ in 0..1000 {
            let _ = rng.around(Duration::from_millis(1), Duration::from_millis(5));
        }
        assert_eq!(
            rng.around(Duration::ZERO, Duration::ZERO),
            Duration::ZERO,
            "no jitter, no latency"
        );
    }
}

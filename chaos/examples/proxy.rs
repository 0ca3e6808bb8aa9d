//! The proxy as a process, for trying a service against a bad network by hand:
//!
//! ```text
//! cargo run -p inoutbox-chaos --example proxy -- 127.0.0.1:5432 [--latency-ms 1] [--jitter-ms 0] [--bandwidth 1000000]
//! ```
//!
//! It prints the address to connect to and runs until killed.

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let upstream = args.first().ok_or(
        "usage: proxy <upstream host:port> [--latency-ms N] [--jitter-ms N] [--bandwidth B]",
    )?;
    let flag = |name: &str| -> Result<Option<u64>, Box<dyn std::error::Error>> {
        match args.iter().position(|a| a == name) {
            Some(i) => Ok(Some(
                args.get(i + 1).ok_or("a flag needs a value")?.parse()?,
            )),
            None => Ok(None),
        }
    };
    let proxy = inoutbox_chaos::Proxy::start(upstream.as_str())?;
    proxy.set_latency(
        Duration::from_millis(flag("--latency-ms")?.unwrap_or(0)),
        Duration::from_millis(flag("--jitter-ms")?.unwrap_or(0)),
    );
    proxy.set_bandwidth(flag("--bandwidth")?);
    println!("{} -> {upstream} ({:?})", proxy.addr(), proxy.toxics());
    loop {
        std::thread::park();
    }
}

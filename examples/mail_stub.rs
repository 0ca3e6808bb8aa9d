//! A mail service stub: a real local HTTP server that "sends" an e-mail per POST and
//! deduplicates on the `Idempotency-Key` header, as a receiver of inoutbox effects must.
//!
//! ```text
//! cargo run --example mail_stub -- [--listen 127.0.0.1:8025]
//! ```
//!
//! An effect after commit runs at least once: a process that dies after the POST and before it
//! marks the effect done sends it again after a restart, with the same key. Without the check
//! below, the customer would get the e-mail twice. It prints one line per request: `sent <key>`
//! the first time, `duplicate <key>` after.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let listen = match args.iter().position(|a| a == "--listen") {
        Some(i) => args.get(i + 1).cloned().unwrap_or_default(),
        None => "127.0.0.1:8025".to_owned(),
    };
    let listener = TcpListener::bind(&listen)?;
    println!("mail_stub: listening on {}", listener.local_addr()?);
    let mut sent: HashSet<String> = HashSet::new();
    for stream in listener.incoming() {
        if let Err(e) = serve(stream?, &mut sent) {
            eprintln!("mail_stub: bad request: {e}");
        }
    }
    Ok(())
}

/// Reads one request and answers it: 200 for a new key (the e-mail is sent) and for a known
/// one (already sent: nothing is done), 400 without a key.
fn serve(stream: TcpStream, sent: &mut HashSet<String>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut key = None;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim().to_owned();
            match name.to_ascii_lowercase().as_str() {
                "idempotency-key" => key = Some(value),
                "content-length" => length = value.parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length.min(1 << 20)];
    reader.read_exact(&mut body)?;
    let status = match key {
        Some(key) if sent.insert(key.clone()) => {
            println!("mail_stub: sent {key} {}", String::from_utf8_lossy(&body));
            "200 OK"
        }
        Some(key) => {
            println!("mail_stub: duplicate {key}");
            "200 OK"
        }
        None => "400 Bad Request",
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
}

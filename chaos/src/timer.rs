//! A sleep precise to tens of microseconds. Tokio's timer works in whole milliseconds and
//! rounds up, which turns "1 ms each way" into about 2; a latency toxic of 1 ms must add 1 ms.
//! One thread for every proxy holds the deadlines and parks until the earliest.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;
use std::time::Instant;

use crate::link::lock;

struct Entry {
    at: Instant,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.cmp(&other.at)
    }
}

struct Timer {
    deadlines: Mutex<BinaryHeap<Reverse<Entry>>>,
    thread: Thread,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<&'static Timer>();
        let handle = std::thread::Builder::new()
            .name("inoutbox-chaos timer".to_owned())
            .spawn(move || {
                let timer = rx.recv().expect("the timer is handed over");
                run(timer);
            })
            .expect("spawn the timer thread");
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            deadlines: Mutex::new(BinaryHeap::new()),
            thread: handle.thread().clone(),
        }));
        tx.send(timer).expect("the timer thread runs");
        timer
    })
}

fn run(timer: &Timer) {
    loop {
        let next = {
            let mut deadlines = lock(&timer.deadlines);
            let now = Instant::now();
            while deadlines.peek().is_some_and(|e| e.0.at <= now) {
                if let Some(Reverse(e)) = deadlines.pop() {
                    e.waker.wake();
                }
            }
            deadlines.peek().map(|e| e.0.at - now)
        };
        match next {
            Some(wait) => std::thread::park_timeout(wait),
            None => std::thread::park(),
        }
    }
}

/// Completes at `at` (give or take the kernel's timer slack, about 50 µs).
pub(crate) fn sleep_until(at: Instant) -> Sleep {
    Sleep { at }
}

pub(crate) struct Sleep {
    at: Instant,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        let timer = timer();
        let earliest = {
            let mut deadlines = lock(&timer.deadlines);
            deadlines.push(Reverse(Entry {
                at: self.at,
                waker: cx.waker().clone(),
            }));
            deadlines.peek().is_some_and(|e| e.0.at == self.at)
        };
        if earliest {
            timer.thread.unpark();
        }
        Poll::Pending
    }
}

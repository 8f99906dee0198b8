//! What a reload replaces, freed off the runtime's threads.
//!
//! A million jobs' config takes a tenth of a second or more to free, and whichever holder lets
//! go of it last frees it: a pass that held a snapshot, a watcher that kept the old jobs. On the
//! runtime that stalls the threads that fire ticks. Handed to a [`Reaper`], the replaced parts
//! are held by a thread of its own until nothing else holds them, and freed there. The thread
//! is started by the first reload, whose thread is niced: it inherits that, as background work.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How soon the reaper looks whether the others let go of what it holds, after a hand-over;
/// twice as long each time they have not, up to [`LOOK_AT_MOST_EVERY`] (a run keeps the
/// config it started with for as long as it runs).
const LOOK_FIRST: Duration = Duration::from_millis(100);
const LOOK_AT_MOST_EVERY: Duration = Duration::from_secs(5);

/// A shared value the reaper holds: freed when the reaper is its last holder.
trait Held: Send {
    fn last(&self) -> bool;
}

impl<T: Send + Sync> Held for Arc<T> {
    fn last(&self) -> bool {
        // No other strong reference can appear once this is the last: there is no one left to
        // clone it (the config's parts have no weak references).
        Arc::strong_count(self) == 1
    }
}

/// Frees what it is handed on its own thread, started at the first hand-over; the thread ends
/// once the reaper is dropped and everything it held is freed.
#[derive(Debug, Default)]
pub(crate) struct Reaper {
    to: Mutex<Option<Sender<Box<dyn Held>>>>,
}

impl Reaper {
    /// Holds `value` until every other holder has let go of it, then frees it on the reaper's
    /// thread. Without a thread (none could be started), whoever holds it last frees it.
    pub(crate) fn free_when_last<T: Send + Sync + 'static>(&self, value: Arc<T>) {
        let mut to = self.to.lock().unwrap_or_else(|e| e.into_inner());
        let sender = to.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel();
            if let Err(e) = std::thread::Builder::new().name("ll-reaper".into()).spawn(move || reap(&rx)) {
                // The receiver went with the closure: every hand-over drops its value at once.
                tracing::warn!(error = %e, "cannot start the thread that frees replaced configs; they are freed where they are let go");
            }
            tx
        });
        // A send fails only when the thread is gone; the value is then dropped here.
        let _ = sender.send(Box::new(value));
    }
}

fn reap(rx: &Receiver<Box<dyn Held>>) {
    let mut held = Holding::default();
    let (mut open, mut wait) = (true, LOOK_FIRST);
    while open || !held.0.is_empty() {
        let got = if held.0.is_empty() {
            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else if open {
            rx.recv_timeout(wait)
        } else {
            std::thread::sleep(wait);
            Err(RecvTimeoutError::Timeout)
        };
        match got {
            Ok(value) => {
                held.0.push(value);
                wait = LOOK_FIRST;
            }
            Err(RecvTimeoutError::Timeout) => wait = (wait * 2).min(LOOK_AT_MOST_EVERY),
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
        held.sweep();
    }
}

/// What the reaper holds.
#[derive(Default)]
struct Holding(Vec<Box<dyn Held>>);

impl Holding {
    /// Frees, here, each value no one else holds any more.
    fn sweep(&mut self) {
        self.0.retain(|h| !h.last());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tells the name of the thread it is dropped on.
    struct Noted(Sender<Option<String>>);

    impl Drop for Noted {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().name().map(str::to_owned));
        }
    }

    #[test]
    fn a_value_is_freed_by_the_sweep_after_its_last_other_holder_lets_go() {
        let (dropped_on, kept) = noted();
        let other = kept.clone();
        let mut held = Holding::default();
        held.0.push(Box::new(kept));
        held.sweep();
        assert!(dropped_on.try_recv().is_err(), "freed while another still held it");
        // The other holder lets go, as a pass on the runtime would: it only counts down.
        std::thread::Builder::new().name("a-runtime-thread".into()).spawn(move || drop(other)).unwrap().join().unwrap();
        assert!(dropped_on.try_recv().is_err(), "freed by the other holder");
        held.sweep();
        assert_eq!(dropped_on.try_recv().expect("freed by the sweep").as_deref(), std::thread::current().name());
        assert!(held.0.is_empty());
    }

    #[test]
    fn the_reaper_frees_on_its_own_thread_even_once_dropped() {
        let reaper = Reaper::default();
        let (dropped_on, value) = noted();
        let other = value.clone();
        reaper.free_when_last(value);
        drop(reaper);
        drop(other);
        let freed = dropped_on.recv_timeout(Duration::from_secs(10)).expect("freed within 10 s");
        assert_eq!(freed.as_deref(), Some("ll-reaper"));
    }

    fn noted() -> (Receiver<Option<String>>, Arc<Noted>) {
        let (tx, rx) = mpsc::channel();
        (rx, Arc::new(Noted(tx)))
    }
}

//! Signals: how the parts of the engine tell each other that something changed, so none of
//! them polls. The scheduler sleeps until its next tick or a signal; the queue worker until
//! tasks are pushed; a `wait` until its run finishes.
//!
//! [`Signals`] is the interface; [`Local`] carries signals within one process (SQLite: one
//! worker per database). A backend shared by several processes implements it over its own
//! notifications (PostgreSQL: `NOTIFY` on publish, a `LISTEN` task feeding the local side), so
//! a pause or a push made by one worker wakes the others.
//!
//! Signals are hints, never the record: whoever receives one reads the database. A receiver
//! that falls behind gets [`Signal::Lagged`] and must act as if it had received everything.
//!
//! PostgreSQL's side lives with its backend (`store/postgres/signals.rs`).

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "k", content = "v", rename_all = "snake_case")]
pub(crate) enum Signal {
    /// Something is due or was queued: the scheduler should look.
    Wake,
    /// A job's definition or state changed (reload, pause, resume): plans are rebuilt.
    JobChanged,
    /// These jobs' definitions in force or their states changed (a runtime job saved or
    /// deleted, a pause, a resume): only they are planned again. Made by [`Signal::jobs_changed`].
    JobsChanged(Vec<String>),
    /// A runtime job was created, changed or deleted: every worker reads it again.
    DefinitionChanged(String),
    /// Tasks were pushed to the queue.
    TasksPushed,
    /// A run's end is recorded.
    RunFinished(String),
    /// A running run recorded progress (a workflow step started or ended, an agent waits).
    RunProgress(String),
    /// Runs were created, started or deleted (and no other signal says so).
    RunsChanged,
    /// Someone asked for a running run to stop; the worker running it stops it.
    CancelRequested { run: String, why: String },
    /// A worker joined or left the group that shares the schedule, or knows other jobs now:
    /// every worker reads its share again.
    WorkersChanged,
    /// The receiver missed signals: act on all of them.
    Lagged,
}

/// Most jobs one [`Signal::JobsChanged`] names: more are one [`Signal::JobChanged`], which
/// keeps a signal within what PostgreSQL carries in one notice (8,000 bytes).
const JOBS_NAMED_AT_MOST: usize = 32;

impl Signal {
    /// That `jobs` changed: named, or for many, that jobs changed.
    pub(crate) fn jobs_changed(jobs: Vec<String>) -> Self {
        if jobs.len() > JOBS_NAMED_AT_MOST || jobs.iter().map(String::len).sum::<usize>() > 4000 {
            Signal::JobChanged
        } else {
            Signal::JobsChanged(jobs)
        }
    }
}

/// Publishes and subscribes to [`Signal`]s.
pub(crate) trait Signals: Send + Sync + std::fmt::Debug {
    fn publish(&self, signal: Signal);
    fn subscribe(&self) -> Receiver;
}

/// One subscriber's stream of signals.
#[derive(Debug)]
pub(crate) struct Receiver(broadcast::Receiver<Signal>);

impl Receiver {
    /// The next signal; `None` once the sender is gone.
    pub(crate) async fn recv(&mut self) -> Option<Signal> {
        match self.0.recv().await {
            Ok(s) => Some(s),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Signal::Lagged),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// Every signal already waiting, without blocking.
    pub(crate) fn drain(&mut self) -> Vec<Signal> {
        let mut out = Vec::new();
        loop {
            match self.0.try_recv() {
                Ok(s) => out.push(s),
                Err(broadcast::error::TryRecvError::Lagged(_)) => out.push(Signal::Lagged),
                Err(_) => return out,
            }
        }
    }
}

/// Signals within one process.
#[derive(Debug)]
pub(crate) struct Local {
    tx: broadcast::Sender<Signal>,
}

/// Signals a subscriber may be behind by before it gets [`Signal::Lagged`]: a second of ends
/// at 4,000 runs/s.
const CAPACITY: usize = 4096;

impl Local {
    pub(crate) fn new() -> Self {
        Self { tx: broadcast::Sender::new(CAPACITY) }
    }
}

impl Signals for Local {
    fn publish(&self, signal: Signal) {
        // No subscriber: nobody is waiting for it.
        let _ = self.tx.send(signal);
    }

    fn subscribe(&self) -> Receiver {
        Receiver(self.tx.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_so() {
        let s = Local::new();
        let mut rx = s.subscribe();
        for i in 0..CAPACITY + 10 {
            s.publish(Signal::RunFinished(i.to_string()));
        }
        let got = rx.drain();
        assert_eq!(got.first(), Some(&Signal::Lagged), "the first thing it reads says it missed some");
        assert_eq!(got.last(), Some(&Signal::RunFinished((CAPACITY + 9).to_string())));
    }

    #[tokio::test]
    async fn every_subscriber_gets_every_signal() {
        let s = Local::new();
        let (mut a, mut b) = (s.subscribe(), s.subscribe());
        s.publish(Signal::TasksPushed);
        s.publish(Signal::CancelRequested { run: "r1".into(), why: "asked".into() });
        for rx in [&mut a, &mut b] {
            assert_eq!(rx.recv().await, Some(Signal::TasksPushed));
            assert_eq!(rx.recv().await, Some(Signal::CancelRequested { run: "r1".into(), why: "asked".into() }));
        }
    }
}

//! What wakes whoever follows something the service shows: a run (its end, and its progress
//! for a follower that reads it), or anything (jobs paused, reloaded, runs created, started,
//! finished, pruned). One [`Watch`] serves every follower: run followers (MCP tasks,
//! `wait_run`, a trigger's wait) and resource subscriptions. Signals are hints: a follower
//! reads again when woken and tells only what reads differently.

use std::time::Duration;

use crate::signals::{Receiver, Signal};

/// What a [`Watch`] wakes for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interest {
    /// One run: its end, a cancel asked for, runs started or resumed; with `progress`, also a
    /// step or a call recorded on it.
    Run { id: String, progress: bool },
    /// Anything a listing or a detail shows.
    Anything,
}

impl Interest {
    fn concerns(&self, signal: &Signal) -> bool {
        match (self, signal) {
            (_, Signal::Lagged) => true,
            (Interest::Anything, s) => !matches!(s, Signal::TasksPushed),
            (Interest::Run { id, .. }, Signal::RunFinished(r) | Signal::CancelRequested { run: r, .. }) => r == id,
            (Interest::Run { id, progress }, Signal::RunProgress(r)) => *progress && r == id,
            (Interest::Run { .. }, Signal::RunsChanged | Signal::Wake) => true,
            (
                Interest::Run { .. },
                Signal::JobChanged | Signal::JobsChanged(_) | Signal::TasksPushed | Signal::DefinitionChanged(_) | Signal::WorkersChanged,
            ) => false,
        }
    }
}

/// Wakes when something of its [`Interest`] may have changed since it last woke. Take it
/// before the first read, so that no change after that read is missed.
#[derive(Debug)]
pub struct Watch {
    signals: Receiver,
    interest: Interest,
    /// A burst of signals within this is one wake.
    at_most_every: Option<Duration>,
    /// A signal of interest came and no wake has answered it (kept across a cancelled call).
    pending: bool,
}

impl Watch {
    pub(crate) fn new(signals: Receiver, interest: Interest) -> Self {
        Self { signals, interest, at_most_every: None, pending: false }
    }

    /// Wakes at most once per `every`: one read covers a burst of changes.
    pub fn at_most_every(mut self, every: Duration) -> Self {
        self.at_most_every = Some(every);
        self
    }

    /// Resolves at the next change of interest since the last call resolved (never, once the
    /// engine has stopped). Cancel-safe: a change taken by a call that is dropped wakes the
    /// next call.
    pub async fn changed(&mut self) {
        while !self.pending {
            match self.signals.recv().await {
                Some(s) => self.pending = self.interest.concerns(&s),
                // The engine stopped: nothing will change any more.
                None => std::future::pending::<()>().await,
            }
        }
        if let Some(every) = self.at_most_every {
            tokio::time::sleep(every).await;
        }
        self.signals.drain();
        self.pending = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_watch_wakes_for_its_own_run_and_for_what_may_start_it() {
        let mine = Interest::Run { id: "a".into(), progress: false };
        let detail = Interest::Run { id: "a".into(), progress: true };
        assert!(mine.concerns(&Signal::RunFinished("a".into())));
        assert!(!mine.concerns(&Signal::RunFinished("b".into())));
        assert!(!mine.concerns(&Signal::RunProgress("a".into())), "the run row alone does not change with progress");
        assert!(detail.concerns(&Signal::RunProgress("a".into())));
        assert!(!detail.concerns(&Signal::RunProgress("b".into())));
        assert!(mine.concerns(&Signal::RunsChanged) && mine.concerns(&Signal::Lagged));
        assert!(!mine.concerns(&Signal::JobChanged) && !mine.concerns(&Signal::TasksPushed));
        assert!(Interest::Anything.concerns(&Signal::JobChanged));
        assert!(!Interest::Anything.concerns(&Signal::TasksPushed));
    }
}

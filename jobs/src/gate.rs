//! The drain gate: every run passes it before it is claimed (or takes over the pass of the run
//! whose end made room for it) and holds its pass until its end is recorded. Shutdown closes the gate (no new claims) and waits for the passes to come back, so
//! "drained" means "recorded", never "left the running map".

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, Default)]
struct State {
    closed: bool,
    /// Admits nobody for now (the worker fenced itself), until released.
    held: bool,
    passes: usize,
}

/// Counts runs between claim and record; closed once at shutdown.
#[derive(Debug)]
pub(crate) struct Gate {
    state: watch::Sender<State>,
}

/// Held by one run from before its claim until its end is recorded (or the claim found nothing).
#[derive(Debug)]
pub(crate) struct Pass {
    gate: std::sync::Arc<Gate>,
}

impl Gate {
    pub(crate) fn new() -> Self {
        Self { state: watch::Sender::new(State::default()) }
    }

    /// A pass, or `None` once the gate is closed (the run stays queued for the next start).
    /// Entering and closing are ordered by the channel's lock: a run that got a pass is
    /// counted by every later `idle`.
    pub(crate) fn enter(self: &std::sync::Arc<Self>) -> Option<Pass> {
        self.state
            .send_if_modified(|s| {
                if s.closed || s.held {
                    false
                } else {
                    s.passes += 1;
                    true
                }
            })
            .then(|| Pass { gate: self.clone() })
    }

    pub(crate) fn close(&self) {
        self.state.send_modify(|s| s.closed = true);
    }

    /// Holds the gate (admits nobody) or releases it; a closed gate stays closed.
    pub(crate) fn hold(&self, held: bool) {
        self.state.send_if_modified(|s| std::mem::replace(&mut s.held, held) != held);
    }

    /// Waits until the gate admits again, or is closed for good.
    pub(crate) async fn admitting(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| s.closed || !s.held).await;
    }

    /// Whether [`Gate::enter`] would give a pass now (neither closed nor held).
    pub(crate) fn admits(&self) -> bool {
        let s = self.state.borrow();
        !s.closed && !s.held
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state.borrow().closed
    }

    /// Resolves once the gate is closed.
    pub(crate) async fn closed(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|s| s.closed).await;
    }

    /// Resolves once no pass is out.
    pub(crate) async fn idle(&self) {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|s| s.passes == 0).await;
    }

    pub(crate) fn passes(&self) -> usize {
        self.state.borrow().passes
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.state.send_modify(|s| s.passes -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_gate_admits_nobody_and_idle_waits_for_every_pass() {
        let gate = std::sync::Arc::new(Gate::new());
        let a = gate.enter().expect("open gate admits");
        let b = gate.enter().expect("open gate admits");
        gate.close();
        assert!(gate.enter().is_none(), "closed gate must not admit");
        assert_eq!(gate.passes(), 2);
        let idle = gate.idle();
        tokio::pin!(idle);
        assert!(futures::poll!(&mut idle).is_pending());
        drop(a);
        assert!(futures::poll!(&mut idle).is_pending(), "one pass is still out");
        drop(b);
        assert!(futures::poll!(&mut idle).is_ready());
    }
}

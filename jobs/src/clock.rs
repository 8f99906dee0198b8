//! Time for the scheduler: the system clock in production, a manual clock in tests, so that
//! time logic is tested by moving time, not by sleeping.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
    /// Resolves at or after `t`.
    fn sleep_until(&self, t: DateTime<Utc>) -> Sleep;
}

/// Wall-clock time; sleeps with tokio timers (no polling).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn sleep_until(&self, t: DateTime<Utc>) -> Sleep {
        let d = (t - Utc::now()).to_std().unwrap_or_default();
        Box::pin(tokio::time::sleep(d))
    }
}

/// A clock that moves only when told to. Sleepers wake when it passes their instant.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
    tx: watch::Sender<DateTime<Utc>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        let (tx, _) = watch::channel(start);
        Self { now: Mutex::new(start), tx }
    }

    pub fn set(&self, t: DateTime<Utc>) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = t;
        self.tx.send_replace(t);
    }

    pub fn advance(&self, d: chrono::Duration) {
        let t = self.now() + d;
        self.set(t);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sleep_until(&self, t: DateTime<Utc>) -> Sleep {
        let mut rx = self.tx.subscribe();
        Box::pin(async move {
            while *rx.borrow_and_update() < t {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

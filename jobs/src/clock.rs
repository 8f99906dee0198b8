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

/// Wall-clock time. A sleep until a wall-clock instant is a tokio timer (monotonic) for the
/// time left, measured again whenever the wall clock jumps (an NTP step, a VM resumed, `date
/// -s`): a step forward wakes what is now due at once, a step back sleeps on instead of waking
/// early. One thread per process watches for jumps ([`steps`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn sleep_until(&self, t: DateTime<Utc>) -> Sleep {
        let mut steps = steps();
        Box::pin(async move {
            loop {
                let Ok(left) = (t - Utc::now()).to_std() else { return };
                if left.is_zero() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(left) => {}
                    _ = steps.changed() => {}
                }
            }
        })
    }
}

/// How far the wall clock may move against the monotonic clock between two looks before it
/// counts as a jump.
const STEP: chrono::TimeDelta = chrono::TimeDelta::milliseconds(500);

/// Counts the wall clock's jumps: a thread compares it with the monotonic clock every second.
fn steps() -> watch::Receiver<u64> {
    static STEPS: std::sync::OnceLock<watch::Sender<u64>> = std::sync::OnceLock::new();
    STEPS
        .get_or_init(|| {
            let tx = watch::Sender::new(0);
            let watcher = tx.clone();
            let _ = std::thread::Builder::new().name("clock-steps".into()).spawn(move || {
                let mut last = (std::time::Instant::now(), Utc::now());
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    let now = (std::time::Instant::now(), Utc::now());
                    if let Some(by) = jump(last, now) {
                        tracing::warn!(by_ms = by.num_milliseconds(), "the system clock jumped; timers measure again");
                        watcher.send_modify(|n| *n += 1);
                    }
                    last = now;
                }
            });
            tx
        })
        .subscribe()
}

/// How far the wall clock moved beyond the monotonic time that passed between two looks, when
/// that is a jump ([`STEP`]).
fn jump(then: (std::time::Instant, DateTime<Utc>), now: (std::time::Instant, DateTime<Utc>)) -> Option<chrono::TimeDelta> {
    let passed = chrono::TimeDelta::from_std(now.0.duration_since(then.0)).ok()?;
    let by = (now.1 - then.1) - passed;
    (by.abs() > STEP).then_some(by)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_is_the_wall_clock_moving_apart_from_monotonic_time() {
        let (i, w) = (std::time::Instant::now(), Utc::now());
        let later =
            |mono_ms: u64, wall_ms: i64| (i + std::time::Duration::from_millis(mono_ms), w + chrono::TimeDelta::milliseconds(wall_ms));
        assert_eq!(jump((i, w), later(1000, 1000)), None, "time passing");
        assert_eq!(jump((i, w), later(1000, 1400)), None, "a slew or a slow look is no jump");
        assert_eq!(jump((i, w), later(1000, 3_601_000)), Some(chrono::TimeDelta::hours(1)), "stepped forward an hour");
        assert_eq!(jump((i, w), later(1000, 1000 - 3_600_000)), Some(-chrono::TimeDelta::hours(1)), "stepped back an hour");
        assert_eq!(jump((i, w), later(30_000, 1000)), Some(chrono::TimeDelta::seconds(-29)), "the wall stood still (or went back)");
    }
}

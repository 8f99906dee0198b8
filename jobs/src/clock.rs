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
    /// The machine's own clock, which an engine on a shared database corrects to the server's
    /// ([`ServerClock`]); a test's clock is left as it is.
    fn is_system(&self) -> bool {
        false
    }
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

    fn is_system(&self) -> bool {
        true
    }
}

/// The system clock corrected to the database server's: on a shared database every worker
/// schedules, times out and records on the server's clock, so a worker whose own clock is
/// minutes off fires nothing early or late. The offset is measured at each lease renewal
/// (the server's time against the middle of the round trip); a sleep measures again when it
/// changes, as when the wall clock jumps.
#[derive(Debug)]
pub(crate) struct ServerClock {
    offset_ms: std::sync::Arc<std::sync::atomic::AtomicI64>,
    changed: watch::Sender<i64>,
}

impl ServerClock {
    pub(crate) fn new() -> Self {
        Self { offset_ms: Default::default(), changed: watch::Sender::new(0) }
    }

    /// The server's clock minus this machine's.
    pub(crate) fn offset(&self) -> chrono::TimeDelta {
        chrono::TimeDelta::milliseconds(self.offset_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Takes a new measure: the server said `server` between `sent` and `back` on this clock
    /// (uncorrected). Returns the offset when it moved by more than the round trip's noise.
    pub(crate) fn measure(&self, sent: DateTime<Utc>, back: DateTime<Utc>, server: DateTime<Utc>) -> Option<chrono::TimeDelta> {
        let middle = sent + (back - sent) / 2;
        let offset = server - middle;
        let noise = ((back - sent) / 2).max(chrono::TimeDelta::milliseconds(50));
        if (offset - self.offset()).abs() <= noise {
            return None;
        }
        let ms = offset.num_milliseconds();
        self.offset_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
        self.changed.send_replace(ms);
        Some(offset)
    }
}

impl Clock for ServerClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.offset()
    }

    fn sleep_until(&self, t: DateTime<Utc>) -> Sleep {
        let mut changed = self.changed.subscribe();
        let offset = self.offset_ms.clone();
        Box::pin(async move {
            loop {
                let off = chrono::TimeDelta::milliseconds(offset.load(std::sync::atomic::Ordering::Relaxed));
                tokio::select! {
                    () = SystemClock.sleep_until(t - off) => return,
                    r = changed.changed() => if r.is_err() { return },
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
    fn the_server_clock_takes_the_servers_time_from_the_middle_of_the_round_trip() {
        let c = ServerClock::new();
        let sent = Utc::now();
        let ms = chrono::TimeDelta::milliseconds;
        // This machine three minutes ahead: the server said 3 min less, mid-way through 40 ms.
        assert_eq!(c.measure(sent, sent + ms(40), sent + ms(20) - chrono::TimeDelta::minutes(3)), Some(-chrono::TimeDelta::minutes(3)));
        assert!((c.now() - (Utc::now() - chrono::TimeDelta::minutes(3))).abs() < ms(100), "{}", c.now());
        // Noise within the round trip (or 50 ms) is not a change.
        assert_eq!(c.measure(sent, sent + ms(40), sent + ms(60) - chrono::TimeDelta::minutes(3)), None);
        assert_eq!(c.measure(sent, sent + ms(40), sent + ms(20)), Some(ms(0)), "back in step");
    }

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

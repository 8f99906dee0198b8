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

/// The database server's clock: on a shared database every worker schedules, times out and
/// records on the server's time, so a worker whose own clock is minutes off, or steps while it
/// runs, fires nothing early or late and records no time ahead. The server's time is measured
/// at each lease renewal (against the middle of the round trip) and carried between renewals
/// by the monotonic clock: a step of the wall clock (NTP, `date -s`, a VM resumed) does not
/// move it at all. A sleep measures again when a renewal moves it.
#[derive(Debug)]
pub(crate) struct ServerClock {
    origin: std::time::Instant,
    /// The server's time at `origin`, in Unix ms, as the last measure puts it (until the first,
    /// this machine's).
    at_origin_ms: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// The server's clock minus this machine's wall clock at the last measure, in ms.
    machine_offset_ms: std::sync::atomic::AtomicI64,
    changed: watch::Sender<i64>,
}

impl ServerClock {
    pub(crate) fn new() -> Self {
        let origin = std::time::Instant::now();
        Self {
            origin,
            at_origin_ms: std::sync::Arc::new(Utc::now().timestamp_millis().into()),
            machine_offset_ms: 0.into(),
            changed: watch::Sender::new(0),
        }
    }

    /// Milliseconds of monotonic time from `origin` to `at`.
    fn since_origin(&self, at: std::time::Instant) -> i64 {
        at.saturating_duration_since(self.origin).as_millis() as i64
    }

    /// Takes a new measure: the server said `server` between `sent` and `back` (monotonic
    /// instants). Returns the server's clock minus this machine's when that moved by more than
    /// the round trip's noise (for the caller to tell).
    pub(crate) fn measure(&self, sent: std::time::Instant, back: std::time::Instant, server: DateTime<Utc>) -> Option<chrono::TimeDelta> {
        use std::sync::atomic::Ordering::Relaxed;
        let middle = (self.since_origin(sent) + self.since_origin(back)) / 2;
        let noise = (back.saturating_duration_since(sent).as_millis() as i64 / 2).max(50);
        let at_origin = server.timestamp_millis() - middle;
        if (at_origin - self.at_origin_ms.load(Relaxed)).abs() > noise {
            self.at_origin_ms.store(at_origin, Relaxed);
            self.changed.send_replace(at_origin);
        }
        let machine = (self.now() - Utc::now()).num_milliseconds();
        let before = self.machine_offset_ms.swap(machine, Relaxed);
        ((machine - before).abs() > noise).then(|| chrono::TimeDelta::milliseconds(machine))
    }
}

impl Clock for ServerClock {
    fn now(&self) -> DateTime<Utc> {
        let ms = self.at_origin_ms.load(std::sync::atomic::Ordering::Relaxed) + self.since_origin(std::time::Instant::now());
        DateTime::from_timestamp_millis(ms).unwrap_or_default()
    }

    fn sleep_until(&self, t: DateTime<Utc>) -> Sleep {
        let mut changed = self.changed.subscribe();
        let (origin, at_origin) = (self.origin, self.at_origin_ms.clone());
        Box::pin(async move {
            loop {
                let now = at_origin.load(std::sync::atomic::Ordering::Relaxed)
                    + std::time::Instant::now().saturating_duration_since(origin).as_millis() as i64;
                let left = t.timestamp_millis() - now;
                if left <= 0 {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_millis(left as u64)) => {}
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
        let sent = std::time::Instant::now();
        let back = sent + std::time::Duration::from_millis(40);
        let ms = chrono::TimeDelta::milliseconds;
        let mins = chrono::TimeDelta::minutes;
        // The server three minutes behind this machine, mid-way through 40 ms.
        let told = c.measure(sent, back, Utc::now() - mins(3)).expect("a change");
        assert!((told + mins(3)).abs() < ms(100), "{told}");
        assert!((c.now() - (Utc::now() - mins(3))).abs() < ms(100), "{}", c.now());
        // Noise within the round trip (or 50 ms) is not a change.
        assert_eq!(c.measure(sent, back, Utc::now() - mins(3) + ms(30)), None);
        let told = c.measure(sent, back, Utc::now()).expect("back in step");
        assert!(told.abs() < ms(100), "{told}");
    }

    /// Between renewals the server's time moves with the monotonic clock only: what the wall
    /// clock does (here, what it said when the measure was taken) does not move it.
    #[tokio::test]
    async fn the_server_clock_keeps_monotonic_time_between_measures() {
        let c = ServerClock::new();
        let sent = std::time::Instant::now();
        let server = Utc::now() + chrono::TimeDelta::hours(1);
        c.measure(sent, sent, server);
        let before = c.now();
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        let passed = c.now() - before;
        assert!(passed >= chrono::TimeDelta::milliseconds(30) && passed < chrono::TimeDelta::milliseconds(500), "{passed}");
        assert!((c.now() - server).num_milliseconds() < 1000);
        // A sleep until a server instant 50 ms ahead ends after about 50 ms of monotonic time.
        let started = std::time::Instant::now();
        c.sleep_until(c.now() + chrono::TimeDelta::milliseconds(50)).await;
        assert!(started.elapsed() >= std::time::Duration::from_millis(45), "{:?}", started.elapsed());
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

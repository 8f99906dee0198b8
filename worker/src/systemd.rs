//! systemd's service protocol (`sd_notify(3)`) for `Type=notify` units: `READY=1` once the
//! worker serves, `RELOADING=1` … `READY=1` around a reload, `STOPPING=1` when it drains, and
//! `WATCHDOG=1` while the scheduler keeps completing passes.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) every call is a no-op. The protocol is one datagram
//! per message on a Unix socket, a path or (leading `@`) an abstract name; it is written here
//! rather than taken from a crate because the one maintained crate treats `@name` as a path.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lamplighter_jobs::Engine;
use tokio_util::sync::CancellationToken;

/// The service manager's notification socket, when there is one.
pub(crate) struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    /// A failed send is logged once, not at every watchdog ping.
    failed: AtomicBool,
}

impl Notifier {
    /// The socket named by `NOTIFY_SOCKET`; `None` when it is unset or empty. A value that
    /// cannot be used is logged and treated as unset: the worker runs, systemd times it out.
    pub(crate) fn from_env() -> Option<Notifier> {
        let value = std::env::var_os("NOTIFY_SOCKET")?;
        let value = value.to_str().filter(|v| !v.is_empty())?.to_owned();
        match Self::connect(&value) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::error!("NOTIFY_SOCKET={value:?} cannot be used ({e}); systemd will not hear that the worker is ready");
                None
            }
        }
    }

    fn connect(value: &str) -> std::io::Result<Notifier> {
        let addr = match value.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
            None if value.starts_with('/') => SocketAddr::from_pathname(value)?,
            None => return Err(std::io::Error::other("neither an absolute path nor an @abstract name")),
        };
        Ok(Notifier { socket: UnixDatagram::unbound()?, addr, failed: AtomicBool::new(false) })
    }

    /// Serving: the first pass is done and the listener is up (what `/readyz` says).
    pub(crate) fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// A reload starts; [`Notifier::ready`] ends it, whether or not the new config was taken.
    /// `MONOTONIC_USEC` is required by `Type=notify-reload` (systemd ≥ 253), ignored before.
    pub(crate) fn reloading(&self) {
        match monotonic_usec() {
            Some(us) => self.send(&format!("RELOADING=1\nMONOTONIC_USEC={us}")),
            None => self.send("RELOADING=1"),
        }
    }

    /// Draining for shutdown: systemd stops expecting watchdog pings from here on, and gives
    /// the drain `grace` (plus the time to record what it interrupts) even when a reload
    /// raised `worker.shutdown_grace` above the unit's `TimeoutStopSec`.
    pub(crate) fn stopping(&self, status: &str, grace: Duration) {
        let extend = (grace + Duration::from_secs(30)).as_micros();
        self.send(&format!("STOPPING=1\nEXTEND_TIMEOUT_USEC={extend}\nSTATUS={}", one_line(status)));
    }

    fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    fn send(&self, message: &str) {
        match self.socket.send_to_addr(message.as_bytes(), &self.addr) {
            Ok(_) => self.failed.store(false, Ordering::Relaxed),
            Err(e) => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!("cannot notify systemd ({e}): {}", message.lines().next().unwrap_or_default());
                }
            }
        }
    }
}

/// `STATUS=` is one line.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

fn monotonic_usec() -> Option<u64> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).ok()?.checked_mul(1_000_000)?.checked_add(u64::try_from(t.tv_nsec).ok()? / 1000)
}

/// How often to ping the watchdog: half of `WATCHDOG_USEC`, when it is set for this process
/// (`WATCHDOG_PID` unset or ours), as `sd_watchdog_enabled(3)` decides.
pub(crate) fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    interval_from(usec.as_deref(), pid.as_deref(), std::process::id())
}

fn interval_from(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok()? != own_pid
    {
        return None;
    }
    // At least a millisecond: a zero period is no period.
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// Pings the watchdog every `every` (half of `WATCHDOG_USEC`) while the scheduler completes a
/// pass within half of that: two pings are then never further apart than three quarters of
/// the timeout. A scheduler stuck on its database (or on anything else) stops the pings, and
/// systemd restarts the worker after `WatchdogSec`. Ends when `stop` is cancelled (at
/// `STOPPING=1`).
pub(crate) async fn watchdog(notifier: std::sync::Arc<Notifier>, engine: Engine, every: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stalled = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            () = stop.cancelled() => return,
            passed = tokio::time::timeout(every / 2, engine.next_pass()) => match passed {
                Ok(()) => {
                    if std::mem::take(&mut stalled) {
                        tracing::info!("the scheduler completes its passes again; watchdog pings resume");
                    }
                    notifier.watchdog();
                }
                Err(_) if !stalled => {
                    stalled = true;
                    tracing::error!(
                        "the scheduler has not completed a pass in {} ms; watchdog pings stop (systemd restarts the worker if this lasts)",
                        (every / 2).as_millis()
                    );
                }
                Err(_) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_is_half_the_timeout_and_only_for_this_process() {
        assert_eq!(interval_from(Some("30000000"), None, 7), Some(Duration::from_secs(15)));
        assert_eq!(interval_from(Some("30000000"), Some("7"), 7), Some(Duration::from_secs(15)));
        // Meant for another process (a parent that did not clear it), or not set at all.
        assert_eq!(interval_from(Some("30000000"), Some("8"), 7), None);
        assert_eq!(interval_from(None, Some("7"), 7), None);
        // Garbage or zero: no watchdog, as sd_watchdog_enabled(3) answers.
        for bad in ["", "0", "-5", "30s", "1e6"] {
            assert_eq!(interval_from(Some(bad), None, 7), None, "{bad:?}");
        }
        // Absurdly short: still a period tokio can tick at.
        assert_eq!(interval_from(Some("1"), None, 7), Some(Duration::from_millis(1)));
        assert_eq!(interval_from(Some("200000"), Some("x"), 7), None);
    }

    #[test]
    fn notify_socket_is_a_path_or_an_abstract_name() {
        assert!(Notifier::connect("/run/systemd/notify").is_ok());
        assert!(Notifier::connect("@lamplighter/notify").is_ok());
        let e = Notifier::connect("relative/notify").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("absolute path"), "{e}");
    }

    #[test]
    fn messages_reach_the_socket_one_datagram_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        listener.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = Notifier::connect(path.to_str().unwrap()).unwrap();
        let mut buf = [0u8; 512];
        let mut next = || {
            let len = listener.recv(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..len]).into_owned()
        };
        n.ready("serving 3 jobs\non 127.0.0.1");
        assert_eq!(next(), "READY=1\nSTATUS=serving 3 jobs on 127.0.0.1");
        n.reloading();
        let m = next();
        let usec: u64 = m.strip_prefix("RELOADING=1\nMONOTONIC_USEC=").and_then(|u| u.parse().ok()).unwrap_or_else(|| panic!("{m}"));
        assert!(usec > 0);
        n.watchdog();
        assert_eq!(next(), "WATCHDOG=1");
        n.stopping("draining", Duration::from_secs(30));
        assert_eq!(next(), "STOPPING=1\nEXTEND_TIMEOUT_USEC=60000000\nSTATUS=draining");
    }
}

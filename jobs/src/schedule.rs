//! Runtime schedule policy. The schedules themselves are parsed once, by the config crate.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// A delay in `[0, max)` that depends only on the job and the tick, so a tick keeps its jitter
/// across restarts and on every worker.
pub fn jitter_for(job: &str, tick: DateTime<Utc>, max: Duration) -> Duration {
    let ms = max.as_millis() as u64;
    if ms == 0 {
        return Duration::ZERO;
    }
    // FNV-1a: stable across Rust versions, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.as_bytes().iter().chain(&tick.timestamp_millis().to_le_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Duration::from_millis(h % ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn jitter_is_stable_per_tick_and_bounded() {
        let t = utc("2026-01-01T02:00:00Z");
        let max = Duration::from_secs(60);
        let a = jitter_for("nightly", t, max);
        assert_eq!(a, jitter_for("nightly", t, max));
        assert!(a < max);
        let spread: std::collections::HashSet<_> = (0..50).map(|i| jitter_for("nightly", t + chrono::Duration::days(i), max)).collect();
        assert!(spread.len() > 40, "jitter should vary between ticks");
        assert_eq!(jitter_for("x", t, Duration::ZERO), Duration::ZERO);
    }
}

//! Lamplighter's jobs: schedules, the persistent queue and run store, the scheduler and the
//! job service API.

mod schedule;

pub use schedule::{Schedule, ScheduleError, jitter_for};

//! Notifications, as values: what is recorded for an event (its key, its target, the event as
//! sent), what a receiver is sent, and when a failed send is tried again. Which events fire is
//! decided in `decide.rs` (`notify_on_outcome`, `notify_on_wait`); the store records them in
//! the transaction that notices the outcome, and `notifier.rs` sends them.
//!
//! An event's key is `{run identity}/{event}[/{step}]/{rule}`: noticing an outcome twice (a
//! crash before the mark was written) or a wait again records nothing new, and a receiver is
//! sent the key (`Idempotency-Key`) to recognise a repeat of a send whose answer was lost.

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};

use lamplighter_config::{Backoff, NotifyOn, NotifyTarget, RetryPolicy};

use crate::run::Run;
pub(crate) use lamplighter_contract::{Notification, NotificationStatus};

/// A notification to record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NewNotification {
    pub(crate) key: String,
    pub(crate) job: String,
    pub(crate) run_id: String,
    pub(crate) root_id: String,
    pub(crate) event: NotifyOn,
    /// [`NotifyTarget::describe`].
    pub(crate) target: String,
    pub(crate) target_id: String,
    pub(crate) payload: Value,
}

/// A notification claimed for sending.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub(crate) key: String,
    pub(crate) job: String,
    pub(crate) event: String,
    pub(crate) target: String,
    pub(crate) target_id: String,
    pub(crate) payload: Value,
    /// This one included.
    pub(crate) attempts: u32,
    pub(crate) created_at: DateTime<Utc>,
}

/// How a send ended, as the store records it (`Notices::notification_sent`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Sent {
    /// Taken: what it became (`HTTP 200`, `run <id>`).
    Delivered(String),
    /// Not taken; tried again at the instant, or given up on (`None`).
    Failed { error: String, retry_at: Option<DateTime<Utc>> },
}

/// How long a failed notification is tried again before it is given up on.
pub(crate) const GIVE_UP_AFTER: TimeDelta = TimeDelta::hours(24);

/// When a send that failed (the `attempts`th) is tried again: after 1 s, doubling to at most
/// 5 min, until [`GIVE_UP_AFTER`] from its creation; `None` then, or for a failure that
/// sending again cannot mend (`permanent`).
pub(crate) fn retry_at(attempts: u32, permanent: bool, created_at: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if permanent {
        return None;
    }
    let backoff = RetryPolicy {
        max: u32::MAX,
        backoff: Backoff::Exponential { initial: std::time::Duration::from_secs(1), max_delay: std::time::Duration::from_secs(300) },
    };
    let at = now + TimeDelta::from_std(backoff.delay(attempts)).unwrap_or(TimeDelta::seconds(300));
    (at - created_at <= GIVE_UP_AFTER).then_some(at)
}

/// A target's identity, to find its rule in the config in force when it is sent: the kind and
/// the URL or name, hashed (FNV-1a, stable across versions), so a secret in a URL is not stored.
pub(crate) fn target_id(t: &NotifyTarget) -> String {
    let text = match t {
        NotifyTarget::Webhook(w) => format!("webhook\0{}", w.url),
        NotifyTarget::Workflow(w) => format!("workflow\0{w}"),
        NotifyTarget::Agent(a) => format!("agent\0{a}"),
        NotifyTarget::Plugin { plugin, action } => format!("plugin\0{plugin}\0{action}"),
    };
    format!("{:016x}", crate::share::fnv1a(text.bytes()))
}

/// The key of an event: see the module's text.
pub(crate) fn key(root_id: &str, event: NotifyOn, step: Option<&str>, rule: usize) -> String {
    match step {
        Some(step) => format!("{root_id}/{}/{step}/{rule}", event.as_str()),
        None => format!("{root_id}/{}/{rule}", event.as_str()),
    }
}

/// The event as recorded and sent (a generic webhook's body, a workflow's or agent's input, a
/// plugin action's parameters).
pub(crate) fn payload(event: NotifyOn, key: &str, run: &Run, consecutive_failures: u32, step: Option<&str>) -> Value {
    let duration_ms = match (run.started_at, run.finished_at) {
        (Some(s), Some(f)) => Some((f - s).num_milliseconds().max(0)),
        _ => None,
    };
    let mut v = json!({
        "event": event.as_str(),
        "key": key,
        "job": run.owner.to_string(),
        "run_id": run.id,
        "root_id": run.root_id,
        "status": run.status.as_str(),
        "error": run.error,
        "attempt": run.attempt,
        "trigger": run.trigger.as_str(),
        "scheduled_at": run.scheduled_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "duration_ms": duration_ms,
        "consecutive_failures": consecutive_failures,
        "worker": run.worker,
        "command": format!("lampctl runs show {}", run.id),
    });
    if let Some(step) = step {
        v["step"] = json!(step);
        v["command"] = json!(format!("lampctl approvals approve {} --step {step}", run.id));
    }
    v
}

/// The notifications `rules` record for ticks of `job` no worker fired on time (`missed`): not
/// about a run, so keyed by the job and the first missed tick.
pub(crate) fn missed_notifications(
    job: &str,
    m: &crate::schedule::MissedTicks,
    catch_up: Option<lamplighter_config::CatchUp>,
    rules: &[lamplighter_config::NotifyRule],
) -> Vec<NewNotification> {
    let root = format!("missed:{job}:{}", m.first.timestamp_millis());
    rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.on == NotifyOn::Missed)
        .map(|(i, r)| {
            let key = key(&root, NotifyOn::Missed, None, i);
            let payload = json!({
                "event": NotifyOn::Missed.as_str(),
                "key": key,
                "job": job,
                "why": "no worker fired them on time (none was up, or the database was away)",
                "tick": m.last,
                "first_tick": m.first,
                "last_tick": m.last,
                "count": m.count,
                "caught_up": m.caught_up,
                "skipped": m.skipped,
                "outside_window": m.outside_window,
                "catch_up": catch_up.map(|c| format!("{c:?}").to_lowercase()),
                "command": format!("lampctl jobs show {job}"),
            });
            NewNotification {
                key,
                job: job.to_string(),
                run_id: String::new(),
                root_id: root.clone(),
                event: NotifyOn::Missed,
                target: r.to.describe(),
                target_id: target_id(&r.to),
                payload,
            }
        })
        .collect()
}

/// The one line a chat message says (Slack's `text`).
pub(crate) fn text(payload: &Value) -> String {
    let s = |k: &str| payload.get(k).and_then(Value::as_str).unwrap_or_default();
    let job = s("job");
    let what = match s("event") {
        "failure" => {
            let n = payload.get("consecutive_failures").and_then(Value::as_u64).unwrap_or(1);
            let times = if n > 1 { format!(" ({n} in a row)") } else { String::new() };
            format!(":red_circle: job *{job}* {}{times}", s("status").replace('_', " "))
        }
        "recovery" => format!(":large_green_circle: job *{job}* recovered"),
        "success" => format!(":white_check_mark: job *{job}* succeeded"),
        "approval_waiting" => format!(":raised_hand: job *{job}* waits for approval of step `{}`", s("step")),
        "budget_asked" => format!(":moneybag: job *{job}* asks for more budget (step `{}`)", s("step")),
        "missed" => format!(
            ":ghost: job *{job}* missed {} tick(s) from {} to {}: {} caught up, {} skipped by catch_up, {} outside catch_up_window",
            payload["count"],
            s("first_tick"),
            s("last_tick"),
            payload["caught_up"],
            payload["skipped"],
            payload["outside_window"]
        ),
        "deadline_missed" => {
            let late = payload.get("late_seconds").and_then(Value::as_i64).unwrap_or(0);
            let stopped = if s("on_miss") == "cancel" { ", stopped" } else { "" };
            format!(
                ":alarm_clock: job *{job}* missed its deadline {} (due {}, {} s late, {}{stopped})",
                s("deadline"),
                s("due_at"),
                late,
                s("status").replace('_', " ")
            )
        }
        other => format!("job *{job}*: {other}"),
    };
    let error = payload.get("error").and_then(Value::as_str).map(|e| format!(": {}", shorten(e, 300))).unwrap_or_default();
    let took = payload.get("duration_ms").and_then(Value::as_i64).map(|ms| format!(" after {}", seconds(ms))).unwrap_or_default();
    format!("{what}{took}{error} — run {} (attempt {}); `{}`", s("run_id"), payload["attempt"], s("command"))
}

fn seconds(ms: i64) -> String {
    if ms < 10_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        humantime::format_duration(std::time::Duration::from_secs((ms / 1000) as u64)).to_string()
    }
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let cut: String = s.chars().take(max - 1).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Run {
        let t: chrono::DateTime<chrono::Utc> = "2027-01-15T08:00:00Z".parse().expect("time");
        Run {
            scheduled_at: Some(t),
            started_at: Some(t),
            finished_at: Some(t + chrono::TimeDelta::milliseconds(2500)),
            attempt: 2,
            error: Some("exit 3".into()),
            worker: Some("w1".into()),
            root_id: "r1".into(),
            retry_of: Some("r1".into()),
            follow_up: crate::run::FollowUp::None,
            ..Run::for_tests("r2", crate::run::Owner::Job("nightly".into()), crate::run::Trigger::Cron, crate::run::RunStatus::Failed, t)
        }
    }

    #[test]
    fn the_event_carries_what_a_receiver_needs() {
        let k = key("r1", NotifyOn::Failure, None, 0);
        assert_eq!(k, "r1/failure/0");
        let p = payload(NotifyOn::Failure, &k, &run(), 2, None);
        assert_eq!(p["job"], "nightly");
        assert_eq!(p["run_id"], "r2");
        assert_eq!(p["status"], "failed");
        assert_eq!(p["error"], "exit 3");
        assert_eq!(p["duration_ms"], 2500);
        assert_eq!(p["attempt"], 2);
        assert_eq!(p["command"], "lampctl runs show r2");
        assert_eq!(
            text(&p),
            ":red_circle: job *nightly* failed (2 in a row) after 2.5 s: exit 3 — run r2 (attempt 2); `lampctl runs show r2`"
        );
        let w = payload(NotifyOn::ApprovalWaiting, &key("r1", NotifyOn::ApprovalWaiting, Some("review"), 1), &run(), 0, Some("review"));
        assert_eq!(w["key"], "r1/approval_waiting/review/1");
        assert_eq!(w["command"], "lampctl approvals approve r2 --step review");
    }

    #[test]
    fn failed_sends_back_off_then_give_up() {
        let t = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        assert_eq!(retry_at(1, false, t, t), Some(t + TimeDelta::seconds(1)));
        assert_eq!(retry_at(4, false, t, t), Some(t + TimeDelta::seconds(8)));
        assert_eq!(retry_at(30, false, t, t), Some(t + TimeDelta::seconds(300)));
        assert_eq!(retry_at(1, true, t, t), None, "a refusal that sending again cannot mend");
        assert_eq!(retry_at(3, false, t, t + GIVE_UP_AFTER), None);
    }

    #[test]
    fn targets_are_known_by_a_hash_of_what_they_name() {
        let hook = |url: &str| {
            NotifyTarget::Webhook(lamplighter_config::Webhook {
                url: url.into(),
                headers: vec![],
                format: lamplighter_config::WebhookFormat::Generic,
            })
        };
        assert_eq!(target_id(&hook("https://h/a")), target_id(&hook("https://h/a")));
        assert_ne!(target_id(&hook("https://h/a")), target_id(&hook("https://h/b")));
        assert!(!target_id(&hook("https://h/secret")).contains("secret"));
        assert_eq!(target_id(&NotifyTarget::Workflow("w".into())).len(), 16);
    }
}

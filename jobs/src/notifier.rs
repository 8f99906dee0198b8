//! The notifier: notices the outcomes of runs that ended (and the waits for a decision) and
//! sends the notifications the jobs' `notify:` rules record for them. Both halves go through the
//! database, so nothing is lost across a crash and nothing is recorded twice: a notice pass
//! marks what it noticed in the transaction that records its notifications, and a notification
//! is claimed before it is sent and marked after. A send cut short by a crash is sent again once
//! its claim runs out, with the same key, which receivers get as `Idempotency-Key`.
//!
//! On a shared database one worker of a group notices ([`Share::notices_outcomes`]): the
//! passes are one at a time across workers anyway, so each worker noticing what any of them
//! ran only multiplied the passes, their job-state writes and the prunings they ask for. The
//! others send what is due; a killed noticer's role moves with its shares, and what ended
//! meanwhile is noticed by the next. A draining worker notices too (its group may be leaving
//! with it), and so does any worker that finds a run unnoticed for longer than the role takes
//! to move (the noticer stuck or far behind).
//!
//! A broken receiver never touches the run it reports: the run's end is recorded before any of
//! this starts, and failed sends are retried with backoff ([`crate::notify::retry_at`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use lamplighter_config::{NotifyTarget, Webhook, WebhookFormat};

use crate::agent::connection_error;
use crate::clock::Clock;
use crate::events::Observer;
use crate::in_force::{InForce, JobsConfig};
use crate::notify::{self, Claimed, Sent};
use crate::run::{Owner, Trigger};
use crate::share::Share;
use crate::signals::{Receiver, Signal, Signals};
use crate::snapshot::{JobSnapshot, TargetRef};
use crate::store::{NewRun, Notices, Records, StoreError};

/// Sends in flight at once.
const PARALLEL: usize = 16;
/// How long a claimed notification is this worker's to send: past it, another pass (this
/// worker's after a restart, or another worker's) sends it again.
const CLAIM: Duration = Duration::from_secs(60);
/// How long a webhook may take to answer.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest the notifier sleeps with nothing due: a wake-up it missed costs at most this.
const IDLE_LOOK_AGAIN: chrono::TimeDelta = chrono::TimeDelta::seconds(10);
/// The least time between two passes woken by runs ending. A pass is two write transactions;
/// woken by every batch of ends, the passes took the single writer as often as the recorder
/// did. Measured on a draining queue (`cargo bench … runcore -- queue`): each write of ends
/// waited 0.95 ms for the writer, 0.56 ms with this gap; the drain went from 7,900 to 9,500
/// runs/s. The ends of that time are noticed in one pass; a job's notifications still go out
/// in the order they were recorded (`Notices::claim_notifications`).
const PASS_GAP: Duration = Duration::from_millis(100);

/// What the notifier is handed.
pub(crate) struct NotifierEnv {
    pub(crate) notices: Arc<dyn Notices>,
    /// The runs that notifications start are inserted here.
    pub(crate) records: Arc<dyn Records>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) signals: Arc<dyn Signals>,
    pub(crate) config: Arc<InForce>,
    pub(crate) observer: Arc<Observer>,
    /// Asked to prune the jobs whose runs a pass noticed: a run is kept until it is noticed.
    pub(crate) retention: Arc<crate::retention::PruneQueue>,
    pub(crate) worker: String,
    /// This worker's share of the group (PostgreSQL): one member notices the outcomes
    /// ([`Share::notices_outcomes`]); every member sends what is due.
    pub(crate) share: tokio::sync::watch::Receiver<Share>,
    /// Cancelled when this worker's shutdown begins: from then on it notices too (it left the
    /// group, and its drained runs' outcomes are not left to a group that may be leaving).
    pub(crate) draining: CancellationToken,
    /// How long a run may wait unnoticed before a worker that is not the noticer notices it
    /// anyway (the noticer is stuck, or behind): beyond the time its role takes to move.
    pub(crate) stale_after: chrono::TimeDelta,
}

/// The webhooks' HTTP client, built at the first webhook (a build that failed is tried again
/// at the next).
type Http = OnceLock<reqwest::Client>;

/// Notices and sends until `stop`: at start (what a crash left), whenever runs end or wait (on
/// the member of a group that notices outcomes; at once when it becomes that member), and when
/// the next send or retry is due.
pub(crate) async fn run(env: NotifierEnv, mut signals: Receiver, stop: CancellationToken) {
    // Built at the first webhook, not at start: a client loads and parses the system's TLS
    // roots, time and memory a worker without webhooks would pay for nothing.
    // A build that failed (no roots to load) fails each webhook with why, to be tried again.
    let http: Http = OnceLock::new();
    // What this worker's name left mid-send (a crash): sent again now rather than when the
    // claim runs out. Its key lets the receiver tell a repeat.
    match env.notices.release_claims(&env.worker, env.clock.now()).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(notifications = n, "notifications left mid-send by an earlier process are sent again"),
        Err(e) => tracing::warn!(error = %e, "cannot hand back notifications left mid-send; they are sent once their claim runs out"),
    }
    let mut share = env.share.clone();
    let mut noticing = share.borrow_and_update().notices_outcomes();
    env.observer.set_noticer(noticing);
    let became = |noticing: &mut bool, now: bool, signals: &mut Receiver| {
        if now == *noticing {
            return false;
        }
        *noticing = now;
        env.observer.set_noticer(now);
        if now {
            tracing::info!("this worker notices the outcomes of runs now");
            // What ended meanwhile is noticed at once.
            signals.drain();
        } else {
            tracing::info!("another worker notices the outcomes of runs now");
        }
        now
    };
    let mut failures = 0u32;
    loop {
        let began = tokio::time::Instant::now();
        let next = match pass(&env, &http, noticing, &stop).await {
            Ok(next) => {
                failures = 0;
                next
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(error = %e, failures, "cannot notice or send notifications; trying again");
                }
                Some(env.clock.now() + chrono::TimeDelta::seconds(i64::from(failures.min(30))))
            }
        };
        let at = next.unwrap_or(DateTime::<Utc>::MAX_UTC).min(env.clock.now() + IDLE_LOOK_AGAIN);
        loop {
            tokio::select! {
                () = env.clock.sleep_until(at) => break,
                // Runs' ends matter only to the member that notices them.
                () = woken(&mut signals), if noticing => {
                    tokio::select! {
                        () = tokio::time::sleep_until(began + PASS_GAP) => {}
                        () = stop.cancelled() => return,
                    }
                    // One pass serves every signal that came meanwhile.
                    signals.drain();
                    break;
                }
                () = share_changed(&mut share) => {
                    let now = env.draining.is_cancelled() || share.borrow_and_update().notices_outcomes();
                    if became(&mut noticing, now, &mut signals) {
                        break;
                    }
                }
                () = env.draining.cancelled(), if !noticing => {
                    if became(&mut noticing, true, &mut signals) {
                        break;
                    }
                }
                () = stop.cancelled() => return,
            }
        }
    }
}

/// Resolves when the worker's share changed (never once the lease keeper is gone).
async fn share_changed(share: &mut tokio::sync::watch::Receiver<Share>) {
    if share.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves at the next signal that may mean something to notice: a run's end (a run waits for
/// a decision through its end too), or signals missed.
async fn woken(signals: &mut Receiver) {
    loop {
        match signals.recv().await {
            Some(Signal::RunFinished(_) | Signal::Lagged | Signal::Wake) => return,
            Some(_) => {}
            None => std::future::pending().await,
        }
    }
}

/// Notices what ended (when `noticing`), then sends what is due (until `stop`); returns when to
/// look again: the next send due, or a failure whose retry may still be recorded.
async fn pass(env: &NotifierEnv, http: &Http, noticing: bool, stop: &CancellationToken) -> Result<Option<DateTime<Utc>>, StoreError> {
    let config = env.config.get();
    let rules = |job: &str| config.notify_rules(job);
    let waits = config.notifies_waits();
    let noticing = noticing || stale(env).await?;
    let recheck_at = loop {
        if !noticing {
            break None;
        }
        let now = env.clock.now();
        let after = |job: &str| config.downstream(job, now);
        let noticed = env.notices.notice(&rules, &after, waits, now).await?;
        tracing::debug!(runs = noticed.runs, notifications = noticed.recorded, more = noticed.more, "outcomes noticed");
        for (job, id) in &noticed.started {
            // As a run started by hand: counted, and handed over by the scheduler's next look
            // (or in the queue already, where an insert queues it).
            tracing::info!(job = %job, run = %id, "started after its upstream jobs");
            env.observer.run_created(&Owner::Job(job.clone()), Trigger::After, id);
        }
        if !noticed.started.is_empty() {
            env.signals.publish(Signal::Wake);
            // Where an insert queues a run, any worker may take it now.
            if env.records.queued_by_insert() {
                env.signals.publish(Signal::TasksPushed);
            }
        }
        for (job, ended) in &noticed.prunable {
            env.retention.prune_soon(job, ended.earliest, ended.runs);
        }
        if !noticed.more {
            break noticed.recheck_at;
        }
    };
    while !stop.is_cancelled() {
        let claimed = env.notices.claim_notifications(&env.worker, PARALLEL, CLAIM, env.clock.now()).await?;
        if claimed.is_empty() {
            break;
        }
        // Side by side: a claim holds at most one notification per job
        // (`claim_notifications` keeps a job's in order).
        let sends = claimed.into_iter().map(|c| {
            let config = config.clone();
            async move {
                let sent = send(env, http, &config, &c).await;
                (c, sent)
            }
        });
        for (c, sent) in futures::future::join_all(sends).await {
            let outcome = match &sent {
                Sent::Delivered(what) => {
                    tracing::info!(job = %c.job, event = %c.event, to = %c.target, key = %c.key, result = %what, "notification sent");
                    "delivered"
                }
                Sent::Failed { error, retry_at: Some(at) } => {
                    tracing::warn!(job = %c.job, event = %c.event, to = %c.target, key = %c.key, attempt = c.attempts, retry_at = %at, error = %error, "notification not taken; retrying");
                    "retried"
                }
                Sent::Failed { error, retry_at: None } => {
                    tracing::error!(job = %c.job, event = %c.event, to = %c.target, key = %c.key, attempts = c.attempts, error = %error, "notification given up");
                    "abandoned"
                }
            };
            env.observer.notification(&c.event, outcome);
            // The others' results are recorded all the same; this one is sent again once its
            // claim runs out (with its key).
            if let Err(e) = env.notices.notification_sent(&c.key, &env.worker, &sent, env.clock.now()).await {
                tracing::warn!(key = %c.key, error = %e, "cannot record how a notification's send ended; it is sent again later");
            }
        }
    }
    let next = env.notices.next_notification().await?;
    Ok([next, recheck_at].into_iter().flatten().min())
}

/// Whether a run has waited unnoticed longer than the noticer's role takes to move: then this
/// worker notices too (under the same lock, so nothing is noticed twice).
async fn stale(env: &NotifierEnv) -> Result<bool, StoreError> {
    let Some(since) = env.notices.unnoticed_since().await? else { return Ok(false) };
    let waited = env.clock.now() - since;
    if waited <= env.stale_after {
        return Ok(false);
    }
    tracing::warn!(
        waited_s = waited.num_seconds(),
        "a run that ended {}s ago is not noticed yet (the worker that notices outcomes is behind or stuck); this worker notices too",
        waited.num_seconds()
    );
    Ok(true)
}

/// Sends one notification, to its rule's target as the config in force has it.
async fn send(env: &NotifierEnv, http: &Http, config: &JobsConfig, c: &Claimed) -> Sent {
    let now = env.clock.now();
    let target =
        config.notify_rules(&c.job).and_then(|rules| rules.into_iter().map(|r| r.to).find(|t| notify::target_id(t) == c.target_id));
    let Some(target) = target else {
        return Sent::Failed {
            error: format!("no notify rule of job \"{}\" sends to {} any more (the config changed); not sent", c.job, c.target),
            retry_at: None,
        };
    };
    let failed =
        |error: String, permanent: bool| Sent::Failed { error, retry_at: notify::retry_at(c.attempts, permanent, c.created_at, now) };
    match target {
        NotifyTarget::Webhook(w) => {
            let built = match http.get() {
                Some(client) => Ok(client),
                None => reqwest::Client::builder()
                    .timeout(HTTP_TIMEOUT)
                    .user_agent(concat!("lamplighter/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map(|client| http.get_or_init(|| client))
                    .map_err(|e| e.to_string()),
            };
            let sent = match built {
                Ok(client) => post(client, &w, c).await,
                Err(e) => Err((format!("cannot make HTTP requests: {e}"), false)),
            };
            match sent {
                Ok(status) => Sent::Delivered(format!("HTTP {status}")),
                Err((error, permanent)) => failed(error, permanent),
            }
        }
        other => match start_run(env, config, &other, c).await {
            Ok(id) => Sent::Delivered(format!("run {id}")),
            Err((error, permanent)) => failed(error, permanent),
        },
    }
}

/// POSTs the event; the status when taken (2xx), else why and whether trying again can help
/// (a 4xx other than 408 and 429 cannot).
async fn post(http: &reqwest::Client, w: &Webhook, c: &Claimed) -> Result<u16, (String, bool)> {
    let body = match w.format {
        WebhookFormat::Generic => c.payload.clone(),
        WebhookFormat::Slack => json!({ "text": notify::text(&c.payload) }),
    };
    let mut req = http.post(&w.url).header("Idempotency-Key", &c.key).json(&body);
    for (name, value) in &w.headers {
        req = req.header(name.as_str(), value.expose());
    }
    // Without its URL: a webhook's path may be the secret, and the error is stored and shown.
    let response = req.send().await.map_err(|e| (format!("cannot reach {}: {}", c.target, connection_error(&e.without_url())), false))?;
    let status = response.status();
    if status.is_success() {
        return Ok(status.as_u16());
    }
    let text = response.text().await.unwrap_or_default();
    let text: String = text.chars().take(200).collect();
    let permanent = status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429;
    Err((format!("{} answered HTTP {}: {}", c.target, status.as_u16(), text.trim()), permanent))
}

/// Starts a run of the workflow, agent or plugin action with the event, keyed by the event (so
/// a send repeated after a crash finds the run it started).
async fn start_run(env: &NotifierEnv, config: &JobsConfig, target: &NotifyTarget, c: &Claimed) -> Result<String, (String, bool)> {
    let (owner, target, input, parameters) = match target {
        NotifyTarget::Workflow(w) => {
            let Some(definition) = config.workflows.get(w) else {
                return Err((format!("workflow \"{w}\" is no longer defined"), true));
            };
            let target = TargetRef::Workflow { workflow: w.clone(), definition: Some(definition.clone()) };
            (Owner::Workflow(w.clone()), target, Some(c.payload.clone()), None)
        }
        NotifyTarget::Agent(a) => {
            if !config.agents.agents.contains_key(a) {
                return Err((format!("agent \"{a}\" is no longer defined"), true));
            }
            // An agent is given text: the event as JSON.
            (Owner::Agent(a.clone()), TargetRef::Agent { agent: a.clone() }, Some(Value::String(c.payload.to_string())), None)
        }
        NotifyTarget::Plugin { plugin, action } => (
            Owner::Plugin { plugin: plugin.clone(), action: action.clone() },
            TargetRef::Plugin { plugin: plugin.clone(), action: action.clone() },
            None,
            Some(c.payload.clone()),
        ),
        NotifyTarget::Webhook(_) => return Err(("a webhook is not a run".into(), true)),
    };
    let now = env.clock.now();
    let run = NewRun {
        input,
        parameters,
        idempotency_key: Some(c.key.clone()),
        requested_by: Some(format!("notification {}", c.key)),
        ..NewRun::asked(owner, Trigger::Api, JobSnapshot::of_target(target), now)
    };
    let (owner, trigger) = (run.owner.clone(), run.trigger);
    let (id, created) = env.records.insert_run(run, now).await.map_err(|e| (e.to_string(), false))?;
    if created {
        // As a run started by hand: counted, and handed over by the scheduler's next look.
        env.observer.run_created(&owner, trigger, &id);
        env.signals.publish(Signal::Wake);
    }
    Ok(id)
}

//! The pieces the transaction scripts share. The scripts themselves live in the concern files
//! (`ticks.rs`, `ends.rs`, …), each written once for every backend that implements
//! [`Dialect`]: a script reads the facts it needs, asks the pure decisions of
//! [`crate::decide`] (`plan_ticks` for a wake's ticks) what to do, and writes the result in the same
//! transaction; where the backends really differ (binding a batch, locking, leases, the queue)
//! it calls the dialect.

use std::collections::HashMap;
use std::str::FromStr;

use chrono::{DateTime, Utc};

use super::dialect::{Column, Dialect, Locked, QueueSql, Record, RunSql, Stmt, handed_from_row, insert_rows, run_cols, run_from_row, sql};
use super::{Dispatch, Handed, NewRun, RulesOf, RunEnd, StoreError, StoredJob, Taken, from_ms, ms};
use crate::decide::notify_on_wait;
use crate::limits;
use crate::notify::{self, NewNotification};
use crate::run::{Run, RunStatus};

/// Rows per multi-row statement: as `VALUES` (SQLite), 25 columns × 1000 stays under its bound
/// on parameters (32,766); a row set binds a parameter a column whatever its rows.
pub(super) const ROWS_PER_STATEMENT: usize = 1000;

/// The columns of a run as [`insert_runs`] writes them, with their row set's types.
const RUN_INSERT: [(&str, &str); 25] = [
    ("id", "text"),
    ("job", "text"),
    ("trigger", "text"),
    ("status", "text"),
    ("scheduled_at", "bigint"),
    ("due_at", "bigint"),
    ("enqueued_at", "bigint"),
    ("dispatched_at", "bigint"),
    ("attempt", "bigint"),
    ("input", "text"),
    ("parameters", "text"),
    ("error", "text"),
    ("idempotency_key", "text"),
    ("retry_of", "text"),
    ("finished_at", "bigint"),
    ("root_id", "text"),
    ("job_snapshot", "text"),
    ("worker", "text"),
    ("started_at", "bigint"),
    ("requested_by", "text"),
    ("epoch", "bigint"),
    ("outcome_seen", "bigint"),
    ("limits", "text"),
    ("limit_wait", "text"),
    ("limit_wait_since", "bigint"),
];

/// Runs one notice pass reads ([`Notices::notice`]).
pub(super) const NOTICE_BATCH: usize = 1000;

/// What a notice pass locks (as a job's ticks are locked: no job has this name), so that one
/// pass at a time moves the streaks across workers.
pub(super) const NOTICE_LOCK: &str = "\u{1}notice";

/// The columns of a runtime job, for [`stored_job_from_row`].
pub(super) const DEFINITION_COLS: &str = "name, definition, version, created_by, created_at, updated_by, updated_at";

/// A damaged definition reads as `null`: the job is then shown as one that does not compile,
/// and can be updated or deleted, rather than vanishing.
pub(super) fn stored_job_from_row(r: &impl Record) -> StoredJob {
    StoredJob {
        name: r.text("name"),
        definition: r.json("definition").unwrap_or(serde_json::Value::Null),
        version: r.int("version").max(0) as u64,
        created_by: r.text("created_by"),
        created_at: from_ms(r.int("created_at")),
        updated_by: r.text("updated_by"),
        updated_at: from_ms(r.int("updated_at")),
    }
}

/// Inserts runs, one multi-row statement per [`ROWS_PER_STATEMENT`]. Claimed runs record
/// `epoch`, their worker's lease epoch.
pub(super) async fn insert_runs<D: Dialect>(
    c: &mut D::Conn,
    rows: &[(String, NewRun, Dispatch<'_>)],
    epoch: Option<i64>,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let now = ms(now);
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut batch = Vec::with_capacity(chunk.len());
        for (id, r, dispatch) in chunk {
            let (status, worker) = match dispatch {
                Dispatch::Claimed(worker) => (RunStatus::Running, Some(*worker)),
                _ => (r.status, None),
            };
            // The pools it takes, keyed over its input as it is queued: a run that ends as it
            // is made takes none.
            let pools = if status.is_final() {
                Vec::new()
            } else {
                r.snapshot.as_ref().map(|s| limits::pools_of(&s.limits, r.input.as_ref())).unwrap_or_default()
            };
            // Due and left to the hand-over, it waits in line at once (see `NewRun::in_line`);
            // taking no limit, it is in the queue at once where the queue is the runs' rows.
            let in_line =
                r.in_line && status == RunStatus::Queued && matches!(dispatch, Dispatch::No) && r.due_at.timestamp_millis() <= now;
            let line = pools.first().filter(|_| in_line).map(limits::Pool::encode);
            let since = line.as_ref().map(|_| now);
            let queued = in_line && pools.is_empty() && D::QUEUED_BY_INSERT;
            batch.push(vec![
                id.as_str().into(),
                r.owner.to_string().into(),
                r.trigger.as_str().into(),
                status.as_str().into(),
                r.scheduled_at.map(ms).into(),
                ms(r.due_at).into(),
                now.into(),
                (queued || !matches!(dispatch, Dispatch::No)).then_some(now).into(),
                i64::from(r.attempt).into(),
                r.input.as_ref().map(|v| v.to_string()).into(),
                r.parameters.as_ref().map(|v| v.to_string()).into(),
                r.error.as_deref().into(),
                r.idempotency_key.as_deref().into(),
                r.retry_of.as_deref().into(),
                status.is_final().then_some(now).into(),
                // NULL means "its own root" (reads coalesce): a first attempt stores no copy of its id.
                r.root_id.as_deref().filter(|root| *root != id.as_str()).into(),
                r.snapshot.as_ref().and_then(|s| serde_json::to_string(s).ok()).into(),
                worker.into(),
                worker.map(|_| now).into(),
                r.requested_by.as_deref().into(),
                worker.and(epoch).into(),
                // A run that ends as it is made (a skipped tick) has nothing to notice: no event,
                // no streak moved; marked so that retention can prune it at once.
                status.is_final().then_some(1i64).into(),
                limits::stored(&pools).into(),
                line.into(),
                since.into(),
            ]);
        }
        let q = insert_rows(&D::SPELLING, "ll_runs", &RUN_INSERT, batch, "", "inserting runs");
        D::execute(c, q).await?;
    }
    Ok(())
}

/// Closes the steps still open (running or waiting) of runs that ended without succeeding
/// ([`super::steps_closed_by`]). `ends`: (run id, run status).
pub(super) async fn close_steps<D: Dialect>(c: &mut D::Conn, ends: &[(&str, RunStatus)], now: DateTime<Utc>) -> Result<(), StoreError> {
    let (ids, statuses): (Vec<_>, Vec<_>) =
        ends.iter().filter_map(|(id, s)| super::steps_closed_by(*s).map(|step| (Some((*id).into()), Some(step.as_str().into())))).unzip();
    if ids.is_empty() {
        return Ok(());
    }
    let q = Stmt::new(
        sql!(
            D,
            "UPDATE ll_steps SET status = j.status, finished_at = coalesce((SELECT r.finished_at FROM ll_runs r WHERE r.id = j.id), $2)
                 FROM {rows $1 AS j(id text, status text)}
                 WHERE ll_steps.run_id = j.id AND ll_steps.status IN ({step:Running}, {step:WaitingApproval})"
        ),
        "closing the steps of ended runs",
    );
    D::execute(c, q.bind_rows(vec![Column::Texts(ids), Column::Texts(statuses)]).bind(ms(now))).await?;
    Ok(())
}

/// Run `h` holds the slots it has (as rows of `ll_run_limits`, or its own `limit_hold`): it is
/// running, or queued and handed over. Spelled as PostgreSQL's `ll_runs_limit_holds` index's
/// predicate, so that a probe of a pool's holders by `limit_hold` reads that index.
pub(super) const HOLDING: &str = "(h.status = {Running} OR (h.status = {Queued} AND h.dispatched_at IS NOT NULL))";

/// The end of runs still `running` and held by their worker ([`RunEnd`]s bound at `$1` as
/// [`end_rows`], the time at `$2`): a cancel asked for meanwhile turns an end that is not
/// a success into `cancelled` (`{cancel_wins}`, [`crate::decide::end_with_cancel`]); `{held}`
/// refuses the end of an attempt whose lease or epoch is gone (the fence). A success whose
/// end is its outcome's notice ([`RunEnd::noticed`]) is marked noticed in the same row version;
/// its job is [`noticed_at_end`]'s to move, in the same transaction. Without its `RETURNING`:
/// the backends' one-statement writes of ends and claims build on it.
pub(super) const FINISH_RUNS: &str = concat!(
    "UPDATE ll_runs SET status = CASE WHEN {cancel_wins} THEN {Cancelled} ELSE j.status END,
        output = j.output,
        error = CASE WHEN {cancel_wins} THEN ll_runs.cancel_requested ELSE j.error END,
        finished_at = CASE WHEN j.finished OR {cancel_wins} THEN coalesce(j.ended_at, $2) END,
        wait_until = CASE WHEN {cancel_wins} THEN NULL ELSE j.wait_until END,
        started_at = coalesce(j.started_at, ll_runs.started_at),
        trace_id = coalesce(j.trace_id, ll_runs.trace_id),
        next_run_id = CASE WHEN j.last THEN coalesce(ll_runs.next_run_id, '') ELSE ll_runs.next_run_id END,
        limits = CASE WHEN {cancel_wins} THEN ll_runs.limits ELSE coalesce(j.limits, ll_runs.limits) END,
        dispatched_at = CASE WHEN j.status = {Queued} AND NOT {cancel_wins} THEN NULL ELSE ll_runs.dispatched_at END,
        outcome_seen = CASE WHEN j.noticed AND j.status = {Succeeded} THEN 1 ELSE ll_runs.outcome_seen END
    FROM {rows $1 AS j(",
    end_cols!(),
    ")}
    WHERE ll_runs.id = j.id AND {by_id}ll_runs.status = {Running} AND {held}"
);

/// The columns of the ends' row set ([`end_rows`]), as `{rows $n AS j(…)}` names them.
macro_rules! end_cols {
    () => {
        "id text, started_at bigint, ended_at bigint, status text, output text, error text, finished bool, wait_until bigint, trace_id text, last bool, limits text, noticed bool"
    };
}
pub(super) use end_cols;

/// The ends as [`FINISH_RUNS`]' row set reads them, a column each of its columns.
pub(super) fn end_rows<'a>(ends: &[RunEnd<'a>]) -> Vec<Column<'a>> {
    vec![
        Column::Texts(ends.iter().map(|e| Some(e.id.into())).collect()),
        Column::Ints(ends.iter().map(|e| e.started_at.map(ms)).collect()),
        Column::Ints(ends.iter().map(|e| e.ended_at.map(ms)).collect()),
        Column::Texts(ends.iter().map(|e| Some(e.status.as_str().into())).collect()),
        Column::Texts(ends.iter().map(|e| e.output.map(|o| o.to_string().into())).collect()),
        Column::Texts(ends.iter().map(|e| e.error.map(Into::into)).collect()),
        Column::Bools(ends.iter().map(|e| e.status.is_final()).collect()),
        Column::Ints(ends.iter().map(|e| e.wait_until.map(ms)).collect()),
        Column::Texts(ends.iter().map(|e| e.trace_id.map(Into::into)).collect()),
        Column::Bools(ends.iter().map(|e| e.last).collect()),
        Column::Texts(ends.iter().map(|e| e.limits.map(Into::into)).collect()),
        Column::Bools(ends.iter().map(|e| e.noticed).collect()),
    ]
}

/// What noticing a success does to its job (as [`super::Notices::notice`] does it: the failure
/// streak ends, the last success moves forward, never back), written to the worker's own row
/// of the job's successes (`ll_job_successes`), which the pass and the jobs' health fold into
/// the job's state: an end never writes a row another worker's end writes. For the runs
/// `{src}` names (a query of `job, worker, at` rows: each pair once, in that order, with when
/// its last success among them ended).
pub(super) fn noticed_at_end(src: &str) -> String {
    format!(
        "INSERT INTO ll_job_successes (job, worker, at) {src}
         ON CONFLICT (job, worker) DO UPDATE SET at = {{greatest}}(ll_job_successes.at, excluded.at)"
    )
}

/// The runs of `done` (run id, status recorded) that ended as successes noticed at their end.
pub(super) fn noticed_of<'a>(ends: &[RunEnd<'_>], done: &'a [(String, RunStatus)]) -> Vec<&'a str> {
    let noticed: std::collections::HashSet<&str> = ends.iter().filter(|e| e.noticed).map(|e| e.id).collect();
    if noticed.is_empty() {
        return Vec::new();
    }
    done.iter().filter(|(id, s)| *s == RunStatus::Succeeded && noticed.contains(id.as_str())).map(|(id, _)| id.as_str()).collect()
}

/// [`noticed_at_end`] for the runs of `ids` that [`FINISH_RUNS`] ended as noticed successes,
/// in the transaction that ended them.
pub(super) async fn notice_successes<D: Dialect>(c: &mut D::Conn, ids: &[&str]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let q = Stmt::new(
        sql!(
            D,
            noticed_at_end(
                "SELECT job, worker, MAX(finished_at) FROM ll_runs WHERE id {in $1} AND status = {Succeeded} AND outcome_seen IS NOT NULL GROUP BY job, worker ORDER BY job, worker"
            )
        ),
        "recording the successes noticed at their end",
    );
    D::execute(c, q.bind_list(ids.iter().copied())).await?;
    Ok(())
}

/// Records the ends of runs still `running` ([`FINISH_RUNS`]); returns each run it ended with
/// the status it took: the one asked for, or `cancelled` when a cancel was asked for meanwhile
/// and the run had not succeeded.
pub(super) async fn finish_runs<D: Dialect>(
    c: &mut D::Conn,
    ends: &[RunEnd<'_>],
    now: i64,
) -> Result<Vec<(String, RunStatus)>, StoreError> {
    let q = Stmt::new(sql!(D, format!("{FINISH_RUNS} RETURNING ll_runs.id, ll_runs.status")), "finishing runs");
    let rows = D::fetch_all(c, q.bind_rows(end_rows(ends)).bind(now)).await?;
    Ok(rows.iter().map(|r| (r.text("id"), RunStatus::from_str(r.str("status")).unwrap_or(RunStatus::Failed))).collect())
}

/// The claim, as text for the dialect spelled `s`: the runs among those `which` selects (a
/// condition on `id`) that are still queued become `worker`'s, started at `now` unless a start
/// is recorded (a resumed run keeps its first), dispatched, under `epoch` (each an
/// expression); rows: `job_snapshot`, `resumed` and [`run_cols`]. A run no longer queued
/// (cancelled, or already taken) is left out: the guard that makes a run execute at most
/// once. A run that waited for a limit's slot stops waiting with its claim (admitted, it has
/// one), in the same row version. A run not handed over before holds the pool `hold` in its
/// row (`limit_hold`; `NULL`: none, its slots are rows), one handed over keeps what it held.
/// How the runs are picked and locked is the dialect's ([`Spelling::claim_pick`]).
pub(super) fn claim_sql(s: &super::dialect::Spelling, which: &str, skip: bool, worker: &str, now: &str, epoch: &str, hold: &str) -> String {
    let (before, from, picked) = (s.claim_pick)(which, skip);
    format!("{before} {}", claim_update(&from, &picked, worker, now, epoch, hold))
}

/// [`claim_sql`]'s update alone, of the runs `picked` selects (a condition on `ll_runs`, over
/// the rows `from` names, if any), for a caller that picked and locked them itself.
pub(super) fn claim_update(from: &str, picked: &str, worker: &str, now: &str, epoch: &str, hold: &str) -> String {
    format!(
        "UPDATE ll_runs SET status = {{Running}}, started_at = coalesce(started_at, {now}), worker = {worker},
             dispatched_at = coalesce(dispatched_at, {now}), epoch = {epoch}, limit_wait = NULL, limit_wait_since = NULL,
             limit_hold = CASE WHEN ll_runs.dispatched_at IS NULL THEN {hold} ELSE ll_runs.limit_hold END
         {from} WHERE {picked}
         RETURNING job_snapshot, started_at < {now} AS resumed, {cols}",
        cols = run_cols!()
    )
}

/// Claims the runs of `ids` still queued for `worker`, under its lease's `epoch` (the caller
/// read it live in this transaction). `locked`: what to do with runs another transaction holds.
pub(super) async fn claim<D: Dialect>(
    c: &mut D::Conn,
    ids: &[String],
    worker: &str,
    epoch: i64,
    now: DateTime<Utc>,
    locked: Locked,
) -> Result<Vec<Handed>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = match locked {
        Locked::Skip => sql!(D, claim_sql(&D::SPELLING, "id {in $1}", true, "$2", "$3", "$4", "NULL")),
        Locked::Wait => sql!(D, claim_sql(&D::SPELLING, "id {in $1}", false, "$2", "$3", "$4", "NULL")),
    };
    let q = Stmt::new(sql, "claiming runs").bind_list(ids.iter().map(String::as_str)).bind(worker).bind(ms(now)).bind(epoch);
    Ok(D::fetch_all(c, q).await?.iter().map(handed_from_row).collect())
}

/// Takes up to `n` tasks and claims their runs for `worker`, in the caller's transaction.
/// Taking a task consumes it: a worker without a live lease (whose claims would take nothing)
/// leaves the queue alone.
pub(super) async fn take_and_claim<D: RunSql + QueueSql>(
    c: &mut D::Conn,
    n: usize,
    worker: &str,
    now: DateTime<Utc>,
) -> Result<Taken, StoreError> {
    let Some(epoch) = live_epoch::<D>(c, worker).await? else {
        return Ok(Taken::default());
    };
    let (tasks, ids) = D::take(c, n).await?;
    let runs = claim::<D>(c, &ids, worker, epoch, now, Locked::Wait).await?;
    Ok(Taken { tasks, runs, ..Taken::default() })
}

/// The ids of `done` (run id, status recorded) whose end was recorded as `ends` asked (not
/// cancelled instead).
pub(super) fn recorded_as_asked(ends: &[RunEnd<'_>], done: &[(String, RunStatus)]) -> Vec<String> {
    let asked: HashMap<&str, RunStatus> = ends.iter().map(|e| (e.id, e.status)).collect();
    done.iter().filter(|(id, s)| asked.get(id.as_str()) == Some(s)).map(|(id, _)| id.clone()).collect()
}

/// The epoch of `worker`'s lease, if it is live.
pub(super) async fn live_epoch<D: Dialect>(c: &mut D::Conn, worker: &str) -> Result<Option<i64>, StoreError> {
    let q = Stmt::new(sql!(D, "SELECT epoch FROM ll_workers w WHERE w.name = $1 {lease_live}"), "reading the worker's lease");
    Ok(D::fetch_optional(c, q.bind(worker)).await?.map(|r| r.int("epoch")))
}

/// The fence of a run's own writes (its steps, calls and checkpoints), in the transaction that
/// makes them: the run is running and its worker holds a live lease of the epoch it was claimed
/// under. The run's row is locked (PostgreSQL): a takeover that would interrupt it waits for
/// this write to commit, or this write finds the run gone.
pub(super) async fn fence<D: Dialect>(c: &mut D::Conn, run: &str) -> Result<(), StoreError> {
    let q = Stmt::new(
        sql!(D, "SELECT 1 AS held FROM ll_runs WHERE id = $1 AND status = {Running} AND {held} {lock}"),
        "checking that the run is still this worker's",
    );
    match D::fetch_optional(c, q.bind(run)).await? {
        Some(_) => Ok(()),
        None => Err(StoreError::fenced(run)),
    }
}

/// Writes `q` for run `run`, in one transaction behind its [`fence`].
pub(super) async fn write_fenced<D: Dialect>(store: &D, run: &str, q: Stmt<'_>) -> Result<(), StoreError> {
    let mut tx = store.begin().await?;
    fence::<D>(&mut tx, run).await?;
    D::execute(&mut tx, q).await?;
    D::commit(tx).await
}

/// The reads the scheduler makes on every pass, for the SQLite backend's plan tests.
#[cfg(test)]
pub(crate) fn scheduler_reads<D: Dialect>() -> [&'static str; 2] {
    [due_undispatched_sql::<D>(), next_due_sql::<D>()]
}

/// A notification (`ll_notifications n`) whose turn it is. A job's notifications go out in
/// the order they were recorded, across workers:
/// - to one target, one at a time: none before it is unsent (a failure, retried or not, reaches
///   its receiver before the recovery that follows it);
/// - to other targets, none before it is in flight or not yet tried (a failure sent to one
///   webhook goes before the recovery sent to another); one whose send failed and waits for
///   its retry holds back only its own target's line.
pub(super) const FIRST_IN_LINE: &str =
    "NOT EXISTS (SELECT 1 FROM ll_notifications e WHERE e.job = n.job AND e.status IN ('pending', 'sending')
                             AND e.{notification_seq} < n.{notification_seq}
                             AND (e.target_id = n.target_id OR e.status = 'sending' OR e.attempts = 0))";

pub(super) fn due_undispatched_sql<D: Dialect>() -> &'static str {
    sql!(
        D,
        "SELECT id, job, trigger, limits, due_at, enqueued_at FROM ll_runs {undispatched}
         WHERE status = {Queued} AND dispatched_at IS NULL AND limit_wait IS NULL AND due_at <= $1
         ORDER BY due_at, enqueued_at, id LIMIT $2"
    )
}

pub(super) fn next_due_sql<D: Dialect>() -> &'static str {
    sql!(
        D,
        "SELECT min(t) AS t FROM (SELECT min(due_at) AS t FROM ll_runs {undispatched}
                                  WHERE status = {Queued} AND dispatched_at IS NULL AND limit_wait IS NULL
                                  UNION ALL SELECT min(wait_until) FROM ll_runs WHERE status = {WaitingApproval}) AS due"
    )
}

/// A tick's read of the active runs of the jobs it fires (`$1`), oldest first, a backfill's
/// runs only when `$3` (`$2` is the backfill trigger). On PostgreSQL the active runs are
/// indexed by job (`0019`): the read costs their number, not the jobs' kept history.
pub(super) fn active_runs_sql<D: Dialect>() -> &'static str {
    sql!(
        D,
        format!(
            "SELECT job, id FROM ll_runs WHERE job {{in $1}} AND status IN {} AND (trigger != $2 OR $3) ORDER BY enqueued_at, id",
            *super::ACTIVE
        )
    )
}

/// The notifications of runs waiting for a decision: one per wait and rule, recorded once
/// (the wait's key), read each pass (waiting runs are few).
pub(super) async fn waiting_notifications<D: Dialect>(c: &mut D::Conn, rules: RulesOf<'_>) -> Result<Vec<NewNotification>, StoreError> {
    let q = Stmt::new(
        sql!(D, "SELECT run_id, step FROM ll_steps WHERE status = {step:WaitingApproval}"),
        "reading the steps waiting for a decision",
    );
    let waits: Vec<(String, String)> = D::fetch_all(c, q).await?.iter().map(|r| (r.text("run_id"), r.text("step"))).collect();
    if waits.is_empty() {
        return Ok(Vec::new());
    }
    let q = Stmt::new(
        sql!(D, concat!("SELECT ", run_cols!(), " FROM ll_runs WHERE id {in $1} AND status = {WaitingApproval}")),
        "reading the runs that wait",
    );
    let runs: HashMap<String, Run> = D::fetch_all(c, q.bind_list(waits.iter().map(|(id, _)| id.as_str())))
        .await?
        .iter()
        .map(|r| (r.text("id"), run_from_row(r)))
        .collect();
    let mut out = Vec::new();
    let mut of_job: HashMap<String, Option<Vec<lamplighter_config::NotifyRule>>> = HashMap::new();
    for (id, step) in &waits {
        let Some(run) = runs.get(id) else { continue };
        let job = run.owner.to_string();
        let Some(rules) = of_job.entry(job.clone()).or_insert_with(|| rules(&job)) else { continue };
        for (i, on) in notify_on_wait(step, rules) {
            out.push(notification(run, on, Some(step), i, &rules[i].to, 0));
        }
    }
    Ok(out)
}

/// Records `n`, due at once; nothing when its key (its event's) is recorded already. Returns
/// the rows written (0 or 1).
pub(crate) async fn record_notification<D: Dialect>(tx: &mut D::Conn, n: &NewNotification, now: DateTime<Utc>) -> Result<u64, StoreError> {
    let q = Stmt::new(
        sql!(
            D,
            "INSERT INTO ll_notifications (key, job, run_id, root_id, event, target, target_id, payload, status, attempts, next_at, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, $9, $9) ON CONFLICT (key) DO NOTHING"
        ),
        "recording a notification",
    );
    D::execute(
        tx,
        q.bind(n.key.as_str())
            .bind(n.job.as_str())
            .bind(n.run_id.as_str())
            .bind(n.root_id.as_str())
            .bind(n.event.as_str())
            .bind(n.target.as_str())
            .bind(n.target_id.as_str())
            .bind(n.payload.to_string())
            .bind(ms(now)),
    )
    .await
}

/// The notification rule `rule` (to `to`) records for `run`'s event.
pub(super) fn notification(
    run: &Run,
    on: lamplighter_config::NotifyOn,
    step: Option<&str>,
    rule: usize,
    to: &lamplighter_config::NotifyTarget,
    streak: u32,
) -> NewNotification {
    let key = notify::key(&run.root_id, on, step, rule);
    NewNotification {
        payload: notify::payload(on, &key, run, streak, step),
        key,
        job: run.owner.to_string(),
        run_id: run.id.clone(),
        root_id: run.root_id.clone(),
        event: on,
        target: to.describe(),
        target_id: notify::target_id(to),
    }
}

//! Handing due runs over: what is due, claimed here or queued, and waits whose time ran out brought back.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use std::collections::{HashMap, HashSet};

use super::dialect::{Column, Dialect, Locked, QueueSql, Record, RunSql, Stmt, sql};
use super::scripts::*;
use super::{ACTIVE, DUE_BATCH, Handed, StoreError, from_ms, ms};
use crate::limits::{self, Pool, Sizes};
use crate::run::Trigger;

/// A queued run that is due and not handed over, as the hand-over reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Due {
    pub(crate) id: String,
    pub(crate) job: String,
    pub(crate) trigger: Trigger,
    /// The slot pools it takes (none: it is not held back by any limit).
    pub(crate) pools: Vec<Pool>,
    /// Its place in line: (due, enqueued) instants in ms.
    place: (i64, i64),
}

fn due_from_row(r: &impl Record) -> Due {
    Due {
        id: r.text("id"),
        job: r.text("job"),
        trigger: r.str("trigger").parse().unwrap_or(Trigger::Api),
        pools: limits::from_stored(r.opt_text("limits").as_deref()),
        place: (r.int("due_at"), r.int("enqueued_at")),
    }
}

/// The runs one hand-over admits to their limits, or finds waiting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitPass<'a> {
    /// Due runs that take slots, first in line first.
    pub(crate) due: &'a [Due],
    /// `scheduling.limits` in force.
    pub(crate) sizes: &'a Sizes,
    /// Whether to look for runs already waiting on any pool (on every pass that may free or
    /// add a slot).
    pub(crate) waiters: bool,
    /// Pools whose waiting runs to look at (those whose slots ends just freed).
    pub(crate) freed: &'a [Pool],
    /// Of the caller's free slots, how many are left for admitted runs to be claimed into.
    pub(crate) spare: usize,
}

/// What a hand-over did.
#[derive(Debug, Default)]
pub(crate) struct Dispatched {
    /// The runs claimed into the caller's slots.
    pub(crate) claimed: Vec<Handed>,
    /// Runs given a queue task.
    pub(crate) pushed: usize,
    /// Runs it left waiting for a slot, of those it read (of a full pool's line, only its
    /// head): none when nothing waits.
    pub(crate) waiting: usize,
    /// Runs that waited for a slot and got one: the limits they waited on, and how long.
    pub(crate) waited: Vec<(String, std::time::Duration)>,
    /// A limit a reload removed still has runs waiting beyond those one pass reads
    /// ([`WAITERS_PER_POOL`]), or a pool of that many slots or more admitted every run read of
    /// its line: the next pass must look again at once, whatever limits are configured.
    pub(crate) unserved: bool,
}

#[async_trait]
pub(crate) trait Handover: Send + Sync + std::fmt::Debug {
    /// Queued runs that are due and not handed over yet (id, job), oldest first, at most
    /// [`DUE_BATCH`].
    async fn due_undispatched(&self, now: DateTime<Utc>) -> Result<Vec<Due>, StoreError>;
    /// The earliest due instant of a queued run not handed over, or of a waiting run's
    /// `wait_until`.
    async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// True when the job has a run handed over and not finished, or waiting for a limit's
    /// slot (for `overlap: queue`: the next waits behind it).
    async fn has_dispatched_active(&self, job: &str) -> Result<bool, StoreError>;
    /// Hands due queued runs over in one transaction: `handed` are claimed for `worker` (the
    /// caller holds a slot for each) and returned, those another caller took meanwhile left
    /// out; `queued` get a queue task. The runs of `limits` (and those waiting, if asked) are
    /// admitted to their limits first come first served under a lock per pool: those admitted
    /// are claimed into the spare slots or queued, the others wait.
    async fn hand_over(
        &self,
        handed: &[String],
        queued: &[String],
        limits: LimitPass<'_>,
        worker: &str,
        now: DateTime<Utc>,
    ) -> Result<Dispatched, StoreError>;
    /// [`Handover::hand_over`] of runs that take no limit: the runs claimed.
    #[cfg(test)]
    async fn dispatch(&self, handed: &[String], queued: &[String], worker: &str, now: DateTime<Utc>) -> Result<Vec<Handed>, StoreError> {
        let none = LimitPass { due: &[], sizes: &Sizes::new(), waiters: false, freed: &[], spare: 0 };
        Ok(self.hand_over(handed, queued, none, worker, now).await?.claimed)
    }

    /// Waiting runs whose wait ended (`wait_until` passed) are queued again; returns them.
    async fn wake_waiting(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError>;
}

#[async_trait]
impl<D: RunSql + QueueSql> Handover for D {
    async fn due_undispatched(&self, now: DateTime<Utc>) -> Result<Vec<Due>, StoreError> {
        let q = Stmt::new(due_undispatched_sql::<D>(), "reading due runs").bind(ms(now)).bind(DUE_BATCH as i64);
        Ok(D::fetch_all(&mut *self.reader().await?, q).await?.iter().map(due_from_row).collect())
    }

    async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = D::fetch_optional(&mut *self.reader().await?, Stmt::new(next_due_sql::<D>(), "reading the next due run")).await?;
        Ok(row.and_then(|r| r.opt_int("t")).map(from_ms))
    }

    async fn has_dispatched_active(&self, job: &str) -> Result<bool, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "SELECT EXISTS (SELECT 1 FROM ll_runs WHERE job = $1 AND status IN {}
                     AND (status != {{Queued}} OR dispatched_at IS NOT NULL OR limit_wait IS NOT NULL)) AS found",
                    *ACTIVE
                )
            ),
            "reading active runs",
        );
        Ok(D::fetch_optional(&mut *self.reader().await?, q.bind(job)).await?.is_some_and(|r| r.flag("found")))
    }

    /// Several schedulers may hand the same due runs over at once: rows another one holds are
    /// skipped (it is handing them over), the rest taken.
    async fn hand_over(
        &self,
        handed: &[String],
        queued: &[String],
        limits: LimitPass<'_>,
        worker: &str,
        now: DateTime<Utc>,
    ) -> Result<Dispatched, StoreError> {
        let mut tx = self.begin().await?;
        let out = hand_over_in::<D>(&mut tx, handed, queued, limits, worker, now).await?;
        D::commit(tx).await?;
        Ok(out)
    }

    async fn wake_waiting(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        let q = Stmt::new(
            sql!(
                D,
                "UPDATE ll_runs SET status = {Queued}, dispatched_at = NULL, wait_until = NULL
                 WHERE status = {WaitingApproval} AND wait_until <= $1 RETURNING id"
            ),
            "resuming runs whose wait is over",
        );
        Ok(D::fetch_all(&mut *self.writer().await?, q.bind(ms(now))).await?.iter().map(|r| r.text("id")).collect())
    }
}

/// [`Handover::hand_over`] in the caller's transaction (the recorder's, with the ends that
/// freed the slots).
pub(super) async fn hand_over_in<D: RunSql + QueueSql>(
    tx: &mut D::Conn,
    handed: &[String],
    queued: &[String],
    limits: LimitPass<'_>,
    worker: &str,
    now: DateTime<Utc>,
) -> Result<Dispatched, StoreError> {
    let mut out = Dispatched::default();
    let (mut handed, mut queued) = (handed.to_vec(), queued.to_vec());
    if !limits.due.is_empty() || limits.waiters || !limits.freed.is_empty() {
        let admitted = admit::<D>(tx, limits, now).await?;
        let spare = limits.spare.min(admitted.ids.len());
        handed.extend_from_slice(&admitted.ids[..spare]);
        queued.extend_from_slice(&admitted.ids[spare..]);
        out.waiting = admitted.waiting;
        out.waited = admitted.waited;
        out.unserved = admitted.unserved;
    }
    // Without a live lease nothing is claimed: the runs stay due or in line, for a worker that
    // has one; those in line are told as waiting, so that the lines are looked at again.
    let epoch = if handed.is_empty() { None } else { live_epoch::<D>(tx, worker).await? };
    out.claimed = match epoch {
        Some(epoch) => claim::<D>(tx, &handed, worker, epoch, now, Locked::Skip).await?,
        None => {
            out.waiting += handed.len();
            Vec::new()
        }
    };
    let to_push = if queued.is_empty() { Vec::new() } else { D::mark_dispatched(tx, &queued, ms(now)).await? };
    D::push(tx, &to_push).await?;
    out.pushed = to_push.len();
    Ok(out)
}

/// What [`hand_off`] did.
#[derive(Debug, Default)]
pub(super) struct HandedOff {
    /// The runs given the slots, first in line first.
    pub(super) ids: Vec<String>,
    /// The pools whose line it could not serve (its head takes other limits too, or a reload
    /// removed the limit): the admission under the pools' locks looks at them.
    pub(super) left: Vec<Pool>,
    /// The limits the runs waited on, and how long.
    pub(super) waited: Vec<(String, std::time::Duration)>,
}

/// The slots of runs whose ends the caller's transaction just recorded (`ended`), handed
/// straight on to the heads of their pools' lines, without the pools' locks: a slot's row is
/// deleted with its holder's end and one is inserted for the head that takes it, so no
/// hand-off ever adds a holder to a pool, and an admission counting the pool meanwhile counts
/// the slot once, held by the run that ended or by the one that took it. A head is taken
/// only while its pool is within its size (a lowered limit shrinks: the count after the
/// ends' rows are gone, the slots others hold) and only if that pool is all it takes; a head
/// locked by another transaction (being admitted elsewhere: [`admit`] locks the runs it admits
/// before it writes their slots) is passed over. The first head that takes other limits too stops the pool's hand-off: the pool is
/// `left` to [`admit`], which counts every pool such a run takes.
pub(super) async fn hand_off<D: RunSql>(
    tx: &mut D::Conn,
    ended: &[&str],
    sizes: &Sizes,
    now: DateTime<Utc>,
) -> Result<HandedOff, StoreError> {
    let mut out = HandedOff::default();
    if ended.is_empty() {
        return Ok(out);
    }
    // The slots the ends freed are their rows: a run's own `limit_hold` is written only by
    // PostgreSQL's one-statement hand-off (`RunSql::ends_and_hand_offs_at_once`), which this
    // backend-neutral one stands in for where a backend has none.
    let q =
        Stmt::new(sql!(D, "DELETE FROM ll_run_limits WHERE run_id {in $1} RETURNING name, key"), "freeing the slots of runs that ended");
    let mut freed: std::collections::BTreeMap<Pool, usize> = std::collections::BTreeMap::new();
    for r in D::fetch_all(tx, q.bind_list(ended.iter().copied())).await? {
        *freed.entry(Pool { name: r.text("name"), key: r.text("key") }).or_default() += 1;
    }
    let mut taken: Vec<(Due, i64, &Pool)> = Vec::new();
    for (pool, &slots) in &freed {
        let Some(&size) = sizes.get(&pool.name) else {
            out.left.push(pool.clone());
            continue;
        };
        let q = Stmt::new(
            sql!(
                D,
                format!(
                    "SELECT id, job, trigger, limits, due_at, enqueued_at, limit_wait_since,
                            (SELECT count(*) FROM (
                                 SELECT l.run_id FROM ll_run_limits l JOIN ll_runs h ON h.id = l.run_id WHERE l.name = $3 AND l.key = $4 AND {HOLDING}
                                 UNION
                                 SELECT h.id FROM ll_runs h WHERE h.limit_hold = $1 AND {HOLDING}) x) AS held
                     FROM ll_runs {{limit_waits}}
                     WHERE limit_wait = $1 AND limit_wait IS NOT NULL AND status = {{Queued}} AND dispatched_at IS NULL
                     ORDER BY due_at, enqueued_at, id LIMIT $2 {{lock_skip}}"
                )
            ),
            "reading the heads of a limit's line",
        )
        .bind(pool.encode())
        .bind(slots as i64)
        .bind(pool.name.as_str())
        .bind(pool.key.as_str());
        let mut room = usize::try_from(size).unwrap_or(usize::MAX);
        for (i, r) in D::fetch_all(tx, q).await?.iter().enumerate() {
            if i == 0 {
                room = room.saturating_sub(r.int("held").max(0) as usize);
            }
            let head = due_from_row(r);
            if head.pools != std::slice::from_ref(pool) {
                out.left.push(pool.clone());
                break;
            }
            if room == 0 {
                break;
            }
            room -= 1;
            taken.push((head, r.opt_int("limit_wait_since").unwrap_or(ms(now)), pool));
        }
    }
    taken.sort_by(|(a, ..), (b, ..)| (a.place, &a.id).cmp(&(b.place, &b.id)));
    let slots: Vec<(&str, &Pool)> = taken.iter().map(|(due, _, pool)| (due.id.as_str(), *pool)).collect();
    take_slots::<D>(tx, &slots).await?;
    for (due, since, pool) in taken {
        out.waited.push((pool.name.clone(), waited_since(since, now)));
        out.ids.push(due.id);
    }
    Ok(out)
}

/// A slot row for each (run, pool): the runs admitted, or handed slots on.
async fn take_slots<D: RunSql>(tx: &mut D::Conn, slots: &[(&str, &Pool)]) -> Result<(), StoreError> {
    if slots.is_empty() {
        return Ok(());
    }
    let runs = slots.iter().map(|(run, _)| Some((*run).into())).collect();
    let names = slots.iter().map(|(_, pool)| Some(pool.name.as_str().into())).collect();
    let keys = slots.iter().map(|(_, pool)| Some(pool.key.as_str().into())).collect();
    let q = Stmt::new(
        sql!(
            D,
            "INSERT INTO ll_run_limits (run_id, name, key) SELECT j.run_id, j.name, j.key FROM {rows $1 AS j(run_id text, name text, key text)} WHERE true ON CONFLICT DO NOTHING"
        ),
        "taking slots",
    );
    D::execute(tx, q.bind_rows(vec![Column::Texts(runs), Column::Texts(names), Column::Texts(keys)])).await?;
    Ok(())
}

/// How long a run waited for a slot, from `since` (ms) to `now`.
pub(super) fn waited_since(since: i64, now: DateTime<Utc>) -> std::time::Duration {
    std::time::Duration::from_millis((ms(now) - since).max(0) as u64)
}

/// Runs admitted to their limits, and what waits.
struct Admitted {
    /// First in line first.
    ids: Vec<String>,
    waiting: usize,
    waited: Vec<(String, std::time::Duration)>,
    unserved: bool,
}

/// Runs waiting for a pool read in one pass, at most: the pool's free slots and one more (the
/// head of a full pool's line, which holds back the runs behind it in its other pools).
const WAITERS_PER_POOL: usize = 1000;

/// The reads of the runs waiting for a limit, each through the waiters' partial index: the
/// distinct pools they wait on (one probe of the index each, a loose index scan: a DISTINCT
/// read every waiter, each pass of a long line), and one pool's line, first in line first.
pub(super) fn limit_wait_reads<D: Dialect>() -> [&'static str; 2] {
    [
        sql!(
            D,
            "WITH RECURSIVE w(p) AS (
                 SELECT (SELECT limit_wait FROM ll_runs {limit_waits} WHERE status = {Queued} AND dispatched_at IS NULL AND limit_wait IS NOT NULL
                         ORDER BY limit_wait LIMIT 1)
                 UNION ALL
                 SELECT (SELECT limit_wait FROM ll_runs {limit_waits} WHERE status = {Queued} AND dispatched_at IS NULL AND limit_wait IS NOT NULL
                                                             AND limit_wait > w.p ORDER BY limit_wait LIMIT 1)
                 FROM w WHERE w.p IS NOT NULL)
             SELECT p AS limit_wait FROM w WHERE p IS NOT NULL"
        ),
        sql!(
            D,
            "SELECT id, job, trigger, limits, due_at, enqueued_at, limit_wait_since FROM ll_runs {limit_waits}
             WHERE limit_wait = $1 AND limit_wait IS NOT NULL AND status = {Queued} AND dispatched_at IS NULL
             ORDER BY due_at, enqueued_at, id LIMIT $2"
        ),
    ]
}

/// Admits the due runs of `pass` and those waiting to their pools, in the caller's
/// transaction: each pool is locked (PostgreSQL: an advisory lock per pool, in order; SQLite:
/// its one writer), its holders are counted in a statement of their own after the lock (a
/// statement's snapshot is taken when it starts: one counting in the same statement as the lock
/// could miss an admission committed while it waited), stale slots deleted, and the line
/// decided by [`limits::admit`]. The admitted get a slot row each (and leave the waiters with
/// their claim or their hand-over to the queue, in the caller's next write); the others are
/// marked waiting on the pool they wait on first.
async fn admit<D: RunSql>(tx: &mut D::Conn, pass: LimitPass<'_>, now: DateTime<Utc>) -> Result<Admitted, StoreError> {
    let mut pools: Vec<Pool> = pass.due.iter().flat_map(|d| d.pools.iter().cloned()).collect();
    let mut waits_on: Vec<Pool> = pass.freed.to_vec();
    if pass.waiters {
        let q = Stmt::new(limit_wait_reads::<D>()[0], "reading the limits runs wait for");
        waits_on.extend(D::fetch_all(tx, q).await?.iter().map(|r| Pool::decode(r.str("limit_wait"))));
    }
    // A due run's pools' lines too: a run already waiting there is ahead of it.
    waits_on.extend(pools.iter().cloned());
    waits_on.sort();
    waits_on.dedup();
    pools.extend(waits_on.iter().cloned());
    pools.sort();
    pools.dedup();
    if pools.is_empty() {
        return Ok(Admitted { ids: Vec::new(), waiting: 0, waited: Vec::new(), unserved: false });
    }
    // The line, read before the locks (a run in it that another admission took meanwhile is
    // a holder by the count after them, and leaves it): the runs waiting on each pool that the
    // due runs take or that waiters wait on (as many as its slots, and one more: the head of a
    // full line), and the due runs. Every pool a run of the line takes is locked and counted,
    // not only the one it waits on.
    // Each with, for a run read from a pool's line, since when it waits and on which pool.
    let mut line: Vec<(Due, Option<(i64, &Pool)>)> = Vec::new();
    let mut unserved = false;
    // Lines read to the most a pass reads: they may hold more than their pools' room.
    let mut capped: Vec<&Pool> = Vec::new();
    for pool in &waits_on {
        let slots = pass.sizes.get(&pool.name).map_or(WAITERS_PER_POOL, |&n| n as usize);
        let want = (slots + 1).min(WAITERS_PER_POOL);
        let q = Stmt::new(limit_wait_reads::<D>()[1], "reading the runs waiting for a limit");
        let rows = D::fetch_all(tx, q.bind(pool.encode()).bind(want as i64)).await?;
        // A removed limit's waiters all go, a pass's worth at a time.
        unserved |= !pass.sizes.contains_key(&pool.name) && rows.len() >= want;
        if want == WAITERS_PER_POOL && rows.len() >= want {
            capped.push(pool);
        }
        for r in rows {
            line.push((due_from_row(&r), Some((r.opt_int("limit_wait_since").unwrap_or(ms(now)), pool))));
        }
    }
    pools.extend(line.iter().flat_map(|(d, _)| d.pools.iter().cloned()));
    pools.sort();
    pools.dedup();
    let encoded: Vec<String> = pools.iter().map(Pool::encode).collect();
    D::lock_limits(tx, &encoded).await?;
    // Who holds a slot of each pool: stale rows (their run no longer running or handed over)
    // are deleted.
    // A run may hold a pool by a row and by its own `limit_hold` at once (a row left from an
    // earlier admission): the union counts it once.
    let q = Stmt::new(
        sql!(
            D,
            format!(
                "WITH p AS (SELECT j.name, j.key, j.hold FROM {{rows $1 AS j(name text, key text, hold text)}})
                 SELECT l.name, l.key, l.run_id, h.status, h.dispatched_at FROM p
                 JOIN ll_run_limits l ON l.name = p.name AND l.key = p.key JOIN ll_runs h ON h.id = l.run_id
                 UNION
                 SELECT p.name, p.key, h.id, h.status, h.dispatched_at FROM p JOIN ll_runs h ON h.limit_hold = p.hold WHERE {HOLDING}"
            )
        ),
        "counting the slots held",
    )
    .bind_rows(vec![
        Column::Texts(pools.iter().map(|p| Some(p.name.as_str().into())).collect()),
        Column::Texts(pools.iter().map(|p| Some(p.key.as_str().into())).collect()),
        Column::Texts(pools.iter().map(|p| Some(p.encode().into())).collect()),
    ]);
    let mut held: HashMap<Pool, usize> = HashMap::new();
    let mut holders: HashSet<String> = HashSet::new();
    let mut stale: Vec<String> = Vec::new();
    for r in D::fetch_all(tx, q).await? {
        let holding = r.str("status") == crate::run::RunStatus::Running.as_str()
            || (r.str("status") == crate::run::RunStatus::Queued.as_str() && r.opt_int("dispatched_at").is_some());
        if holding {
            *held.entry(Pool { name: r.text("name"), key: r.text("key") }).or_default() += 1;
            holders.insert(r.text("run_id"));
        } else {
            stale.push(r.text("run_id"));
        }
    }
    if !stale.is_empty() {
        stale.sort();
        stale.dedup();
        let q = Stmt::new(sql!(D, "DELETE FROM ll_run_limits WHERE run_id {in $1}"), "freeing stale slots");
        D::execute(tx, q.bind_list(stale.iter().map(String::as_str))).await?;
    }
    line.extend(pass.due.iter().map(|d| (d.clone(), None)));
    line.sort_by(|(a, _), (b, _)| (a.place, &a.id).cmp(&(b.place, &b.id)));
    line.dedup_by(|(a, _), (b, _)| a.id == b.id);
    line.retain(|(d, _)| !holders.contains(&d.id));
    let pools_of: Vec<&[Pool]> = line.iter().map(|(d, _)| d.pools.as_slice()).collect();
    let decided = limits::admit(&pools_of, pass.sizes, &held);
    // Every run read of a line of 1,000 or more slots got one: the next pass reads on at once.
    let unserved = unserved || capped.iter().any(|p| !decided.waiting.iter().any(|(_, on)| on == *p));
    let mut out =
        Admitted { ids: Vec::with_capacity(decided.admitted.len()), waiting: decided.waiting.len(), waited: Vec::new(), unserved };
    for &i in &decided.admitted {
        let (due, since) = &line[i];
        out.ids.push(due.id.clone());
        if let Some((since, on)) = since {
            out.waited.push((on.name.clone(), waited_since(*since, now)));
        }
    }
    if !out.ids.is_empty() {
        // The runs admitted are locked first, in order (PostgreSQL): an end's hand-off, which
        // takes no pool lock, passes over them rather than giving the same run a slot too.
        if !D::SPELLING.lock.is_empty() {
            let q = Stmt::new(sql!(D, "SELECT id FROM ll_runs WHERE id {in $1} ORDER BY id {lock}"), "locking the runs admitted");
            D::fetch_all(tx, q.bind_list(out.ids.iter().map(String::as_str))).await?;
        }
        let mut slots: Vec<(&str, &Pool)> = Vec::new();
        for &i in &decided.admitted {
            slots.extend(line[i].0.pools.iter().map(|p| (line[i].0.id.as_str(), p)));
        }
        take_slots::<D>(tx, &slots).await?;
    }
    // A run waits on the first pool that held it back; written when that changes. By the
    // primary key alone (`… IS TRUE` keeps PostgreSQL's planner off the status index, which it
    // read whole: 25 ms a pass in a drain's line of 50,000).
    let (ids, waits): (Vec<_>, Vec<_>) = decided
        .waiting
        .iter()
        .filter(|(i, pool)| line[*i].1.is_none_or(|(_, on)| on != pool))
        .map(|(i, pool)| (Some(line[*i].0.id.as_str().into()), Some(pool.encode().into())))
        .unzip();
    if !ids.is_empty() {
        let q = Stmt::new(
            sql!(
                D,
                "UPDATE ll_runs SET limit_wait = j.wait, limit_wait_since = coalesce(ll_runs.limit_wait_since, $2)
                 FROM {rows $1 AS j(id text, wait text)}
                 WHERE ll_runs.id = j.id
                   AND (ll_runs.status = {Queued} AND ll_runs.dispatched_at IS NULL AND (ll_runs.limit_wait IS NULL OR ll_runs.limit_wait <> j.wait)) IS TRUE"
            ),
            "marking runs waiting for a limit",
        );
        D::execute(tx, q.bind_rows(vec![Column::Texts(ids), Column::Texts(waits)]).bind(ms(now))).await?;
    }
    Ok(out)
}

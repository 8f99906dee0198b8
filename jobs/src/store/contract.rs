//! The store contract: what every [`RunStore`] must do, as tests written against the interface
//! only. Each check is a function of a fresh, migrated, empty store; [`contract!`] runs all of
//! them against one implementation. A new backend adds one line at the bottom.

use std::time::Duration;

use chrono::{DateTime, Utc};

use lamplighter_config::Overlap;

use super::{ChangeRequest, Changed, Refused, Retain};
use super::{Claim, Decided, Hold, JobState, NewRun, RunEnd, RunFilter, RunStore, StepDecision, TICK_KEYS_KEPT, WorkerId};
use crate::definitions::Change;
use crate::run::{CallKind, CallRecord, FollowUp, Owner, Run, RunStatus, StepRecord, StepStatus, Trigger};
use crate::snapshot::{JobSnapshot, TargetRef};

const ME: &str = "worker-a";

pub(super) fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).expect("instant")
}

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

fn snapshot(action: &str) -> JobSnapshot {
    JobSnapshot {
        target: TargetRef::Plugin { plugin: "p".into(), action: action.into() },
        timeout_ms: Some(1500),
        working_directory: None,
        allowed_commands: vec!["ls".into()],
        budget: Some(lamplighter_config::Budget { max_tool_calls: Some(3), ..Default::default() }),
        limits: Vec::new(),
    }
}

/// A cron run of `job` for the tick at `at` (shared with the backends' own store tests).
pub(super) fn tick(job: &str, at: DateTime<Utc>) -> NewRun {
    NewRun { parameters: Some(serde_json::json!({"n": 1})), snapshot: Some(snapshot("a")), ..NewRun::tick(job, at) }
}

fn manual(job: &str, at: DateTime<Utc>) -> NewRun {
    NewRun { trigger: Trigger::Manual, scheduled_at: None, ..tick(job, at) }
}

/// The worker the checks claim runs as; each check starts with its lease taken.
fn me() -> WorkerId {
    WorkerId { name: ME.into(), instance: "contract".into(), host: "h".into(), pid: 1 }
}

/// Claims need a live lease (they record its epoch, the fence of the runs' writes).
async fn take_lease(s: &dyn RunStore) {
    assert!(s.heartbeat(&me(), Duration::from_secs(60), true, t0()).await.expect("lease").is_some());
}

/// A run of `job` claimed by [`ME`], as a target sees it.
async fn running_run(s: &dyn RunStore, job: &str) -> Run {
    let (id, _) = s.insert_run(manual(job, t0()), t0()).await.expect("insert");
    s.dispatch(std::slice::from_ref(&id), &[], ME, t0()).await.expect("claim").pop().expect("claimed").run
}

/// A run's output comes back in order, and a batch written again after its answer was lost
/// writes only the lines it had not: a line's first text stays.
async fn output_lines_are_kept_once_each_in_order(s: &dyn RunStore) {
    take_lease(s).await;
    let run = running_run(s, "j").await;
    let line = |seq: u64, stream: &str, text: &str| lamplighter_contract::OutputLine {
        seq,
        stream: stream.into(),
        at: t0() + secs(seq as i64),
        text: text.into(),
    };
    s.append_output(&run.id, &[line(1, "stdout", "one"), line(2, "stderr", "two")]).await.expect("a batch");
    let again = [line(2, "stderr", "two, again"), line(3, "stdout", "three"), line(4, "lamplighter", "")];
    s.append_output(&run.id, &again).await.expect("a batch written again, with more");
    let read = s.output(&run.id).await.expect("the output");
    let read: Vec<(u64, &str, &str, DateTime<Utc>)> = read.iter().map(|l| (l.seq, l.stream.as_str(), l.text.as_str(), l.at)).collect();
    assert_eq!(
        read,
        [
            (1, "stdout", "one", t0() + secs(1)),
            (2, "stderr", "two", t0() + secs(2)),
            (3, "stdout", "three", t0() + secs(3)),
            (4, "lamplighter", "", t0() + secs(4))
        ]
    );
}

/// `n` runs of `job`, one tick a minute from [`t0`], each claimed by [`ME`] as it fires.
async fn ticked_runs(s: &dyn RunStore, job: &str, n: i64) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let at = t0() + secs(60 * i);
        let out = s.fire_ticks(vec![(tick(job, at), Overlap::Allow)], none(1), at).await.expect("fire");
        ids.push(out.into_iter().next().flatten().and_then(|o| o.handed).expect("handed").run.id);
    }
    ids
}

fn none(slots: usize) -> Claim<'static> {
    Claim { worker: ME, slots }
}

pub(super) fn end(id: &str, status: RunStatus) -> RunEnd<'_> {
    RunEnd {
        id,
        started_at: None,
        ended_at: None,
        status,
        output: None,
        error: None,
        wait_until: None,
        trace_id: None,
        last: false,
        limits: None,
        noticed: false,
    }
}

async fn status(s: &dyn RunStore, id: &str) -> RunStatus {
    s.get_run(id).await.expect("get").expect("run exists").status
}

async fn a_tick_fires_once_even_when_a_batch_repeats_it(s: &dyn RunStore) {
    let t = t0();
    let first = s.fire_ticks(vec![(tick("a", t), Overlap::Allow), (tick("b", t), Overlap::Allow)], none(0), t).await.expect("fire");
    assert!(first.iter().all(Option::is_some));
    // The same ticks again, mixed with a new one: only the new one fires.
    let t2 = t + secs(1);
    let again = s
        .fire_ticks(vec![(tick("a", t), Overlap::Allow), (tick("a", t2), Overlap::Allow), (tick("b", t), Overlap::Allow)], none(0), t2)
        .await
        .expect("fire again");
    assert_eq!(again.iter().map(Option::is_some).collect::<Vec<_>>(), [false, true, false]);
    assert_eq!(s.list_runs(&RunFilter { limit: Some(10), ..Default::default() }).await.expect("list").len(), 3);
    // No slot was offered: it went to the queue. Each job's last tick is its newest.
    assert!(again[1].as_ref().is_some_and(|o| o.pushed && o.handed.is_none()));
    assert_eq!(s.job_state("a").await.expect("state").last_tick, Some(t2));
}

async fn a_held_tick_transaction_is_seen_only_once_it_commits(s: &dyn RunStore) {
    let t = t0();
    let runs = || async { s.list_runs(&RunFilter { limit: Some(10), ..Default::default() }).await.expect("list").len() };
    let (ready, held) = tokio::sync::oneshot::channel();
    let (go, answer) = tokio::sync::oneshot::channel::<bool>();
    let hold: Hold<'_> = Box::pin(async move {
        ready.send(()).expect("the check waits");
        answer.await.expect("an answer")
    });
    let fire = s.fire_ticks_held(vec![(tick("a", t), Overlap::Allow)], none(0), t, Some(hold));
    let check = async {
        held.await.expect("the transaction reached its hold");
        // Every statement done, nothing committed: a reader sees neither the run nor the tick.
        assert_eq!(runs().await, 0, "a held tick is not seen");
        assert_eq!(s.job_state("a").await.expect("state").last_tick, None);
        go.send(true).expect("the transaction waits");
    };
    let (out, ()) = tokio::join!(fire, check);
    let (out, timings) = out.expect("fire").expect("committed as asked");
    assert!(timings.held_us > 0 && timings.total_us >= timings.held_us, "the hold is timed: {timings:?}");
    assert!(out[0].as_ref().is_some_and(|o| o.pushed), "fired, and queued with no slot offered");
    assert_eq!(runs().await, 1);
    assert_eq!(s.job_state("a").await.expect("state").last_tick, Some(t));

    // Let go: nothing is recorded, and the same tick fires afterwards, once.
    let t2 = t + secs(60);
    let let_go: Hold<'_> = Box::pin(async { false });
    assert!(s.fire_ticks_held(vec![(tick("a", t2), Overlap::Allow)], none(0), t2, Some(let_go)).await.expect("fire").is_none());
    assert_eq!(runs().await, 1, "a tick let go leaves no run");
    assert_eq!(s.job_state("a").await.expect("state").last_tick, Some(t), "nor its last tick");
    let again = s.fire_ticks(vec![(tick("a", t2), Overlap::Allow)], none(0), t2).await.expect("fire again");
    assert!(again[0].is_some(), "its key was not kept either");
    assert_eq!(runs().await, 2);
}

async fn ticks_with_slots_are_claimed_in_their_own_transaction(s: &dyn RunStore) {
    let t = t0();
    let out = s.fire_ticks((0..3).map(|i| (tick(&format!("j{i}"), t), Overlap::Allow)).collect(), none(2), t).await.expect("fire");
    let out: Vec<_> = out.into_iter().map(|o| o.expect("fresh")).collect();
    let handed: Vec<_> = out.iter().filter_map(|o| o.handed.clone()).collect();
    assert_eq!(handed.len(), 2, "one per slot");
    assert!(out[2].pushed && out[2].handed.is_none(), "the third goes to the queue");
    assert_eq!(out.iter().map(|o| o.status).collect::<Vec<_>>(), [RunStatus::Running, RunStatus::Running, RunStatus::Queued]);
    for h in &handed {
        assert_eq!(h.snapshot, Some(snapshot("a")), "the snapshot comes with the run");
        let stored = s.get_run(&h.run.id).await.expect("get").expect("exists");
        assert_eq!(stored.status, RunStatus::Running);
        assert_eq!(stored.worker.as_deref(), Some(ME));
        assert_eq!(stored.started_at, Some(t));
        assert_eq!(h.run.status, RunStatus::Running);
    }
    // The queued one is taken by the queue, once.
    let taken = s.claim_queued(10, ME, t + secs(1)).await.expect("claim");
    assert_eq!((taken.tasks, taken.runs.len()), (1, 1));
    assert_eq!(taken.runs[0].run.id, out[2].run_id);
    assert_eq!(taken.runs[0].run.status, RunStatus::Running);
    assert_eq!(taken.runs[0].snapshot, Some(snapshot("a")));
    assert_eq!(status(s, &out[2].run_id).await, RunStatus::Running);
    let again = s.claim_queued(10, ME, t + secs(2)).await.expect("claim again");
    assert_eq!((again.tasks, again.runs.len()), (0, 0), "the queue is empty");
}

async fn the_tick_decision_follows_pause_and_overlap(s: &dyn RunStore) {
    let t = t0();
    s.set_paused("p", true, Some("maintenance"), t).await.expect("pause");
    let first = s
        .fire_ticks(
            vec![
                (tick("p", t), Overlap::Allow),
                (tick("f", t), Overlap::Forbid),
                (tick("r", t), Overlap::Replace),
                (tick("q", t), Overlap::Queue),
            ],
            none(0),
            t,
        )
        .await
        .expect("fire");
    let first: Vec<_> = first.into_iter().map(|o| o.expect("fresh")).collect();
    assert_eq!(first[0].status, RunStatus::Skipped, "a paused job's tick is skipped");
    assert!(s.get_run(&first[0].run_id).await.expect("get").expect("run").error.is_some_and(|e| e.contains("paused")));
    assert!(first[1..].iter().all(|o| o.status == RunStatus::Queued));
    // The second tick finds the first runs still active.
    let t2 = t + secs(60);
    let second = s
        .fire_ticks(vec![(tick("f", t2), Overlap::Forbid), (tick("r", t2), Overlap::Replace), (tick("q", t2), Overlap::Queue)], none(0), t2)
        .await
        .expect("fire");
    let second: Vec<_> = second.into_iter().map(|o| o.expect("fresh")).collect();
    assert_eq!(second[0].status, RunStatus::Skipped, "forbid: skipped while one is active");
    assert_eq!(second[1].status, RunStatus::Queued);
    assert_eq!(second[1].replaced, vec![first[2].run_id.clone()], "replace: names the run to cancel");
    assert_eq!(second[2].status, RunStatus::Queued);
    assert!(!second[2].pushed, "queue: held until the earlier run ends");
    let state = s.job_state("p").await.expect("state");
    assert!(state.paused);
    assert_eq!(state.pause_reason.as_deref(), Some("maintenance"));
    assert_eq!(state.paused_at, Some(t));
    s.set_paused("p", false, None, t2).await.expect("resume");
    assert!(!s.job_state("p").await.expect("state").paused);
}

async fn due_runs_are_handed_over_once(s: &dyn RunStore) {
    let t = t0();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(s.insert_run(manual("m", t + chrono::Duration::milliseconds(i)), t).await.expect("insert").0);
    }
    let later = s.insert_run(manual("m", t + secs(30)), t).await.expect("insert").0;
    assert_eq!(s.next_due().await.expect("next due"), Some(t));
    let now = t + secs(1);
    let due: Vec<String> = s.due_undispatched(now).await.expect("due").into_iter().map(|d| d.id).collect();
    assert_eq!(due, ids, "due ones only, oldest first");
    let claimed = s.dispatch(&due[..2], &due[2..], ME, now).await.expect("dispatch");
    assert_eq!(claimed.iter().map(|h| h.run.id.clone()).collect::<Vec<_>>(), due[..2].to_vec());
    assert!(s.due_undispatched(now).await.expect("due").is_empty(), "nothing is handed over twice");
    assert_eq!(s.next_due().await.expect("next due"), Some(t + secs(30)));
    assert!(s.has_dispatched_active("m").await.expect("active"));
    // Handing the same runs over again claims nothing.
    assert!(s.dispatch(&due[..2], &[], ME, now).await.expect("again").is_empty());
    let a = s.claim_queued(2, ME, now).await.expect("claim");
    let b = s.claim_queued(2, ME, now).await.expect("claim");
    let c = s.claim_queued(2, ME, now).await.expect("claim");
    assert_eq!((a.tasks, a.runs.len(), b.tasks, b.runs.len(), c.tasks), (2, 2, 1, 1, 0));
    let mut taken: Vec<String> = a.runs.iter().chain(&b.runs).map(|h| h.run.id.clone()).collect();
    taken.sort();
    assert_eq!(taken, due[2..].to_vec());
    assert_eq!(status(s, &later).await, RunStatus::Queued);
    assert_eq!(s.queue_depth().await.expect("depth"), 1);
}

/// Ends and the claims that fill their slots go in one write: the ends are recorded as
/// `finish_many` records them (steps closed, a cancel asked for meanwhile honoured), and up to
/// `n` queued runs are claimed, a run cancelled while queued left out; a worker without a live
/// lease records its ends and leaves the queue alone.
async fn ends_and_the_claims_that_replace_them_go_together(s: &dyn RunStore) {
    let t = t0();
    let a = running_run(s, "m").await;
    let b = running_run(s, "m").await;
    let asked = running_run(s, "m").await;
    s.record_steps(&b.id, &[step("gate", &b.id, StepStatus::Running, t)]).await.expect("record");
    assert!(s.request_cancel(&asked.id, "asked by ana").await.expect("ask"));
    let mut queued = Vec::new();
    for _ in 0..4 {
        queued.push(s.insert_run(manual("m", t), t).await.expect("insert").0);
    }
    s.dispatch(&[], &queued, ME, t).await.expect("dispatch");
    assert!(s.finish(&queued[0], RunStatus::Cancelled, None, Some("asked"), t).await.expect("cancel"));
    // `b` ended half a second before the write: its steps close then, with it.
    let b_ended = t + chrono::Duration::milliseconds(500);
    let ends = [
        end(&a.id, RunStatus::Succeeded),
        RunEnd { ended_at: Some(b_ended), ..end(&b.id, RunStatus::Failed) },
        end(&asked.id, RunStatus::Failed),
    ];
    let (mut done, taken) = s.finish_and_claim(&ends, 4, ME, t + secs(1)).await.expect("finish and claim");
    done.sort();
    let mut expected = [a.id.clone(), b.id.clone()];
    expected.sort();
    assert_eq!(done, expected, "recorded as asked: all but the run whose cancel was asked for");
    assert_eq!(
        (status(s, &a.id).await, status(s, &b.id).await, status(s, &asked.id).await),
        (RunStatus::Succeeded, RunStatus::Failed, RunStatus::Cancelled)
    );
    assert_eq!(
        s.steps(&b.id).await.expect("steps").iter().map(|r| (r.status, r.finished_at)).collect::<Vec<_>>(),
        [(StepStatus::Cancelled, Some(b_ended))]
    );
    assert_eq!(s.get_run(&b.id).await.expect("get").expect("run").finished_at, Some(b_ended));
    // A queue entry per run; the cancelled run's is consumed (SQLite's apalis task) or was
    // never one (PostgreSQL's queue is the queued rows).
    assert_eq!(taken.runs.len(), 3, "the run cancelled while queued is not claimed");
    assert!((3..=4).contains(&taken.tasks), "every queue entry taken: {}", taken.tasks);
    assert_eq!(status(s, &queued[0]).await, RunStatus::Cancelled);
    for h in &taken.runs {
        assert_eq!(status(s, &h.run.id).await, RunStatus::Running);
        assert_eq!(h.snapshot, Some(snapshot("a")), "the snapshot comes with the run");
        assert!(!h.resumed);
    }
    // A batch whose ends all succeeded (SQLite writes it as one script): a success stays one
    // whatever cancel was asked for meanwhile; the tasks are taken in order, a run cancelled
    // while queued left out.
    let (first, second) = (taken.runs[1].run.id.clone(), taken.runs[2].run.id.clone());
    assert!(s.request_cancel(&second, "asked too late").await.expect("ask"));
    let mut more = Vec::new();
    for i in 0..3 {
        more.push(s.insert_run(manual("m", t + secs(i)), t).await.expect("insert").0);
    }
    s.dispatch(&[], &more, ME, t).await.expect("dispatch");
    assert!(s.finish(&more[1], RunStatus::Cancelled, None, Some("asked"), t).await.expect("cancel"));
    let ends = [end(&first, RunStatus::Succeeded), end(&second, RunStatus::Succeeded)];
    let (mut done, taken_too) = s.finish_and_claim(&ends, 2, ME, t + secs(2)).await.expect("successes and claims");
    done.sort();
    let mut expected = [first.clone(), second.clone()];
    expected.sort();
    assert_eq!(done, expected);
    assert_eq!((status(s, &first).await, status(s, &second).await), (RunStatus::Succeeded, RunStatus::Succeeded));
    assert_eq!(taken_too.tasks, 2, "two tasks of three taken");
    assert_eq!(s.queue_depth().await.expect("depth"), 2 - taken_too.runs.len() as u64, "the third task's run waits, unless cancelled");
    let (_, taken_last) =
        s.finish_and_claim(&[end(&taken_too.runs[0].run.id, RunStatus::Succeeded)], 2, ME, t + secs(3)).await.expect("the rest");
    // Three entries on SQLite (the cancelled run's task among them, taken in either take), two
    // on PostgreSQL.
    let entries = taken_too.tasks + taken_last.tasks;
    assert!((2..=3).contains(&entries), "every queue entry taken once: {entries}");
    let mut claimed: Vec<String> = taken_too.runs.iter().chain(&taken_last.runs).map(|h| h.run.id.clone()).collect();
    claimed.sort();
    let mut expected = [more[0].clone(), more[2].clone()];
    expected.sort();
    assert_eq!(claimed, expected, "each run claimed once; the run cancelled while queued left out");
    assert!(taken_too.runs.iter().chain(&taken_last.runs).all(|h| h.snapshot == Some(snapshot("a")) && !h.resumed));
    assert_eq!(status(s, &more[1]).await, RunStatus::Cancelled);
    assert_eq!(status(s, &taken_too.runs[0].run.id).await, RunStatus::Succeeded);
    // With the worker's lease given up, its end is refused (fenced, as `finish_many` refuses
    // it) and nothing is taken from the queue.
    let c = taken.runs[0].run.id.clone();
    let (last, _) = s.insert_run(manual("m", t), t).await.expect("insert");
    s.dispatch(&[], &[last], ME, t).await.expect("dispatch");
    s.release(&me()).await.expect("release the lease");
    let (done, taken) = s.finish_and_claim(&[end(&c, RunStatus::Succeeded)], 1, ME, t + secs(2)).await.expect("finish alone");
    assert!(done.is_empty(), "a lapsed lease's end is refused, as finish_many refuses it");
    assert_eq!((taken.tasks, taken.runs.len()), (0, 0), "no lease: the queue is left alone");
    assert_eq!(s.queue_depth().await.expect("depth"), 1, "the last task is still queued");
}

async fn a_run_cancelled_while_queued_is_not_claimed(s: &dyn RunStore) {
    let t = t0();
    let (id, _) = s.insert_run(manual("m", t), t).await.expect("insert");
    s.dispatch(&[], std::slice::from_ref(&id), ME, t).await.expect("dispatch");
    assert!(s.finish(&id, RunStatus::Cancelled, None, Some("asked"), t).await.expect("cancel"));
    let taken = s.claim_queued(5, ME, t).await.expect("claim");
    assert_eq!(taken.runs.len(), 0, "the run stays cancelled");
    assert!(taken.tasks <= 1, "at most its own queue entry is consumed: {}", taken.tasks);
    assert_eq!(s.claim_queued(5, ME, t).await.expect("claim").tasks, 0, "nothing is left in the queue");
    assert_eq!(status(s, &id).await, RunStatus::Cancelled);
}

async fn ends_follow_the_allowed_transitions(s: &dyn RunStore) {
    let t = t0();
    let out = s.fire_ticks(vec![(tick("a", t), Overlap::Allow), (tick("b", t), Overlap::Allow)], none(2), t).await.expect("fire");
    let ids: Vec<String> = out.into_iter().map(|o| o.expect("fresh").run_id).collect();
    // One is cancelled first (its stop recorded); its first end stays.
    assert!(!s.finish(&ids[1], RunStatus::Cancelled, None, Some("stop"), t).await.expect("cancel"), "a running run is its worker's to end");
    assert_eq!(s.finish_many(&[end(&ids[1], RunStatus::Cancelled)], t).await.expect("cancel"), std::slice::from_ref(&ids[1]));
    let output = serde_json::json!({"ok": true});
    let ends = vec![
        RunEnd {
            id: &ids[0],
            started_at: Some(t + secs(1)),
            ended_at: None,
            status: RunStatus::Succeeded,
            output: Some(&output),
            error: None,
            wait_until: None,
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
            last: true,
            limits: None,
            noticed: false,
        },
        end(&ids[1], RunStatus::Failed),
    ];
    let done = s.finish_many(&ends, t + secs(2)).await.expect("finish");
    assert_eq!(done, vec![ids[0].clone()]);
    let a = s.get_run(&ids[0]).await.expect("get").expect("run");
    assert_eq!(
        (a.status, a.output, a.started_at, a.finished_at, a.trace_id.as_deref()),
        (RunStatus::Succeeded, Some(output), Some(t + secs(1)), Some(t + secs(2)), Some("4bf92f3577b34da6a3ce929d0e0e4736"))
    );
    assert_eq!(status(s, &ids[1]).await, RunStatus::Cancelled);
    // A final status is final.
    assert!(!s.finish(&ids[0], RunStatus::Failed, None, Some("late"), t).await.expect("finish"));
    assert_eq!(status(s, &ids[0]).await, RunStatus::Succeeded);
}

async fn an_idempotency_key_returns_the_first_run(s: &dyn RunStore) {
    let t = t0();
    let keyed = NewRun { idempotency_key: Some("k1".into()), ..manual("m", t) };
    let (a, created_a) = s.insert_run(keyed.clone(), t).await.expect("insert");
    let (b, created_b) = s.insert_run(keyed.clone(), t).await.expect("insert again");
    assert!(created_a && !created_b);
    assert_eq!(a, b);
    let (c, created_c) = s.insert_run(NewRun { owner: Owner::Job("other".into()), ..keyed }, t).await.expect("other job");
    assert!(created_c && c != a, "keys are per job");
}

/// Every kind of owner is read back as the owner it was stored as, listed under its name.
async fn each_owner_is_read_back_as_stored(s: &dyn RunStore) {
    let t = t0();
    let owners = [
        Owner::Job("nightly".into()),
        Owner::Workflow("etl".into()),
        Owner::Agent("scribe".into()),
        Owner::Pipeline("chain".into()),
        Owner::GroupChat(vec!["a".into(), "b".into()]),
        Owner::Plugin { plugin: "file-save".into(), action: "save".into() },
    ];
    for owner in owners {
        let (id, _) = s.insert_run(NewRun { owner: owner.clone(), ..manual("x", t) }, t).await.expect("insert");
        let run = s.get_run(&id).await.expect("get").expect("run");
        assert_eq!((&run.owner, &run.follow_up), (&owner, &FollowUp::Undecided));
        let listed = s.list_runs(&RunFilter { job: Some(owner.to_string()), ..Default::default() }).await.expect("list");
        assert_eq!(listed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [id.as_str()], "listed under {owner}");
    }
}

async fn a_follow_up_keeps_identity_snapshot_and_checkpoints(s: &dyn RunStore) {
    let t = t0();
    let out = s.fire_ticks(vec![(tick("w", t), Overlap::Allow)], none(1), t).await.expect("fire");
    let first = out.into_iter().next().flatten().and_then(|o| o.handed).expect("handed").run;
    assert_eq!(first.root_id, first.id, "a first attempt is its own root");
    s.record_checkpoint(&first.root_id, "step-1", &first.id, &serde_json::json!({"rows": 3}), t).await.expect("checkpoint");
    s.finish_many(&[end(&first.id, RunStatus::Failed)], t).await.expect("fail");
    let next_id = s.follow_up(&first, t + secs(60), t).await.expect("follow up").expect("created");
    assert_eq!(s.follow_up(&first, t + secs(60), t).await.expect("again"), None, "one follow-up per run");
    let next = s.get_run(&next_id).await.expect("get").expect("run");
    assert_eq!(
        (next.trigger, next.status, next.attempt, next.root_id.as_str(), next.retry_of.as_deref(), next.scheduled_at, next.due_at),
        (Trigger::Retry, RunStatus::Queued, 2, first.id.as_str(), Some(first.id.as_str()), Some(t), t + secs(60))
    );
    assert_eq!(next.parameters, first.parameters);
    assert_eq!(s.get_run(&first.id).await.expect("get").expect("run").follow_up, FollowUp::Next(next_id.clone()));
    // Closing a run as "no follow-up" (recovery deciding none is due) never blanks a link that
    // another worker wrote meanwhile.
    s.mark_no_follow_up(&first.id).await.expect("close");
    assert_eq!(
        s.get_run(&first.id).await.expect("get").expect("run").follow_up,
        FollowUp::Next(next_id.clone()),
        "an existing follow-up link is kept"
    );
    // The next attempt runs what the first ran, and finds its checkpoint.
    let handed = s.dispatch(std::slice::from_ref(&next_id), &[], ME, t + secs(60)).await.expect("dispatch");
    assert_eq!(handed[0].snapshot, Some(snapshot("a")));
    assert_eq!(s.checkpoint(&next.root_id, "step-1").await.expect("read"), Some(serde_json::json!({"rows": 3})));
    assert_eq!(s.checkpoint(&next.root_id, "step-2").await.expect("read"), None);
    // A later attempt overwrites a step it redoes.
    s.record_checkpoint(&next.root_id, "step-1", &next_id, &serde_json::json!({"rows": 4}), t).await.expect("checkpoint");
    assert_eq!(s.checkpoint(&first.id, "step-1").await.expect("read"), Some(serde_json::json!({"rows": 4})));
}

async fn recovery_interrupts_running_runs_and_hands_queued_ones_over_again(s: &dyn RunStore) {
    let t = t0();
    let out = s.fire_ticks(vec![(tick("a", t), Overlap::Allow), (tick("b", t), Overlap::Allow)], none(1), t).await.expect("fire");
    let ids: Vec<String> = out.into_iter().map(|o| o.expect("fresh").run_id).collect();
    // The process dies and its lease goes: "a" was running, "b" was in the queue. Another
    // process recovers.
    s.release(&me()).await.expect("release");
    let later = t + secs(5);
    let orphans = s.recover(Some("worker-b"), later).await.expect("recover");
    assert_eq!(orphans.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), vec![ids[0].clone()]);
    let a = s.get_run(&ids[0]).await.expect("get").expect("run");
    assert_eq!((a.status, a.finished_at), (RunStatus::Interrupted, Some(later)));
    assert!(a.error.is_some_and(|e| e.contains(ME)), "the error names the worker");
    // The queued run is taken once more: through its task where the queue outlives workers
    // (PostgreSQL), or handed over again where recovery drops the queue (SQLite).
    let b = WorkerId { name: "worker-b".into(), ..me() };
    assert!(s.heartbeat(&b, Duration::from_secs(60), true, later).await.expect("lease").is_some());
    let taken: Vec<String> = s.claim_queued(5, "worker-b", later).await.expect("claim").runs.into_iter().map(|h| h.run.id).collect();
    let due: Vec<String> = s.due_undispatched(later).await.expect("due").into_iter().map(|d| d.id).collect();
    assert_eq!([taken, due].concat(), vec![ids[1].clone()], "the queued run is handed over exactly once");
    let waiting: Vec<String> = s.interrupted_without_follow_up().await.expect("list").into_iter().map(|r| r.id).collect();
    assert_eq!(waiting, vec![ids[0].clone()]);
    s.mark_no_follow_up(&ids[0]).await.expect("close");
    assert_eq!(s.get_run(&ids[0]).await.expect("get").expect("run").follow_up, FollowUp::None, "closed: none follows");
    assert!(s.interrupted_without_follow_up().await.expect("list").is_empty());
}

/// A worker that starts under the name of one that died (a configured name) takes its row
/// over and recovers what it left; the process it replaced can no longer renew the lease.
async fn a_restart_under_the_same_name_takes_the_lease_over(s: &dyn RunStore) {
    let t = t0();
    let old = WorkerId { name: ME.into(), instance: "one".into(), host: "h".into(), pid: 1 };
    assert!(s.heartbeat(&old, Duration::from_secs(60), true, t).await.expect("lease").is_some());
    let out = s.fire_ticks(vec![(tick("a", t), Overlap::Allow)], none(1), t).await.expect("fire");
    let id = out[0].as_ref().expect("fresh").run_id.clone();
    let listed = s.workers(t).await.expect("workers");
    assert_eq!(listed.iter().map(|w| (w.name.as_str(), w.running.clone())).collect::<Vec<_>>(), [(ME, vec![id.clone()])]);
    // The new process under the same name.
    let new = WorkerId { instance: "two".into(), pid: 2, ..old.clone() };
    let before = s.heartbeat(&old, Duration::from_secs(60), false, t).await.expect("renew").expect("held").epoch;
    let after = s.heartbeat(&new, Duration::from_secs(60), true, t).await.expect("take over").expect("taken").epoch;
    assert!(after > before, "a new process under the name starts a new epoch: {before} then {after}");
    // The old process's late end is refused: the run is no longer its epoch's.
    assert!(s.finish_many(&[end(&id, RunStatus::Succeeded)], t).await.expect("finish").is_empty(), "fenced");
    let orphans = s.recover(Some(ME), t + secs(1)).await.expect("recover");
    assert_eq!(orphans.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), vec![id]);
    assert!(s.heartbeat(&old, Duration::from_secs(60), false, t).await.expect("renew").is_none(), "the old process lost its name");
    let renewed = s.heartbeat(&new, Duration::from_secs(60), false, t).await.expect("renew").expect("held");
    assert_eq!(renewed.epoch, after, "a renewal keeps the epoch");
    assert_eq!(s.workers(t).await.expect("workers")[0].pid, 2);
    s.release(&new).await.expect("release");
    assert!(s.workers(t).await.expect("workers").is_empty(), "a released lease is not listed");
}

/// Workers share the schedule with those that know the same jobs and hold a live lease (a
/// shared database): a join, a leave, a lapsed lease and other jobs each change the group.
async fn workers_that_know_the_same_jobs_share_them(s: &dyn RunStore) {
    let t = t0();
    let w = |name: &str, pid: u32| WorkerId { name: name.into(), instance: format!("i-{name}"), host: "h".into(), pid };
    let (a, b, old, gone) = (w("worker-a", 1), w("worker-b", 2), w("worker-old", 3), w("worker-gone", 4));
    for x in [&a, &b, &old] {
        assert!(s.heartbeat(x, Duration::from_secs(60), true, t).await.expect("lease").is_some());
    }
    let group = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(s.share(&a, Some("d1")).await.expect("share"), group(&["worker-a"]));
    // A join: the newcomer reads the group with itself; a worker of an earlier version (no
    // digest) is in none.
    assert_eq!(s.share(&b, Some("d1")).await.expect("share"), group(&["worker-a", "worker-b"]));
    assert_eq!(s.share(&a, Some("d1")).await.expect("share"), group(&["worker-a", "worker-b"]));
    // Other jobs known: a group of its own.
    assert_eq!(s.share(&a, Some("d2")).await.expect("share"), group(&["worker-a"]));
    assert_eq!(s.share(&b, Some("d1")).await.expect("share"), group(&["worker-b"]));
    assert_eq!(s.share(&a, Some("d1")).await.expect("share"), group(&["worker-a", "worker-b"]));
    // A leave (a shutdown begins): out of the group while its lease still runs.
    assert_eq!(s.share(&b, None).await.expect("share"), Vec::<String>::new());
    assert_eq!(s.share(&a, Some("d1")).await.expect("share"), group(&["worker-a"]));
    assert_eq!(s.share(&b, Some("d1")).await.expect("share").len(), 2, "back in");
    s.release(&b).await.expect("release");
    assert_eq!(s.share(&a, Some("d1")).await.expect("share"), group(&["worker-a"]), "a released lease leaves the group");
    // A lease that ran out leaves it too, though its row stays until it is taken over.
    assert!(s.heartbeat(&gone, Duration::ZERO, true, t).await.expect("lease").is_some());
    assert_eq!(s.share(&gone, Some("d1")).await.expect("share"), group(&["worker-a", "worker-gone"]), "itself, as it writes");
    assert_eq!(s.share(&a, Some("d1")).await.expect("share"), group(&["worker-a"]), "not a member once its lease ran out");
    assert_eq!(s.workers(t).await.expect("workers").len(), 2, "a and the old worker hold live leases");
}

/// One worker holds a SQLite file: its group is itself, whatever else is in `ll_workers`.
async fn a_lone_worker_shares_with_nobody(s: &dyn RunStore) {
    let t = t0();
    let other = WorkerId { name: "worker-b".into(), ..me() };
    assert!(s.heartbeat(&other, Duration::from_secs(60), true, t).await.expect("lease").is_some());
    assert_eq!(s.share(&other, Some("d1")).await.expect("share"), vec!["worker-b".to_string()]);
    assert_eq!(s.share(&me(), Some("d1")).await.expect("share"), vec![ME.to_string()]);
}

/// `n` ticks of `job` a minute apart from [`t0`], each claimed as it fires: their runs' ids.
async fn running_ticks(s: &dyn RunStore, job: &str, n: i64) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let at = t0() + secs(i * 60);
        let out = s.fire_ticks(vec![(tick(job, at), Overlap::Allow)], none(1), at).await.expect("fire");
        ids.push(out.into_iter().next().flatten().expect("fresh").run_id);
    }
    ids
}

async fn retention_deletes_only_finished_runs(s: &dyn RunStore) {
    let t = t0();
    let ids = running_ticks(s, "r", 4).await;
    // Three end, one keeps running.
    for id in &ids[..3] {
        s.finish_many(&[end(id, RunStatus::Succeeded)], t + secs(200)).await.expect("finish");
    }
    // An outcome not yet noticed (its notifications not yet recorded) is kept.
    assert_eq!(s.prune(&[keep("r", Some(1), None)], t + secs(300)).await.expect("prune"), 0);
    let no_rules = |_: &str| None;
    assert_eq!(s.notice(&no_rules, &no_after, false, t + secs(300)).await.expect("notice").runs, 3);
    assert_eq!(s.prune(&[keep("r", Some(1), None)], t + secs(300)).await.expect("prune"), 2);
    let left: Vec<String> =
        s.list_runs(&RunFilter { job: Some("r".into()), ..Default::default() }).await.expect("list").into_iter().map(|r| r.id).collect();
    assert_eq!(left, vec![ids[3].clone(), ids[2].clone()], "the newest finished run and the running one");
    // By age: the finished one is older than a minute, the running one has no end.
    assert_eq!(s.prune(&[keep("r", None, Some(Duration::from_secs(60)))], t + secs(400)).await.expect("prune"), 1);
    assert_eq!(status(s, &ids[3]).await, RunStatus::Running);
    s.housekeeping().await.expect("housekeeping");
}

/// The runs kept by count are the newest finished ones, noticed or not: a run still running
/// is neither pruned nor counted (the newest or the oldest), and a finished run not yet
/// noticed counts but waits for its notice.
async fn retention_by_count_passes_over_older_runs_not_done_with(s: &dyn RunStore) {
    let t = t0();
    let ids = running_ticks(s, "o", 6).await;
    // The oldest and the newest keep running; the fifth ends after the notice pass.
    for id in &ids[1..4] {
        s.finish_many(&[end(id, RunStatus::Succeeded)], t + secs(400)).await.expect("finish");
    }
    let no_rules = |_: &str| None;
    assert_eq!(s.notice(&no_rules, &no_after, false, t + secs(400)).await.expect("notice").runs, 3);
    s.finish_many(&[end(&ids[4], RunStatus::Succeeded)], t + secs(410)).await.expect("finish");
    // Keeping two: the fifth (not noticed) and the fourth; the second and the third go.
    assert_eq!(s.prune(&[keep("o", Some(2), None)], t + secs(420)).await.expect("prune"), 2);
    let left = || async move {
        let runs = s.list_runs(&RunFilter { job: Some("o".into()), ..Default::default() }).await.expect("list");
        runs.into_iter().map(|r| r.id).collect::<Vec<_>>()
    };
    assert_eq!(left().await, vec![ids[5].clone(), ids[4].clone(), ids[3].clone(), ids[0].clone()]);
    // Once noticed, the fifth can go too; the running ones stay whatever is kept.
    assert_eq!(s.notice(&no_rules, &no_after, false, t + secs(430)).await.expect("notice").runs, 1);
    assert_eq!(s.prune(&[keep("o", Some(0), None)], t + secs(440)).await.expect("prune"), 2);
    assert_eq!(left().await, vec![ids[5].clone(), ids[0].clone()]);
    for id in [&ids[0], &ids[5]] {
        assert_eq!(status(s, id).await, RunStatus::Running);
    }
}

/// A job's retention for [`Upkeep::prune`].
fn keep(job: &str, keep: Option<u32>, max_age: Option<Duration>) -> Retain<'_> {
    Retain { job, keep, max_age }
}

/// One call applies each job's own retention, and leaves a job it was not given alone.
async fn retention_of_many_jobs_is_applied_each_its_own_way_in_one_call(s: &dyn RunStore) {
    let t = t0();
    let no_rules = |_: &str| None;
    let mut ids: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for job in ["a", "b", "c"] {
        for i in 0..3 {
            let at = t + secs(i * 60);
            let out = s.fire_ticks(vec![(tick(job, at), Overlap::Allow)], none(1), at).await.expect("fire");
            let id = out.into_iter().next().flatten().expect("fresh").run_id;
            s.finish_many(&[end(&id, RunStatus::Succeeded)], at + secs(1)).await.expect("finish");
            ids.entry(job).or_default().push(id);
        }
    }
    assert_eq!(s.notice(&no_rules, &no_after, false, t + secs(300)).await.expect("notice").runs, 9);
    // `a` keeps its newest run, `b` those that ended in the last 90 s (the third only), `c` is
    // not pruned.
    let asked = [keep("a", Some(1), None), keep("b", None, Some(Duration::from_secs(90)))];
    assert_eq!(s.prune(&asked, t + secs(200)).await.expect("prune"), 4);
    let left = |job: &'static str| async move {
        let runs = s.list_runs(&RunFilter { job: Some(job.into()), ..Default::default() }).await.expect("list");
        runs.into_iter().map(|r| r.id).collect::<Vec<_>>()
    };
    assert_eq!(left("a").await, vec![ids["a"][2].clone()]);
    assert_eq!(left("b").await, vec![ids["b"][2].clone()]);
    assert_eq!(left("c").await.len(), 3, "a job not asked about keeps its runs");
    assert_eq!(s.prune(&[], t + secs(200)).await.expect("prune nothing"), 0);
}

async fn tick_keys_guard_a_window_then_go(s: &dyn RunStore) {
    let t = t0();
    let fire = |now| s.fire_ticks(vec![(tick("k", t), Overlap::Allow)], none(0), now);
    assert!(fire(t).await.expect("fire")[0].is_some(), "the first time, the tick fires");
    // Inside the window, pruning keeps the key: the same tick (a clock stepped back) is refused.
    let inside = t + chrono::Duration::from_std(TICK_KEYS_KEPT).expect("window") - secs(1);
    s.prune(&[keep("k", None, None)], inside).await.expect("prune");
    assert!(fire(inside).await.expect("fire again")[0].is_none(), "a tick fires once while its key is kept");
    // Past it the key is gone: the table stays bounded however long the worker runs.
    let past = t + chrono::Duration::from_std(TICK_KEYS_KEPT).expect("window") + secs(1);
    s.prune(&[keep("k", None, None)], past).await.expect("prune");
    assert!(fire(past).await.expect("fire after the window")[0].is_some(), "the key was pruned");
}

async fn listings_page_newest_first_and_count(s: &dyn RunStore) {
    let t = t0();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(s.insert_run(manual(if i % 2 == 0 { "even" } else { "odd" }, t), t).await.expect("insert").0);
    }
    s.finish(&ids[0], RunStatus::Cancelled, None, None, t).await.expect("cancel");
    let page = s.list_runs(&RunFilter { limit: Some(2), ..Default::default() }).await.expect("page");
    assert_eq!(page.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), vec![ids[4].clone(), ids[3].clone()]);
    let next = s.list_runs(&RunFilter { limit: Some(2), before: Some(ids[3].clone()), ..Default::default() }).await.expect("page");
    assert_eq!(next.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), vec![ids[2].clone(), ids[1].clone()]);
    let queued = s
        .list_runs(&RunFilter { job: Some("even".into()), status: Some(RunStatus::Queued), ..Default::default() })
        .await
        .expect("filtered");
    assert_eq!(queued.len(), 2);
    // Every combination of filters builds its own query: each one once more.
    let ids_of = |runs: Vec<Run>| runs.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let cancelled = s.list_runs(&RunFilter { status: Some(RunStatus::Cancelled), ..Default::default() }).await.expect("by status");
    assert_eq!(ids_of(cancelled), vec![ids[0].clone()]);
    let older_even = s.list_runs(&RunFilter { job: Some("even".into()), before: Some(ids[4].clone()), ..Default::default() }).await;
    assert_eq!(ids_of(older_even.expect("by job, paged")), vec![ids[2].clone(), ids[0].clone()]);
    let all = RunFilter { job: Some("even".into()), status: Some(RunStatus::Queued), before: Some(ids[4].clone()), limit: Some(1) };
    assert_eq!(ids_of(s.list_runs(&all).await.expect("every filter")), vec![ids[2].clone()]);
    let even = s.job_overview("even", 2).await.expect("overview");
    assert_eq!((even.counts.get(&RunStatus::Queued), even.counts.get(&RunStatus::Cancelled)), (Some(&2), Some(&1)));
    assert_eq!(
        even.recent.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        vec![ids[4].as_str(), ids[2].as_str()],
        "newest first, as many as asked"
    );
    assert_eq!((even.recent[0].status, even.recent[0].trigger), (RunStatus::Queued, Trigger::Manual));
    assert_eq!(even.state, JobState::default(), "never paused, never ticked");
    let none = s.job_overview("never-ran", 10).await.expect("overview of a job without runs");
    assert!(none.recent.is_empty() && none.counts.is_empty() && none.state == JobState::default(), "{none:?}");
    let last = s.last_runs(&["even", "odd", "never-ran"]).await.expect("last");
    assert_eq!((last["even"].id.as_str(), last["odd"].id.as_str()), (ids[4].as_str(), ids[3].as_str()));
    assert!(!last.contains_key("never-ran"), "a job without runs has no last run");
    assert_eq!(s.last_runs(&["odd"]).await.expect("last of one").len(), 1, "only the jobs asked for");
    assert_eq!(s.queue_depth().await.expect("depth"), 4);
    assert!(s.get_run("no-such-run").await.expect("get").is_none());
}

async fn job_state_persists_and_the_last_tick_only_moves_forward(s: &dyn RunStore) {
    let t = t0();
    assert_eq!(s.job_state("j").await.expect("state"), Default::default());
    s.set_last_tick("j", t + secs(60)).await.expect("tick");
    s.set_last_tick("j", t).await.expect("older tick");
    assert_eq!(s.job_state("j").await.expect("state").last_tick, Some(t + secs(60)));
    s.set_paused("j", true, None, t).await.expect("pause");
    let all = s.job_states().await.expect("states");
    assert_eq!((all["j"].paused, all["j"].last_tick), (true, Some(t + secs(60))), "a pause keeps the last tick");
    // A reason survives the listing's read whatever it holds.
    let reason = "disk \"full\" \\ ünïcode\n✓";
    s.set_paused("k", true, Some(reason), t).await.expect("pause with a reason");
    let all = s.job_states().await.expect("states");
    assert_eq!(all["k"], JobState { paused: true, pause_reason: Some(reason.into()), paused_at: Some(t), last_tick: None });
    assert_eq!(all["k"], s.job_state("k").await.expect("one state"), "the listing reads what the single read does");
    assert_eq!(s.job_overview("k", 1).await.expect("overview").state, all["k"], "and so does a job's overview");
    assert_eq!(s.check().await, Ok(()));
}

/// A tag's pause is one transaction over its jobs with one reason: it answers which jobs it
/// changed and leaves a job already paused as it was (its own reason and time); its resume
/// moves the last tick of each job it resumes (what was missed while paused is not caught up)
/// and of no other.
async fn a_group_pauses_and_resumes_at_once(s: &dyn RunStore) {
    let t = t0();
    s.set_paused("b", true, Some("earlier"), t).await.expect("pause b");
    s.set_last_tick("c", t - secs(600)).await.expect("c ticked");
    let jobs = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
    let changed = s.set_paused_all(&jobs, true, Some("month end"), t + secs(5)).await.expect("pause all");
    assert_eq!(changed, ["a", "c"], "b was paused already");
    let all = s.job_states().await.expect("states");
    for job in ["a", "c"] {
        assert!(all[job].paused, "{job} paused");
        assert_eq!(all[job].pause_reason.as_deref(), Some("month end"), "{job}: one reason for all it paused");
    }
    assert_eq!((all["b"].pause_reason.as_deref(), all["b"].paused_at), (Some("earlier"), Some(t)), "b kept its own pause");
    assert_eq!(all["a"].paused_at, Some(t + secs(5)));
    assert_eq!(all["c"].last_tick, Some(t - secs(600)), "a pause keeps the last tick");
    let again = s.set_paused_all(&jobs, true, Some("still"), t + secs(6)).await.expect("pause all again");
    assert!(again.is_empty(), "{again:?}");
    let resumed = s.set_paused_all(&jobs[..2], false, None, t + secs(60)).await.expect("resume two");
    assert_eq!(resumed, ["a", "b"]);
    let all = s.job_states().await.expect("states");
    for job in ["a", "b"] {
        assert_eq!(all[job], JobState { paused: false, pause_reason: None, paused_at: None, last_tick: Some(t + secs(60)) }, "{job}");
    }
    assert!(all["c"].paused, "c was not named");
    // A job of the group that was not paused keeps its last tick: nothing it has due is lost.
    s.set_last_tick("d", t + secs(50)).await.expect("d ticked");
    let names = ["c".to_owned(), "d".to_owned()];
    assert_eq!(s.set_paused_all(&names, false, None, t + secs(90)).await.expect("resume"), ["c"]);
    let all = s.job_states().await.expect("states");
    assert_eq!((all["c"].last_tick, all["d"].last_tick), (Some(t + secs(90)), Some(t + secs(50))));
}

fn call(conversation: &str, seq: u32, kind: CallKind, at: DateTime<Utc>) -> CallRecord {
    CallRecord {
        conversation: conversation.into(),
        seq,
        kind,
        name: "m".into(),
        call_id: None,
        request: None,
        response: Some(serde_json::json!({"content": "hi"})),
        error: None,
        input_tokens: 10,
        output_tokens: 5,
        cost: Some(0.5),
        run_id: "r".into(),
        attempt: 1,
        started_at: at,
        finished_at: at + secs(1),
    }
}

/// The count of listing changes, when the backend keeps one, moves with everything a job
/// listing shows (a pause, a new run, a run's status) and only with that: not with a tick's
/// bookkeeping or a heartbeat, which commit every few seconds. A kept listing relies on it.
async fn listing_changes_move_with_what_a_listing_shows(s: &dyn RunStore) {
    let Some(n0) = s.listing_changes().await else {
        // A backend that cannot tell cheaply (PostgreSQL: other workers write too) never
        // offers a count a cache could trust, whatever changes: a listing is read each time.
        s.set_paused("a", true, Some("why"), t0()).await.expect("pause");
        s.insert_run(tick("a", t0()), t0()).await.expect("insert");
        assert_eq!(s.listing_changes().await, None, "no count after changes either");
        return;
    };
    s.job_states().await.expect("a read");
    s.last_runs(&["a"]).await.expect("a read");
    assert_eq!(s.listing_changes().await, Some(n0), "reads change nothing");
    s.set_paused("a", true, Some("why"), t0()).await.expect("pause");
    let n1 = s.listing_changes().await.expect("a count");
    assert_ne!(n1, n0, "a pause shows");
    s.set_last_tick("a", t0() + secs(1)).await.expect("a tick");
    let me = WorkerId { name: ME.into(), instance: "one".into(), host: "h".into(), pid: 1 };
    s.heartbeat(&me, Duration::from_secs(30), true, t0()).await.expect("heartbeat");
    assert_eq!(s.listing_changes().await, Some(n1), "a tick's bookkeeping and a heartbeat do not show");
    let (id, _) = s.insert_run(tick("a", t0()), t0()).await.expect("insert");
    let n2 = s.listing_changes().await.expect("a count");
    assert_ne!(n2, n1, "a new run is a job's last run");
    assert!(s.finish(&id, RunStatus::Cancelled, None, Some("asked"), t0()).await.expect("cancel"));
    assert_ne!(s.listing_changes().await, Some(n2), "a run's status shows");
    s.close().await;
    assert_eq!(s.listing_changes().await, None, "a closed store keeps nothing");
}

async fn agent_calls_and_resuming_rejections(s: &dyn RunStore) {
    let t = t0();
    let r1 = running_run(s, "agent").await;
    let root = r1.root_id.as_str();
    let mine = |conversation: &str, seq, kind| CallRecord { run_id: r1.id.clone(), ..call(conversation, seq, kind, t) };
    // Calls come back by conversation and order, whatever order they were written in; a
    // record at the same place replaces the earlier one.
    s.record_call(root, &mine("", 1, CallKind::Tool)).await.expect("record");
    s.record_call(root, &mine("", 0, CallKind::Model)).await.expect("record");
    s.record_call(root, &mine("b", 0, CallKind::Model)).await.expect("record");
    let again = CallRecord { name: "tool.x".into(), ..mine("", 1, CallKind::Tool) };
    s.record_call(root, &again).await.expect("replace");
    let calls = s.calls(root).await.expect("calls");
    let places: Vec<(&str, u32, CallKind)> = calls.iter().map(|c| (c.conversation.as_str(), c.seq, c.kind)).collect();
    assert_eq!(places, [("", 0, CallKind::Model), ("", 1, CallKind::Tool), ("b", 0, CallKind::Model)]);
    assert_eq!(calls[1], again, "a record reads back as written");
    assert!(s.calls("other").await.expect("calls").is_empty());

    // An attempt that lost its run (its worker's lease went to a new process under its name)
    // cannot write any more, for calls, steps and checkpoints — refused for its epoch alone,
    // while its row still says `running`; the next attempt's records stand.
    let done = |run: &Run, status| StepRecord { attempt: run.attempt, ..step("draft", &run.id, status, t) };
    s.record_steps(root, &[done(&r1, StepStatus::Running)]).await.expect("record");
    let next = WorkerId { instance: "next".into(), ..me() };
    assert!(s.heartbeat(&next, Duration::from_secs(60), true, t).await.expect("take over").is_some());
    assert_eq!(status(s, &r1.id).await, RunStatus::Running);
    let early = CallRecord { name: "early".into(), ..mine("", 0, CallKind::Model) };
    assert!(s.record_call(root, &early).await.expect_err("the old epoch is fenced").is_fenced());
    assert_eq!(s.recover(Some(ME), t).await.expect("recover").len(), 1, "taken over");
    let r2_id = s.follow_up(&r1, t, t).await.expect("follow up").expect("created");
    let r2 = s.dispatch(std::slice::from_ref(&r2_id), &[], ME, t).await.expect("claim").pop().expect("claimed").run;
    let later = CallRecord { attempt: 2, run_id: r2.id.clone(), name: "later".into(), ..call("", 0, CallKind::Model, t) };
    s.record_call(root, &later).await.expect("record");
    s.record_steps(root, &[done(&r2, StepStatus::Succeeded)]).await.expect("record");
    let stale = CallRecord { name: "stale".into(), ..mine("", 0, CallKind::Model) };
    let refused = s.record_call(root, &stale).await.expect_err("the old attempt is fenced");
    assert!(refused.is_fenced(), "{refused}");
    let cut = StepRecord { error: Some("interrupted".into()), ..done(&r1, StepStatus::Failed) };
    assert!(s.record_steps(root, &[cut]).await.expect_err("fenced").is_fenced());
    let value = serde_json::json!("stale");
    assert!(s.record_checkpoint(root, "draft", &r1.id, &value, t).await.expect_err("fenced").is_fenced());
    assert_eq!(s.calls(root).await.expect("calls")[0], later);
    assert_eq!(s.steps(root).await.expect("steps"), [done(&r2, StepStatus::Succeeded)]);
    assert_eq!(s.checkpoint(root, "draft").await.expect("read"), None);

    // A wait marked to resume on rejection: rejecting it records the rejection on the step
    // and queues the run again, for the run to act on.
    let a = running_run(s, "w").await.id;
    let mut ask = step("tool-1", &a, StepStatus::WaitingApproval, t);
    ask.output = Some(serde_json::json!({ "tool": "shell.run" }));
    ask.resumes_on_reject = true;
    s.record_steps(&a, &[ask]).await.expect("record");
    assert_eq!(s.finish_many(&[end(&a, RunStatus::WaitingApproval)], t).await.expect("wait"), std::slice::from_ref(&a));
    let d = StepDecision { run_id: &a, step: None, approve: false, comment: Some("no"), decided_by: "ana" };
    match s.record_decision(&d, t).await.expect("decide") {
        Decided::Recorded { step, run } => {
            assert_eq!((step.status, run), (StepStatus::Failed, RunStatus::Queued));
            assert_eq!(step.output.expect("decision")["approved"], false);
        }
        other => panic!("{other:?}"),
    }
}

/// Runs every check of the contract against one implementation: `$make` is an async
/// expression giving `(guard, store)`; the guard lives as long as the test.
fn step(id: &str, run: &str, status: StepStatus, at: DateTime<Utc>) -> StepRecord {
    StepRecord {
        step: id.into(),
        status,
        attempt: 1,
        run_id: run.into(),
        started_at: Some(at),
        finished_at: None,
        output: None,
        error: None,
        resumes_on_reject: false,
    }
}

/// A claimed run that ends waiting on `steps` (recorded waiting), until `until`.
async fn waiting_run(s: &dyn RunStore, steps: &[&str], until: Option<DateTime<Utc>>) -> String {
    let t = t0();
    let (id, _) = s.insert_run(manual("w", t), t).await.expect("insert");
    assert_eq!(s.dispatch(std::slice::from_ref(&id), &[], ME, t).await.expect("claim").len(), 1);
    let records: Vec<StepRecord> = steps.iter().map(|st| step(st, &id, StepStatus::WaitingApproval, t)).collect();
    s.record_steps(&id, &records).await.expect("record steps");
    let end = RunEnd { wait_until: until, ..end(&id, RunStatus::WaitingApproval) };
    assert_eq!(s.finish_many(&[end], t).await.expect("wait"), std::slice::from_ref(&id));
    id
}

async fn waits_decisions_and_step_records(s: &dyn RunStore) {
    let t = t0();
    let decide = |run_id, step, approve| StepDecision { run_id, step, approve, comment: Some("c"), decided_by: "ana" };
    // A run waiting on one step: not finished, no slot; approving resumes it, once.
    let a = waiting_run(s, &["gate"], None).await;
    let run = s.get_run(&a).await.expect("get").expect("exists");
    assert_eq!((run.status, run.finished_at), (RunStatus::WaitingApproval, None));
    assert_eq!(s.recover(Some("worker-b"), t).await.expect("recover").len(), 0, "a wait is not an orphan");
    match s.record_decision(&decide(&a, None, true), t + secs(5)).await.expect("decide") {
        Decided::Recorded { step, run } => {
            assert_eq!((step.step.as_str(), step.status, run), ("gate", StepStatus::Succeeded, RunStatus::Queued));
            assert_eq!(step.output.expect("decision")["decided_by"], "ana");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.record_decision(&decide(&a, None, false), t).await.expect("again"), Decided::NotWaiting(RunStatus::Queued));
    let resumed = s.dispatch(std::slice::from_ref(&a), &[], ME, t + secs(6)).await.expect("claim again");
    assert!(resumed[0].resumed, "claimed again as a resumed run");
    assert_eq!(resumed[0].run.started_at, Some(t), "it keeps its first start");

    // Two steps: say which; a rejection fails the run and cancels the other.
    let b = waiting_run(s, &["x", "y"], None).await;
    let which = s.record_decision(&decide(&b, None, true), t).await.expect("decide");
    assert_eq!(which, Decided::WhichStep { waiting: vec!["x".into(), "y".into()] });
    let unknown = s.record_decision(&decide(&b, Some("z"), true), t).await.expect("decide");
    assert_eq!(unknown, Decided::NotWaitingStep { waiting: vec!["x".into(), "y".into()] });
    match s.record_decision(&decide(&b, Some("x"), false), t).await.expect("reject") {
        Decided::Recorded { run, .. } => assert_eq!(run, RunStatus::Failed),
        other => panic!("{other:?}"),
    }
    let run = s.get_run(&b).await.expect("get").expect("exists");
    assert_eq!(run.error.as_deref(), Some("step \"x\" was rejected by ana: c"));
    let steps = s.steps(&b).await.expect("steps");
    let by_id = |id: &str| steps.iter().find(|r| r.step == id).map(|r| r.status);
    assert_eq!((by_id("x"), by_id("y")), (Some(StepStatus::Failed), Some(StepStatus::Cancelled)));
    assert_eq!(s.record_decision(&decide("nope", None, true), t).await.expect("decide"), Decided::NoSuchRun);

    // A wait with a limit: due then, and queued again once it passes.
    let c = waiting_run(s, &["gate"], Some(t + secs(60))).await;
    assert_eq!(s.next_due().await.expect("next due"), Some(t + secs(60)));
    assert!(s.wake_waiting(t + secs(59)).await.expect("wake").is_empty());
    assert_eq!(s.wake_waiting(t + secs(60)).await.expect("wake"), std::slice::from_ref(&c));
    assert_eq!(status(s, &c).await, RunStatus::Queued);
    // A run that ends cancelled closes its open steps; records replace earlier ones.
    assert_eq!(s.dispatch(std::slice::from_ref(&c), &[], ME, t).await.expect("claim").len(), 1);
    s.record_steps(&c, &[step("gate", &c, StepStatus::Running, t)]).await.expect("record");
    assert_eq!(s.finish_many(&[end(&c, RunStatus::Cancelled)], t).await.expect("cancel"), std::slice::from_ref(&c));
    assert_eq!(s.steps(&c).await.expect("steps").iter().map(|r| r.status).collect::<Vec<_>>(), [StepStatus::Cancelled]);
}

/// A cancel asked for a run running elsewhere is kept with it until it ends, for its worker to
/// find if it missed the signal.
async fn a_cancel_request_is_kept_with_its_running_run(s: &dyn RunStore) {
    let t = t0();
    let run = running_run(s, "c").await;
    let (queued, _) = s.insert_run(manual("c", t), t).await.expect("insert");
    assert!(!s.request_cancel(&queued, "no").await.expect("ask"), "only a running run keeps a request");
    assert!(s.cancels_requested(ME).await.expect("read").is_empty());
    assert!(s.request_cancel(&run.id, "asked by ana").await.expect("ask"));
    assert_eq!(s.cancels_requested(ME).await.expect("read"), [(run.id.clone(), "asked by ana".to_owned())]);
    assert!(s.cancels_requested("worker-b").await.expect("read").is_empty(), "each worker reads its own");
    let ended = RunEnd { error: Some("asked by ana"), ..end(&run.id, RunStatus::Cancelled) };
    assert_eq!(s.finish_many(&[ended], t).await.expect("end"), std::slice::from_ref(&run.id));
    assert!(s.cancels_requested(ME).await.expect("read").is_empty(), "an ended run is no longer asked to stop");
    // A run whose cancel is asked for as it settles ends cancelled, not waiting (nor failed to
    // be retried); one that succeeded keeps its success.
    let waits = running_run(s, "c").await;
    let done = running_run(s, "c").await;
    for r in [&waits, &done] {
        assert!(s.request_cancel(&r.id, "asked late").await.expect("ask"));
    }
    let ends = [end(&waits.id, RunStatus::WaitingApproval), end(&done.id, RunStatus::Succeeded)];
    assert_eq!(s.finish_many(&ends, t).await.expect("end"), std::slice::from_ref(&done.id), "only the success is recorded as asked");
    let w = s.get_run(&waits.id).await.expect("get").expect("run");
    assert_eq!((w.status, w.error.as_deref(), w.finished_at.is_some()), (RunStatus::Cancelled, Some("asked late"), true));
    assert_eq!(status(s, &done.id).await, RunStatus::Succeeded);
    // A run whose worker is gone before it heard of the cancel is cancelled by the takeover,
    // not retried.
    let gone = running_run(s, "c").await;
    assert!(s.request_cancel(&gone.id, "asked by bo").await.expect("ask"));
    s.release(&me()).await.expect("the worker goes");
    let taken = s.recover(None, t).await.expect("recover");
    assert_eq!(taken.iter().map(|r| (r.id.as_str(), r.status)).collect::<Vec<_>>(), [(gone.id.as_str(), RunStatus::Cancelled)]);
    assert_eq!(s.get_run(&gone.id).await.expect("get").expect("run").error.as_deref(), Some("asked by bo"));
    assert!(s.interrupted_without_follow_up().await.expect("read").is_empty(), "nothing to retry");
}

async fn change(s: &dyn RunStore, name: &str, change: Change<'_>, actor: &str, at: DateTime<Utc>) -> Result<Changed, Refused> {
    s.change_job(&ChangeRequest { name, change, actor }, at).await.expect("change")
}

async fn runtime_jobs_keep_versions_history_and_refuse_stale_changes(s: &dyn RunStore) {
    let t = t0();
    let v1 = serde_json::json!({"cron": "30 7 * * 1-5", "workflow": "digest"});
    let v2 = serde_json::json!({"cron": "0 8 * * 1-5", "workflow": "digest"});
    let create = |d| Change::Create { definition: d, max_jobs: 2 };
    let Ok(Changed::Saved(a)) = change(s, "a", create(&v1), "ana", t).await else { panic!("created") };
    assert_eq!((a.version, a.created_by.as_str(), a.created_at, a.definition.clone()), (1, "ana", t, v1.clone()));
    assert_eq!(change(s, "a", create(&v2), "bo", t).await, Err(Refused::Exists { version: 1 }));
    // Stale and missing changes change nothing.
    let stale = change(s, "a", Change::Update { definition: &v2, expected: Some(7) }, "bo", t).await;
    assert_eq!(stale, Err(Refused::Stale { expected: 7, current: 1 }));
    assert_eq!(change(s, "nope", Change::Delete { expected: None }, "bo", t).await, Err(Refused::Missing));
    let Ok(Changed::Saved(b)) = change(s, "a", Change::Update { definition: &v2, expected: Some(1) }, "bo", t + secs(5)).await else {
        panic!("updated")
    };
    assert_eq!((b.version, b.created_by.as_str(), b.updated_by.as_str(), b.updated_at), (2, "ana", "bo", t + secs(5)));
    assert_eq!(s.runtime_job("a").await.expect("read"), Some(b.clone()));
    // The limit counts the jobs there are.
    assert!(change(s, "b", create(&v1), "ana", t).await.is_ok());
    assert_eq!(change(s, "c", create(&v1), "ana", t).await, Err(Refused::Full { max: 2 }));
    assert_eq!(s.runtime_jobs().await.expect("all").iter().map(|j| j.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    // A pause and a last tick of the job are dropped with it: a name created again starts afresh,
    // and continues the version count.
    s.set_paused("a", true, Some("x"), t).await.expect("pause");
    s.set_last_tick("a", t).await.expect("tick");
    assert_eq!(change(s, "a", Change::Delete { expected: Some(2) }, "cy", t + secs(9)).await, Ok(Changed::Deleted { version: 3 }));
    assert_eq!(s.runtime_job("a").await.expect("read"), None);
    let Ok(Changed::Saved(again)) = change(s, "a", create(&v1), "dee", t + secs(10)).await else { panic!("created again") };
    assert_eq!(again.version, 4);
    assert_eq!(
        s.job_state("a").await.expect("state"),
        JobState { last_tick: Some(t + secs(10)), ..JobState::default() },
        "no pause, and the schedule begins at its creation"
    );
    let history = s.job_history("a", 10).await.expect("history");
    let summary: Vec<(u64, &str, &str, bool, bool)> =
        history.iter().map(|h| (h.version, h.action.as_str(), h.actor.as_str(), h.before.is_some(), h.after.is_some())).collect();
    assert_eq!(
        summary,
        [
            (4, "create", "dee", false, true),
            (3, "delete", "cy", true, false),
            (2, "update", "bo", true, true),
            (1, "create", "ana", false, true)
        ]
    );
    assert_eq!((history[2].before.as_ref(), history[2].after.as_ref()), (Some(&v1), Some(&v2)));
    assert_eq!(s.job_history("a", 1).await.expect("history").len(), 1);
}

async fn a_window_knows_which_ticks_have_runs(s: &dyn RunStore) {
    let t = t0();
    s.fire_ticks(vec![(tick("j", t), Overlap::Allow), (tick("j", t + secs(60)), Overlap::Allow)], none(0), t).await.expect("fire");
    s.insert_run(manual("j", t + secs(90)), t).await.expect("manual");
    let found = s.ticks_with_runs("j", t, t + secs(120)).await.expect("ticks");
    assert_eq!(found, [t.timestamp_millis(), (t + secs(60)).timestamp_millis()].into_iter().collect());
    assert!(s.ticks_with_runs("j", t + secs(1), t + secs(59)).await.expect("ticks").is_empty());
    assert!(s.ticks_with_runs("other", t, t + secs(120)).await.expect("ticks").is_empty());
}

/// The `notify:` rules of job `n` in [`outcomes_are_noticed_once_and_notifications_sent_once`].
pub(super) fn no_after(_: &str) -> Vec<super::Downstream> {
    Vec::new()
}

/// `report` runs after `load` alone (on success); `sum` after `a` and `b` within 60 s; `alarm`
/// after `load` on failure.
fn after_of(job: &str) -> Vec<super::Downstream> {
    use lamplighter_config::{After, AfterOn};
    let one = |name: &str, jobs: &[&str], on, within: Option<u64>| super::Downstream {
        after: After { jobs: jobs.iter().map(|j| (*j).to_owned()).collect(), on, within: within.map(Duration::from_secs) },
        run: NewRun {
            input: Some(serde_json::json!({"day": "mon"})),
            ..NewRun::asked(Owner::Job(name.into()), Trigger::After, snapshot(name), t0())
        },
    };
    match job {
        "load" => vec![one("report", &["load"], AfterOn::Success, None), one("alarm", &["load"], AfterOn::Failure, None)],
        "a" => vec![one("sum", &["a", "b"], AfterOn::Success, Some(60))],
        "b" => vec![one("sum", &["a", "b"], AfterOn::Success, Some(60))],
        _ => Vec::new(),
    }
}

/// A job that runs `after` others gets one run per qualifying outcome (per set of them, with
/// several upstream jobs), recorded in the pass that notices the outcome and never again; its
/// input carries the upstream runs'. An outcome that waits out `within` starts nothing, and
/// a paused job's run is recorded as skipped.
async fn jobs_run_after_their_upstream_jobs_once(s: &dyn RunStore) {
    let t = t0();
    let pass = |now| async move { s.notice(&no_rules_fn, &after_of, false, now).await.expect("notice") };
    let last = |id, status| RunEnd { last: true, ..end(id, status) };
    let loads = ticked_runs(s, "load", 5).await;
    s.finish_many(&[RunEnd { output: Some(&serde_json::json!({"rows": 7})), ..last(&loads[0], RunStatus::Succeeded) }], t + secs(5))
        .await
        .expect("end");
    s.finish_many(&[last(&loads[1], RunStatus::Failed)], t + secs(65)).await.expect("end");
    let noticed = pass(t + secs(66)).await;
    let mut started = noticed.started.clone();
    started.sort();
    assert_eq!(started.iter().map(|(j, _)| j.as_str()).collect::<Vec<_>>(), ["alarm", "report"], "{noticed:?}");
    let report = started.iter().find(|(j, _)| j == "report").map(|(_, id)| id.clone()).expect("report");
    let run = s.get_run(&report).await.expect("get").expect("run");
    assert_eq!((run.trigger, run.status), (Trigger::After, RunStatus::Queued));
    assert_eq!(
        run.input,
        Some(serde_json::json!({"day": "mon", "upstream": {"load": {"run_id": loads[0], "status": "succeeded", "output": {"rows": 7}}}})),
        "the job's input, with the upstream run's"
    );
    assert_eq!(pass(t + secs(67)).await.started, Vec::new(), "once per outcome");
    assert!(s.pending_after("report").await.expect("pending").is_empty(), "used");
    // Two outcomes noticed in one pass: two runs, one each.
    s.finish_many(&[last(&loads[3], RunStatus::Succeeded), last(&loads[4], RunStatus::Succeeded)], t + secs(70)).await.expect("end");
    let noticed = pass(t + secs(71)).await;
    let reports: Vec<String> = noticed.started.iter().filter(|(j, _)| j == "report").map(|(_, id)| id.clone()).collect();
    assert_eq!(reports.len(), 2, "{noticed:?}");
    let mut used = Vec::new();
    for id in &reports {
        let run = s.get_run(id).await.expect("get").expect("run");
        used.push(run.input.expect("input")["upstream"]["load"]["run_id"].as_str().expect("an upstream run").to_owned());
    }
    used.sort();
    assert_eq!(used, [loads[3].clone(), loads[4].clone()]);

    // Fan-in: `a` alone waits; `b` within the window starts one run using both.
    let a = ticked_runs(s, "a", 2).await;
    let b = ticked_runs(s, "b", 1).await;
    s.finish_many(&[last(&a[0], RunStatus::Succeeded)], t + secs(100)).await.expect("end");
    assert!(pass(t + secs(101)).await.started.is_empty(), "waits for b");
    let pending = s.pending_after("sum").await.expect("pending");
    assert_eq!(pending.iter().map(|p| (p.upstream.as_str(), p.run_id.as_str())).collect::<Vec<_>>(), [("a", a[0].as_str())]);
    s.finish_many(&[last(&b[0], RunStatus::Succeeded)], t + secs(130)).await.expect("end");
    let noticed = pass(t + secs(131)).await;
    assert_eq!(noticed.started.len(), 1, "{noticed:?}");
    let sum = s.get_run(&noticed.started[0].1).await.expect("get").expect("run");
    let upstream = &sum.input.as_ref().expect("input")["upstream"];
    assert_eq!((upstream["a"]["run_id"].as_str(), upstream["b"]["run_id"].as_str()), (Some(a[0].as_str()), Some(b[0].as_str())));
    // `a` again, and `b` only after the window: nothing, and a's outcome is dropped.
    s.finish_many(&[last(&a[1], RunStatus::Succeeded)], t + secs(200)).await.expect("end");
    assert!(pass(t + secs(201)).await.started.is_empty());
    let at = t + secs(240);
    let out = s.fire_ticks(vec![(tick("b", at), Overlap::Allow)], none(1), at).await.expect("fire");
    let b2 = [out.into_iter().next().flatten().and_then(|o| o.handed).expect("handed").run.id];
    s.finish_many(&[last(&b2[0], RunStatus::Succeeded)], t + secs(300)).await.expect("end");
    assert!(pass(t + secs(301)).await.started.is_empty(), "a's outcome waited out its 60 s");
    let pending = s.pending_after("sum").await.expect("pending");
    assert_eq!(pending.iter().map(|p| p.run_id.as_str()).collect::<Vec<_>>(), [b2[0].as_str()], "only b's new outcome waits");

    // Paused: the outcome is used, and the run recorded as skipped, saying why.
    s.set_paused("report", true, Some("audit"), t).await.expect("pause");
    s.finish_many(&[last(&loads[2], RunStatus::Succeeded)], t + secs(400)).await.expect("end");
    assert!(pass(t + secs(401)).await.started.is_empty(), "nothing to run");
    let skipped = s
        .list_runs(&super::RunFilter { job: Some("report".into()), ..Default::default() })
        .await
        .expect("runs")
        .into_iter()
        .find(|r| r.status == RunStatus::Skipped)
        .expect("a skipped run");
    assert!(skipped.error.as_deref().is_some_and(|e| e.contains("job paused (audit)")), "{skipped:?}");
}

/// A manual run of `job` taking `limits` (name, key template), queued at `at`.
fn limited(job: &str, limits: &[(&str, Option<&str>)], input: serde_json::Value, at: DateTime<Utc>) -> NewRun {
    let limits = limits.iter().map(|(n, k)| lamplighter_config::LimitUse { name: (*n).into(), key: k.map(str::to_owned) }).collect();
    NewRun { input: Some(input), snapshot: Some(JobSnapshot { limits, ..snapshot("a") }), ..manual(job, at) }
}

/// A due run that needs no hand-over decision (in no limit, of a job whose runs need not go one
/// at a time) is in the queue from its insert where the queue is the runs' rows: no scheduler
/// reads it as due, and a claim takes it. Elsewhere, and for runs that need a decision (one at
/// a time, not due yet), the hand-over reads it as due, as before.
async fn a_run_that_needs_no_decision_is_queued_by_its_insert(s: &dyn RunStore) {
    let t = t0();
    let free = s.insert_run(NewRun { in_line: true, ..manual("load", t) }, t).await.expect("insert").0;
    let one_at_a_time = s.insert_run(manual("queue", t), t).await.expect("insert").0;
    let later = s.insert_run(NewRun { in_line: true, due_at: t + secs(30), ..manual("load", t) }, t).await.expect("insert").0;
    let due: Vec<String> = s.due_undispatched(t + secs(1)).await.expect("due").into_iter().map(|d| d.id).collect();
    let taken = s.claim_queued(10, ME, t + secs(1)).await.expect("claim");
    let claimed: Vec<String> = taken.runs.into_iter().map(|h| h.run.id).collect();
    if s.queued_by_insert() {
        assert_eq!(due, [one_at_a_time.as_str()], "the free run is not read as due: it is in the queue");
        assert_eq!(claimed, [free.as_str()], "a claim takes it straight from its insert");
    } else {
        assert_eq!(due, [free.clone(), one_at_a_time.clone()], "both are left to the hand-over");
        assert!(claimed.is_empty(), "nothing is in the queue before the hand-over: {claimed:?}");
    }
    assert!(!due.contains(&later) && !claimed.contains(&later), "a run not due yet waits for the hand-over at its time");
    let due: Vec<String> = s.due_undispatched(t + secs(30)).await.expect("due").into_iter().map(|d| d.id).collect();
    assert!(due.contains(&later), "due at its time, it is read as due: {due:?}");
}

/// A limited run whose job's runs need not go one at a time waits in its pool's line from its
/// insert: it is never read as due, a hand-over that looks at the waiters admits it in line
/// with the runs the due pass brings (first come, first served across both), and its wait is
/// measured from the insert. One that is not due yet is not in line until it falls due.
async fn limited_runs_wait_in_line_from_their_insert(s: &dyn RunStore) {
    use crate::store::LimitPass;
    let t = t0();
    let sizes: crate::limits::Sizes = [("db".to_string(), 1)].into();
    let lined = |at| NewRun { in_line: true, ..limited("load", &[("db", None)], serde_json::json!({}), at) };
    let first = s.insert_run(lined(t), t).await.expect("insert").0;
    let marked = s.insert_run(limited("load", &[("db", None)], serde_json::json!({}), t + secs(1)), t + secs(1)).await.expect("insert").0;
    let later = s.insert_run(NewRun { due_at: t + secs(30), ..lined(t + secs(2)) }, t + secs(2)).await.expect("insert").0;
    let waiting = s.get_run(&first).await.expect("get").expect("run").limit_wait;
    assert_eq!(waiting.map(|w| (w.pool.encode(), w.since)), Some(("db".into(), Some(t))), "in line from its insert");
    assert_eq!(s.get_run(&later).await.expect("get").expect("run").limit_wait, None, "not due: not in line yet");
    let due = s.due_undispatched(t + secs(3)).await.expect("due");
    assert_eq!(due.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), [marked.as_str()], "a run in line is not read as due");
    // A worker without a live lease admits the head but cannot claim it: it stays in line and
    // is told as waiting, so that the lines are looked at again (nothing else would find it).
    let pass = LimitPass { due: &[], sizes: &sizes, waiters: true, freed: &[], spare: 5 };
    let done = s.hand_over(&[], &[], pass, "no-lease", t + secs(3)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.pushed), (0, 0));
    assert_eq!(done.waiting, 1, "the head it could not claim still waits: {done:?}");
    let pass = LimitPass { due: &due, sizes: &sizes, waiters: true, freed: &[], spare: 5 };
    let done = s.hand_over(&[], &[], pass, ME, t + secs(3)).await.expect("hand over");
    assert_eq!(done.claimed.iter().map(|h| h.run.id.as_str()).collect::<Vec<_>>(), [first.as_str()], "the first in line gets the slot");
    assert_eq!(done.waiting, 1);
    assert_eq!(done.waited, vec![("db".to_string(), Duration::from_secs(3))], "it waited from its insert");
    // Its end hands the slot to the run the due pass marked, which was next in line.
    s.finish_many(&[end(&first, RunStatus::Succeeded)], t + secs(10)).await.expect("end");
    let pass = LimitPass { due: &[], sizes: &sizes, waiters: true, freed: &[], spare: 5 };
    let done = s.hand_over(&[], &[], pass, ME, t + secs(11)).await.expect("hand over");
    assert_eq!(done.claimed.iter().map(|h| h.run.id.as_str()).collect::<Vec<_>>(), [marked.as_str()]);
    // Due at 30 s, the later one is read as due then, and waits behind the holder.
    assert!(s.due_undispatched(t + secs(29)).await.expect("due").is_empty());
    let due = s.due_undispatched(t + secs(30)).await.expect("due");
    assert_eq!(due.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), [later.as_str()]);
    let pass = LimitPass { due: &due, sizes: &sizes, waiters: true, freed: &[], spare: 5 };
    let done = s.hand_over(&[], &[], pass, ME, t + secs(30)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.waiting), (0, 1));

    // A pool of more slots than a pass reads of its line: a pass that admits all it read says
    // more may wait, and the next reads on.
    let wide: crate::limits::Sizes = [("wide".to_string(), 2000), ("db".to_string(), 1)].into();
    for i in 0..1001 {
        let at = t + secs(40) + Duration::from_millis(i);
        let run = NewRun { in_line: true, ..limited("fan", &[("wide", None)], serde_json::json!({}), at) };
        s.insert_run(run, at).await.expect("insert");
    }
    let pass = LimitPass { due: &[], sizes: &wide, waiters: true, freed: &[], spare: 0 };
    let done = s.hand_over(&[], &[], pass, ME, t + secs(50)).await.expect("hand over");
    assert_eq!((done.pushed, done.waiting, done.unserved), (1000, 1, true), "a pass's worth, and more may wait (db's waits on)");
    let done = s.hand_over(&[], &[], pass, ME, t + secs(51)).await.expect("hand over");
    assert_eq!((done.pushed, done.unserved), (1, false), "the last");
}

/// Limits: the runs that take a slot are admitted in line up to each limit (per key of a keyed
/// one), the others wait (out of the due runs, shown waiting); a slot is freed by its run's
/// end or by the takeover of its worker, never earlier; a removed limit holds nobody back.
async fn limits_admit_in_line_and_free_slots_with_their_runs(s: &dyn RunStore) {
    use crate::limits::Pool;
    use crate::store::LimitPass;
    let t = t0();
    let sizes: crate::limits::Sizes = [("warehouse".to_string(), 1), ("tenant".to_string(), 1)].into();
    fn pass<'a>(due: &'a [crate::store::Due], sizes: &'a crate::limits::Sizes, waiters: bool) -> LimitPass<'a> {
        LimitPass { due, sizes, waiters, freed: &[], spare: 5 }
    }
    let mut ids = Vec::new();
    for i in 0..3 {
        let (id, _) =
            s.insert_run(limited("etl", &[("warehouse", None)], serde_json::json!({}), t + secs(i)), t + secs(i)).await.expect("insert");
        ids.push(id);
    }
    let free = s.insert_run(manual("free", t + secs(3)), t + secs(3)).await.expect("insert").0;
    let due = s.due_undispatched(t + secs(3)).await.expect("due");
    assert_eq!(due.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), [ids[0].as_str(), &ids[1], &ids[2], &free]);
    assert!(due[3].pools.is_empty() && due[0].pools == [Pool { name: "warehouse".into(), key: String::new() }]);
    let done = s.hand_over(std::slice::from_ref(&free), &[], pass(&due[..3], &sizes, false), ME, t + secs(3)).await.expect("hand over");
    let mut claimed: Vec<&str> = done.claimed.iter().map(|h| h.run.id.as_str()).collect();
    claimed.sort();
    assert_eq!((claimed, done.waiting), (vec![ids[0].as_str(), free.as_str()], 2), "the first in line gets the one slot");
    assert!(s.due_undispatched(t + secs(3)).await.expect("due").is_empty(), "waiting runs are not due");
    let waiting = s.get_run(&ids[1]).await.expect("get").expect("run");
    assert_eq!(waiting.status, RunStatus::Queued);
    assert_eq!(waiting.limit_wait.map(|w| (w.pool.encode(), w.since)), Some(("warehouse".into(), Some(t + secs(3)))));
    let pools = s.pools().await.expect("pools");
    assert_eq!(pools.len(), 1);
    assert_eq!((&pools[0].holders, &pools[0].waiting), (&vec![ids[0].clone()], &vec![ids[1].clone(), ids[2].clone()]));
    assert_eq!((pools[0].waiting_count, pools[0].oldest_wait), (2, Some(t + secs(3))));
    // Nothing freed: nothing admitted, however often asked.
    let done = s.hand_over(&[], &[], pass(&[], &sizes, true), ME, t + secs(4)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.pushed, done.waiting), (0, 0, 2), "the line is read (its slots and one more), and waits");
    // Its end frees the slot: the next in line, and only it, gets it (through the queue once
    // the caller's slots are used).
    s.finish_many(&[end(&ids[0], RunStatus::Succeeded)], t + secs(10)).await.expect("end");
    let done = s.hand_over(&[], &[], LimitPass { spare: 0, ..pass(&[], &sizes, true) }, ME, t + secs(12)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.pushed, done.waiting), (0, 1, 1));
    assert_eq!(done.waited, vec![("warehouse".to_string(), Duration::from_secs(9))]);
    let taken = s.claim_queued(5, ME, t + secs(12)).await.expect("claim").runs;
    assert_eq!(taken.iter().map(|h| h.run.id.as_str()).collect::<Vec<_>>(), [ids[1].as_str()]);
    assert_eq!(s.get_run(&ids[1]).await.expect("get").expect("run").limit_wait, None, "no longer waiting");

    // Keyed: one slot per tenant.
    let tenant = |name: &str, at| limited("sync", &[("tenant", Some("${input.tenant}"))], serde_json::json!({"tenant": name}), at);
    let mut keyed = Vec::new();
    for (i, name) in ["acme", "acme", "bolt"].into_iter().enumerate() {
        keyed.push(s.insert_run(tenant(name, t + secs(20 + i as i64)), t + secs(20)).await.expect("insert").0);
    }
    let due = s.due_undispatched(t + secs(30)).await.expect("due");
    let done = s.hand_over(&[], &[], pass(&due, &sizes, false), ME, t + secs(30)).await.expect("hand over");
    let mut claimed: Vec<String> = done.claimed.iter().map(|h| h.run.id.clone()).collect();
    claimed.sort();
    let mut expected = vec![keyed[0].clone(), keyed[2].clone()];
    expected.sort();
    assert_eq!(claimed, expected, "acme's first and bolt's");
    let acme = s.get_run(&keyed[1]).await.expect("get").expect("run");
    assert_eq!(acme.limit_wait.map(|w| w.pool), Some(Pool { name: "tenant".into(), key: "acme".into() }));

    // The worker dies: its slots stay held until the takeover, then go to the waiters.
    s.release(&me()).await.expect("release");
    let done = s.hand_over(&[], &[], pass(&[], &sizes, true), "worker-b", t + secs(40)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.pushed, done.waiting), (0, 0, 2), "a dead worker's slots are held until its takeover");
    let orphans = s.recover(Some("worker-b"), t + secs(41)).await.expect("recover");
    assert_eq!(orphans.len(), 4, "free, warehouse's, acme's and bolt's: {orphans:?}");
    let done = s.hand_over(&[], &[], LimitPass { spare: 0, ..pass(&[], &sizes, true) }, "worker-b", t + secs(42)).await.expect("hand over");
    assert_eq!((done.pushed, done.waiting), (2, 0), "the takeover freed warehouse and acme's slot");

    // A limit removed by a reload holds nobody back.
    let (gone, _) =
        s.insert_run(limited("etl", &[("warehouse", None)], serde_json::json!({}), t + secs(50)), t + secs(50)).await.expect("insert");
    let (held, _) =
        s.insert_run(limited("etl", &[("warehouse", None)], serde_json::json!({}), t + secs(51)), t + secs(51)).await.expect("insert");
    let due = s.due_undispatched(t + secs(52)).await.expect("due");
    assert_eq!(due.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), [gone.as_str(), held.as_str()]);
    let done = s.hand_over(&[], &[], pass(&due, &sizes, false), ME, t + secs(52)).await.expect("hand over");
    assert_eq!(done.waiting, 2, "warehouse's slot is held by the run handed to the queue at 42 s");
    assert!(s.due_undispatched(t + secs(52)).await.expect("due").is_empty());
    let none = crate::limits::Sizes::new();
    let done =
        s.hand_over(&[], &[], LimitPass { sizes: &none, spare: 0, ..pass(&[], &sizes, true) }, ME, t + secs(53)).await.expect("hand over");
    assert_eq!((done.pushed, done.waiting), (2, 0));

    // An end admits the next in line in its own write, into the slot it frees.
    take_lease(s).await;
    let sizes: crate::limits::Sizes = [("gpu".to_string(), 1)].into();
    let mut gpu = Vec::new();
    for i in 0..2 {
        let at = t + secs(60 + i);
        gpu.push(s.insert_run(limited("train", &[("gpu", None)], serde_json::json!({}), at), at).await.expect("insert").0);
    }
    let due = s.due_undispatched(t + secs(62)).await.expect("due");
    let done = s.hand_over(&[], &[], pass(&due, &sizes, false), ME, t + secs(62)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.waiting), (1, 1));
    let freed = [Pool { name: "gpu".into(), key: String::new() }];
    let limits = LimitPass { due: &[], sizes: &sizes, waiters: false, freed: &freed, spare: 1 };
    let (ended, taken) =
        s.finish_and_admit(&[end(&gpu[0], RunStatus::Succeeded)], limits, 1, ME, t + secs(70)).await.expect("end and admit");
    assert_eq!(ended, [gpu[0].clone()]);
    assert_eq!(
        (taken.admitted, taken.pushed, taken.runs.iter().map(|h| h.run.id.as_str()).collect::<Vec<_>>()),
        (1, 0, vec![gpu[1].as_str()])
    );
    assert_eq!(status(s, &gpu[1]).await, RunStatus::Running, "claimed into the slot the end freed");
    assert_eq!(taken.waited, vec![("gpu".to_string(), Duration::from_secs(8))], "it waited from 62 s to 70 s");
    // The slot handed on is held (on PostgreSQL in the head's own row, not a slot row): listed,
    // counted by an admission (a run due now waits behind it), and handed on by its end.
    gpu.push(s.insert_run(limited("train", &[("gpu", None)], serde_json::json!({}), t + secs(70)), t + secs(70)).await.expect("insert").0);
    let due = s.due_undispatched(t + secs(70)).await.expect("due");
    let done = s.hand_over(&[], &[], pass(&due, &sizes, false), ME, t + secs(70)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.waiting), (0, 1), "gpu's one slot is held by the run the end handed it to");
    let pool = s.pools().await.expect("pools").into_iter().find(|p| p.pool.name == "gpu").expect("gpu listed");
    assert_eq!((pool.holders, pool.waiting), (vec![gpu[1].clone()], vec![gpu[2].clone()]));
    let (_, taken) = s.finish_and_admit(&[end(&gpu[1], RunStatus::Succeeded)], limits, 1, ME, t + secs(71)).await.expect("end and admit");
    assert_eq!(taken.runs.iter().map(|h| h.run.id.as_str()).collect::<Vec<_>>(), [gpu[2].as_str()]);
    let pool = s.pools().await.expect("pools").into_iter().find(|p| p.pool.name == "gpu").expect("gpu listed");
    assert_eq!((pool.holders, pool.waiting_count), (vec![gpu[2].clone()], 0), "one holder, the last run handed the slot");
    // A workflow step that held that slot gives it back when it ends (the run goes on): the
    // pool has no holder left, however the slot was held.
    s.release_limits(&gpu[2], &[], &freed).await.expect("release");
    let holders = s.pools().await.expect("pools").into_iter().find(|p| p.pool.name == "gpu").map(|p| p.holders).unwrap_or_default();
    assert_eq!(holders, Vec::<String>::new(), "a step's slot handed by an end is freed with the step");

    // A slot handed on keeps a lowered limit: the end of one of two holders of a limit
    // lowered to 1 hands nothing on; the second end does.
    let (two, one): (crate::limits::Sizes, crate::limits::Sizes) = ([("cpu".to_string(), 2)].into(), [("cpu".to_string(), 1)].into());
    let mut cpu = Vec::new();
    for i in 0..3 {
        let at = t + secs(71 + i);
        cpu.push(s.insert_run(limited("build", &[("cpu", None)], serde_json::json!({}), at), at).await.expect("insert").0);
    }
    let due = s.due_undispatched(t + secs(74)).await.expect("due");
    let done = s.hand_over(&[], &[], pass(&due, &two, false), ME, t + secs(74)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.waiting), (2, 1));
    let freed = [Pool { name: "cpu".into(), key: String::new() }];
    let lowered = LimitPass { due: &[], sizes: &one, waiters: false, freed: &freed, spare: 1 };
    let (_, taken) = s.finish_and_admit(&[end(&cpu[0], RunStatus::Succeeded)], lowered, 1, ME, t + secs(75)).await.expect("end");
    assert_eq!(taken.admitted, 0, "one holder is left, as many as the lowered limit");
    let (_, taken) = s.finish_and_admit(&[end(&cpu[1], RunStatus::Succeeded)], lowered, 1, ME, t + secs(76)).await.expect("end");
    assert_eq!(taken.runs.iter().map(|h| h.run.id.as_str()).collect::<Vec<_>>(), [cpu[2].as_str()]);

    // A run of two limits gets in only when both have a slot: the one its end frees is not
    // enough while the other is full (every pool a run of the line takes is locked and
    // counted, not only the one it waits on).
    let sizes: crate::limits::Sizes = [("disk".to_string(), 1), ("net".to_string(), 1)].into();
    let [disk, net] = [Pool { name: "disk".into(), key: String::new() }, Pool { name: "net".into(), key: String::new() }];
    let taking = |job: &str, pools: &[(&'static str, Option<&'static str>)], at| limited(job, pools, serde_json::json!({}), at);
    let backup = s.insert_run(taking("backup", &[("disk", None)], t + secs(80)), t + secs(80)).await.expect("insert").0;
    let upload = s.insert_run(taking("upload", &[("net", None)], t + secs(81)), t + secs(81)).await.expect("insert").0;
    let mirror = s.insert_run(taking("mirror", &[("disk", None), ("net", None)], t + secs(82)), t + secs(82)).await.expect("insert").0;
    let due = s.due_undispatched(t + secs(83)).await.expect("due");
    assert_eq!(due.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), [backup.as_str(), &upload, &mirror]);
    let done = s.hand_over(&[], &[], pass(&due, &sizes, false), ME, t + secs(83)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.waiting), (2, 1));
    let waits_on = |id: String| async move { s.get_run(&id).await.expect("get").expect("run").limit_wait.map(|w| w.pool.name) };
    assert_eq!(waits_on(mirror.clone()).await.as_deref(), Some("disk"), "the first of its pools that is full");
    fn freeing<'a>(freed: &'a [Pool], sizes: &'a crate::limits::Sizes) -> LimitPass<'a> {
        LimitPass { due: &[], sizes, waiters: false, freed, spare: 1 }
    }
    let (ended, taken) = s
        .finish_and_admit(&[end(&backup, RunStatus::Succeeded)], freeing(std::slice::from_ref(&disk), &sizes), 1, ME, t + secs(90))
        .await
        .expect("end and admit");
    assert_eq!((ended, taken.admitted), (vec![backup.clone()], 0), "disk is free, net is not");
    assert_eq!(status(s, &mirror).await, RunStatus::Queued);
    assert_eq!(waits_on(mirror.clone()).await.as_deref(), Some("net"), "it waits on net now");
    let (_, taken) = s
        .finish_and_admit(&[end(&upload, RunStatus::Succeeded)], freeing(std::slice::from_ref(&net), &sizes), 1, ME, t + secs(95))
        .await
        .expect("end and admit");
    assert_eq!(
        taken.runs.iter().map(|h| (h.run.id.as_str(), h.run.pools.clone())).collect::<Vec<_>>(),
        [(mirror.as_str(), vec![disk.clone(), net.clone()])]
    );

    // A workflow step's limits: given back when the step ends (the run keeps its own), and
    // waited for in line again by the run queued anew, which gives its own slots back
    // meanwhile.
    s.release_limits(&mirror, std::slice::from_ref(&disk), std::slice::from_ref(&net)).await.expect("release");
    let held = |name: &'static str| async move {
        s.pools().await.expect("pools").into_iter().find(|p| p.pool.name == name).map(|p| p.holders).unwrap_or_default()
    };
    assert_eq!((held("disk").await, held("net").await), (vec![mirror.clone()], vec![]), "net's slot is free, disk's still held");
    let upload = s.insert_run(taking("upload", &[("net", None)], t + secs(100)), t + secs(100)).await.expect("insert").0;
    let due = s.due_undispatched(t + secs(100)).await.expect("due");
    let done = s.hand_over(&[], &[], pass(&due, &sizes, false), ME, t + secs(100)).await.expect("hand over");
    assert_eq!(done.claimed.iter().map(|h| h.run.id.as_str()).collect::<Vec<_>>(), [upload.as_str()]);
    let both = crate::limits::stored(&[disk.clone(), net.clone()]);
    let requeue = RunEnd { limits: both.as_deref(), ..end(&mirror, RunStatus::Queued) };
    assert_eq!(s.finish_many(&[requeue], t + secs(110)).await.expect("requeue"), std::slice::from_ref(&mirror));
    let due = s.due_undispatched(t + secs(110)).await.expect("due");
    assert_eq!(
        due.iter().map(|d| (d.id.as_str(), d.pools.clone())).collect::<Vec<_>>(),
        [(mirror.as_str(), vec![disk.clone(), net.clone()])],
        "due again, undispatched, for both"
    );
    let done = s.hand_over(&[], &[], pass(&due, &sizes, false), ME, t + secs(110)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.waiting), (0, 1));
    assert_eq!(held("disk").await, Vec::<String>::new(), "a run queued again holds no slot");
    assert_eq!(waits_on(mirror.clone()).await.as_deref(), Some("net"));
    let (_, taken) = s
        .finish_and_admit(&[end(&upload, RunStatus::Succeeded)], freeing(std::slice::from_ref(&net), &sizes), 1, ME, t + secs(120))
        .await
        .expect("end and admit");
    let resumed = taken.runs.iter().find(|h| h.run.id == mirror).expect("admitted again");
    assert!(resumed.resumed, "it resumes where it stopped (its first start kept)");

    // A removed limit's line longer than a pass reads is served over several passes, each
    // saying more waits.
    let quota: crate::limits::Sizes = [("quota".to_string(), 1)].into();
    for i in 0..1002 {
        let at = t + secs(130) + Duration::from_millis(i);
        s.insert_run(limited("call", &[("quota", None)], serde_json::json!({}), at), at).await.expect("insert");
    }
    let due = s.due_undispatched(t + secs(140)).await.expect("due");
    assert_eq!(due.len(), 1002);
    let done = s.hand_over(&[], &[], pass(&due, &quota, false), ME, t + secs(140)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.waiting, done.unserved), (1, 1001, false));
    let none = crate::limits::Sizes::new();
    let removed = LimitPass { due: &[], sizes: &none, waiters: true, freed: &[], spare: 0 };
    let done = s.hand_over(&[], &[], removed, ME, t + secs(141)).await.expect("hand over");
    assert_eq!((done.pushed, done.waiting, done.unserved), (1000, 0, true), "a pass's worth, and more waits");
    let done = s.hand_over(&[], &[], removed, ME, t + secs(142)).await.expect("hand over");
    assert_eq!((done.pushed, done.unserved), (1, false), "the last");

    // Two ends in one write: one pool's slot is handed on to its line's head, the other's line
    // starts with a run of both limits, left to the admission, which counts the head just
    // given the first slot as its holder (a run admitted into both would be its second).
    let sizes: crate::limits::Sizes = [("p1".to_string(), 1), ("q1".to_string(), 1)].into();
    let mut runs = Vec::new();
    for (i, pools) in [&[("p1", None)][..], &[("q1", None)], &[("q1", None), ("p1", None)], &[("p1", None)]].into_iter().enumerate() {
        let at = t + secs(150 + i as i64);
        runs.push(s.insert_run(limited("both", pools, serde_json::json!({}), at), at).await.expect("insert").0);
    }
    let due = s.due_undispatched(t + secs(160)).await.expect("due");
    let done = s.hand_over(&[], &[], pass(&due, &sizes, false), ME, t + secs(160)).await.expect("hand over");
    assert_eq!((done.claimed.len(), done.waiting), (2, 2), "p1's and q1's first; the run of both and p1's second wait");
    assert_eq!(waits_on(runs[2].clone()).await.as_deref(), Some("q1"));
    let both_freed = [Pool { name: "p1".into(), key: String::new() }, Pool { name: "q1".into(), key: String::new() }];
    let limits = LimitPass { due: &[], sizes: &sizes, waiters: false, freed: &both_freed, spare: 2 };
    let ends = [end(&runs[0], RunStatus::Succeeded), end(&runs[1], RunStatus::Succeeded)];
    let (_, taken) = s.finish_and_admit(&ends, limits, 0, ME, t + secs(170)).await.expect("end and admit");
    assert_eq!(taken.runs.iter().map(|h| h.run.id.as_str()).collect::<Vec<_>>(), [runs[3].as_str()], "p1's head, and only it");
    assert_eq!(status(s, &runs[2]).await, RunStatus::Queued, "the run of both waits for p1");
    assert_eq!(held("p1").await, vec![runs[3].clone()]);
}

fn no_rules_fn(_: &str) -> Option<Vec<lamplighter_config::NotifyRule>> {
    None
}

/// Job `q` is configured, with no rules.
pub(super) fn no_rules_of_q(job: &str) -> Option<Vec<lamplighter_config::NotifyRule>> {
    (job == "q").then(Vec::new)
}

fn rules_of_n(job: &str) -> Option<Vec<lamplighter_config::NotifyRule>> {
    use lamplighter_config::{NotifyOn, NotifyRule, NotifyTarget};
    let to = NotifyTarget::Workflow("page".into());
    (job == "n").then(|| {
        vec![
            NotifyRule { on: NotifyOn::Failure, after_consecutive: 2, to: to.clone() },
            NotifyRule { on: NotifyOn::Recovery, after_consecutive: 2, to: to.clone() },
            NotifyRule { on: NotifyOn::ApprovalWaiting, after_consecutive: 1, to },
        ]
    })
}

async fn outcomes_are_noticed_once_and_notifications_sent_once(s: &dyn RunStore) {
    use crate::notify::{NotificationStatus, Sent};
    let t = t0();
    let ids = ticked_runs(s, "n", 4).await;
    // Failed (no retry), failed with a retry to come, succeeded; the fourth still runs.
    let last = |id, status| RunEnd { last: true, ..end(id, status) };
    s.finish_many(&[last(&ids[0], RunStatus::Failed)], t + secs(10)).await.expect("end");
    s.finish_many(&[end(&ids[1], RunStatus::TimedOut)], t + secs(70)).await.expect("end");
    let pass = |now| async move { s.notice(&rules_of_n, &no_after, false, now).await.expect("notice") };
    let noticed = pass(t + secs(71)).await;
    assert_eq!((noticed.runs, noticed.recorded), (1, 0), "one failure so far; the second waits for its retry");
    assert_eq!(noticed.recheck_at, Some(t + secs(70) + crate::decide::RETRY_RECORDED_WITHIN), "looked at again when its retry is overdue");
    // A worker that restarts under its name hands back what its predecessor left mid-send.
    assert_eq!(s.release_claims(ME, t).await.expect("release"), 0);
    // Its retry fails too, as its last attempt: the second failure in a row.
    let failed = s.get_run(&ids[1]).await.expect("get").expect("run");
    let retry = s.follow_up(&failed, t + secs(80), t + secs(71)).await.expect("follow up").expect("retry");
    let handed = s.dispatch(std::slice::from_ref(&retry), &[], ME, t + secs(80)).await.expect("claim");
    assert_eq!(handed.len(), 1);
    s.finish_many(&[last(&retry, RunStatus::Failed)], t + secs(90)).await.expect("end");
    s.finish_many(&[last(&ids[2], RunStatus::Succeeded)], t + secs(130)).await.expect("end");
    let noticed = pass(t + secs(131)).await;
    assert_eq!((noticed.runs, noticed.recorded), (3, 2), "the retried attempt, its retry (failure 2 of 2) and the recovery");
    assert_eq!(pass(t + secs(132)).await, super::Noticed::default(), "noticed once");
    let health = s.job_health().await.expect("health");
    let n = &health["n"];
    assert_eq!((n.consecutive_failures, n.last_success, n.oldest_running), (0, Some(t + secs(130)), Some(t + secs(180))));

    let failure = s.notifications(&ids[1]).await.expect("read");
    assert_eq!(failure.len(), 1);
    assert_eq!(
        (failure[0].event.as_str(), failure[0].status, failure[0].run_id.as_str()),
        ("failure", NotificationStatus::Pending, retry.as_str())
    );
    assert_eq!(failure[0].key, format!("{}/failure/0", ids[1]));
    // A job's notifications reach a receiver in the order recorded, one at a time: the
    // recovery waits behind the failure (claimed once), its failed send and its retry.
    let now = t + secs(140);
    let hold = Duration::from_secs(60);
    let events = |claimed: &[crate::notify::Claimed]| claimed.iter().map(|c| c.event.clone()).collect::<Vec<_>>();
    let claimed = s.claim_notifications(ME, 10, hold, now).await.expect("claim");
    assert_eq!(events(&claimed), ["failure"], "the first of the line only");
    assert_eq!(claimed[0].payload["consecutive_failures"], 2);
    let a = &claimed[0];
    assert!(s.claim_notifications("worker-b", 10, hold, now).await.expect("claim").is_empty(), "claimed once; the recovery waits");
    assert_eq!(s.release_claims("worker-b", now).await.expect("release"), 0, "only the claimer's own");
    // Only the worker holding it records it.
    s.notification_sent(&a.key, "worker-b", &Sent::Delivered("HTTP 200".into()), now).await.expect("sent");
    s.notification_sent(&a.key, ME, &Sent::Failed { error: "HTTP 503".into(), retry_at: Some(now + secs(1)) }, now).await.expect("failed");
    assert!(s.claim_notifications(ME, 10, hold, now).await.expect("claim").is_empty(), "the recovery waits for the failure's retry");
    assert_eq!(s.next_notification().await.expect("next"), Some(now + secs(1)), "the retry is next, not the recovery behind it");
    let again = s.claim_notifications(ME, 10, hold, now + secs(2)).await.expect("claim");
    assert_eq!((again.len(), again[0].key.as_str(), again[0].attempts), (1, a.key.as_str(), 2));
    s.notification_sent(&a.key, ME, &Sent::Delivered("HTTP 204".into()), now + secs(2)).await.expect("sent");
    let b = s.claim_notifications(ME, 10, hold, now + secs(2)).await.expect("claim");
    assert_eq!(events(&b), ["recovery"], "the line moves on once the failure is delivered");
    s.notification_sent(&b[0].key, ME, &Sent::Failed { error: "HTTP 404".into(), retry_at: None }, now + secs(2)).await.expect("given up");
    assert_eq!(s.next_notification().await.expect("next"), None);
    let mut statuses: Vec<(String, NotificationStatus, Option<String>)> = Vec::new();
    for root in [&ids[1], &ids[2]] {
        statuses.extend(s.notifications(root).await.expect("read").into_iter().map(|n| (n.event, n.status, n.delivered.or(n.error))));
    }
    let expected = vec![
        ("failure".to_owned(), NotificationStatus::Delivered, Some("HTTP 204".to_owned())),
        ("recovery".to_owned(), NotificationStatus::Abandoned, Some("HTTP 404".to_owned())),
    ];
    assert_eq!(statuses, expected);
}

/// A success noticed at its end ([`RunEnd::noticed`]) is never read by a notice pass, and moves
/// its job in the end's own write, whichever write records it (ends alone, with claims, with
/// hand-offs; the worker's row of the job's successes, which the health and the pass fold in):
/// the failure streak ends and the last success moves forward, never back. Its time is the
/// run's own end ([`RunEnd::ended_at`]), which is its `finished_at`, not the write's.
/// A failure marked so, or an end the fence refuses, notices nothing.
async fn successes_noticed_at_their_end_move_their_job_in_the_same_write(s: &dyn RunStore) {
    let t = t0();
    let ids = ticked_runs(s, "q", 7).await;
    let pass = |now| async move { s.notice(&no_rules_of_q, &no_after, false, now).await.expect("notice") };
    let state = || async { s.job_health().await.expect("health").remove("q").map(|h| (h.consecutive_failures, h.last_success)) };
    let finished = |id: &str| {
        let id = id.to_owned();
        async move { s.get_run(&id).await.expect("get").expect("run").finished_at }
    };
    let last = |id, status| RunEnd { last: true, ..end(id, status) };
    // Ended 300 ms before the write that records it.
    let ended = |write: DateTime<Utc>| Some(write - chrono::Duration::milliseconds(300));
    let noticed = |id, write| RunEnd { noticed: true, ended_at: ended(write), ..last(id, RunStatus::Succeeded) };
    s.finish_many(&[last(&ids[0], RunStatus::Failed)], t + secs(10)).await.expect("end");
    assert_eq!(pass(t + secs(11)).await.runs, 1);
    assert_eq!(state().await, Some((1, None)), "one failure");
    assert_eq!(finished(&ids[0]).await, Some(t + secs(10)), "an end that says no time of its own ends at the write");

    let write = t + secs(20);
    assert_eq!(s.finish_many(&[noticed(&ids[1], write)], write).await.expect("end"), std::slice::from_ref(&ids[1]));
    assert_eq!(state().await, Some((0, ended(write))), "the streak ends with the success's own write, at its own end");
    assert_eq!(finished(&ids[1]).await, ended(write), "finished when it ended, not when the write went");
    assert_eq!(s.unnoticed_since().await.expect("unnoticed"), None, "nothing left to notice");
    assert_eq!(pass(t + secs(21)).await, super::Noticed::default(), "no pass reads it");

    let write = t + secs(30);
    let (done, _) = s.finish_and_claim(&[noticed(&ids[2], write)], 1, ME, write).await.expect("end and claim");
    assert_eq!(done, std::slice::from_ref(&ids[2]));
    assert_eq!(state().await, Some((0, ended(write))), "with claims");
    assert_eq!(finished(&ids[2]).await, ended(write), "with claims");
    let sizes = crate::limits::Sizes::new();
    let limits = crate::store::LimitPass { due: &[], sizes: &sizes, waiters: false, freed: &[], spare: 0 };
    let write = t + secs(40);
    let (done, _) = s.finish_and_admit(&[noticed(&ids[3], write)], limits, 0, ME, write).await.expect("end and admit");
    assert_eq!(done, std::slice::from_ref(&ids[3]));
    assert_eq!(state().await, Some((0, ended(write))), "with hand-offs");
    assert_eq!(finished(&ids[3]).await, ended(write), "with hand-offs");
    let t40 = ended(write);

    // A failure marked noticed is still the pass's: it moves the streak there.
    s.finish_many(&[RunEnd { noticed: true, ..last(&ids[4], RunStatus::Failed) }], t + secs(50)).await.expect("end");
    assert_eq!(state().await, Some((0, t40)));
    assert_eq!(pass(t + secs(51)).await.runs, 1);
    assert_eq!(state().await, Some((1, t40)));

    // A success the pass notices after a later one noticed at its end: the last success stays.
    s.finish_many(&[last(&ids[5], RunStatus::Succeeded)], t + secs(60)).await.expect("end");
    s.finish_many(&[noticed(&ids[6], t + secs(70))], t + secs(70)).await.expect("end");
    assert_eq!(pass(t + secs(71)).await.runs, 1);
    assert_eq!(state().await, Some((0, ended(t + secs(70)))), "never moved back");

    // Ended already: the write records nothing and moves nothing.
    assert!(s.finish_many(&[noticed(&ids[0], t + secs(80))], t + secs(80)).await.expect("end").is_empty());
    assert_eq!(state().await, Some((0, ended(t + secs(70)))));
}

/// A success written after failures the pass already counted (its write waited longer, as on
/// another worker whose ends gather) may have ended before some of them: it moves the job's
/// last success and leaves in the streak only the failures that ended after it. A recovery
/// does not fire for it: by the runs' own ends the job is still failing.
async fn a_success_written_after_failures_that_ended_later_leaves_them_in_the_streak(s: &dyn RunStore) {
    use lamplighter_config::{NotifyOn, NotifyRule, NotifyTarget};
    let t = t0();
    let ids = ticked_runs(s, "q", 8).await;
    let pass = |now| async move { s.notice(&no_rules_of_q, &no_after, false, now).await.expect("notice") };
    let state = || async { s.job_health().await.expect("health").remove("q").map(|h| (h.consecutive_failures, h.last_success)) };
    let at = |ms: i64| t + chrono::Duration::milliseconds(ms);
    let ended = |id, status, ms| RunEnd { last: true, ended_at: Some(at(ms)), ..end(id, status) };
    let noticed = |id, ms| RunEnd { noticed: true, ..ended(id, RunStatus::Succeeded, ms) };
    s.finish_many(&[ended(&ids[0], RunStatus::Failed, 9_000), ended(&ids[1], RunStatus::Failed, 10_000)], at(10_010)).await.expect("end");
    assert_eq!(pass(at(10_050)).await.runs, 2);
    assert_eq!(state().await, Some((2, None)), "two failures");

    s.finish_many(&[noticed(&ids[2], 9_900)], at(10_100)).await.expect("end");
    assert_eq!(state().await, Some((1, Some(at(9_900)))), "the failure that ended after it stands, the last success moves");

    s.finish_many(&[ended(&ids[3], RunStatus::Failed, 11_000)], at(11_010)).await.expect("end");
    assert_eq!(pass(at(11_050)).await.runs, 1);
    assert_eq!(state().await, Some((2, Some(at(9_900)))), "the pass folds it the same way, and counts on");

    // A success the pass counts itself, written after a failure that ended later.
    let recovery = |job: &str| {
        (job == "q").then(|| vec![NotifyRule { on: NotifyOn::Recovery, after_consecutive: 1, to: NotifyTarget::Workflow("chat".into()) }])
    };
    s.finish_many(&[ended(&ids[4], RunStatus::Succeeded, 10_900)], at(11_100)).await.expect("end");
    let noticed_late = s.notice(&recovery, &no_after, false, at(11_150)).await.expect("notice");
    assert_eq!((noticed_late.runs, noticed_late.recorded), (1, 0), "counted, and no recovery: the job is still failing");
    assert_eq!(state().await, Some((1, Some(at(10_900)))));

    // A pass that counts only what ended before the last success (a failure it supersedes)
    // keeps the failures' ends: a success after it still leaves the failure at 11 s.
    s.finish_many(&[ended(&ids[5], RunStatus::Failed, 10_850)], at(11_200)).await.expect("end");
    assert_eq!(pass(at(11_250)).await.runs, 1);
    s.finish_many(&[noticed(&ids[6], 10_950)], at(11_300)).await.expect("end");
    assert_eq!(state().await, Some((1, Some(at(10_950)))), "the failure at 11 s still stands");

    s.finish_many(&[noticed(&ids[7], 11_500)], at(11_600)).await.expect("end");
    assert_eq!(state().await, Some((0, Some(at(11_500)))), "a success that ended after every counted failure ends the streak");
    assert_eq!(pass(at(11_700)).await, super::Noticed::default(), "nothing left for a pass");
    assert_eq!(state().await, Some((0, Some(at(11_500)))));
}

/// A job's rules as two checks give them: failures from the `n`th in a row to workflow
/// `pager`, recoveries from a streak of `n` to workflow `chat`.
fn pager_and_chat(n: u32) -> Vec<lamplighter_config::NotifyRule> {
    use lamplighter_config::{NotifyOn, NotifyRule, NotifyTarget};
    vec![
        NotifyRule { on: NotifyOn::Failure, after_consecutive: n, to: NotifyTarget::Workflow("pager".into()) },
        NotifyRule { on: NotifyOn::Recovery, after_consecutive: n, to: NotifyTarget::Workflow("chat".into()) },
    ]
}

/// An alert sent at the third failure, which a late success then took back (by the runs' own
/// ends only the last failure followed it), is answered by the success that ends the streak:
/// the streak's peak is kept with it between passes, and the recovery reports it.
async fn the_success_that_ends_a_streak_answers_an_alert_a_late_success_took_back(s: &dyn RunStore) {
    use crate::notify::Sent;
    let rules = |job: &str| (job == "q").then(|| pager_and_chat(3));
    let t = t0();
    let ids = ticked_runs(s, "q", 6).await;
    let at = |ms: i64| t + chrono::Duration::milliseconds(ms);
    let ended = |id, status, ms| RunEnd { last: true, ended_at: Some(at(ms)), ..end(id, status) };
    let pass = |now| async move { s.notice(&rules, &no_after, false, now).await.expect("notice").recorded };
    let failures = [ended(&ids[0], RunStatus::Failed, 9_000), ended(&ids[1], RunStatus::Failed, 9_400)];
    s.finish_many(&failures, at(9_410)).await.expect("end");
    s.finish_many(&[ended(&ids[2], RunStatus::Failed, 9_800)], at(9_810)).await.expect("end");
    assert_eq!(pass(at(9_850)).await, 1, "three in a row: the alert");
    s.finish_many(&[ended(&ids[3], RunStatus::Succeeded, 9_600)], at(10_000)).await.expect("end");
    assert_eq!(pass(at(10_050)).await, 0, "ended before the third failure: no recovery");
    s.finish_many(&[ended(&ids[4], RunStatus::Failed, 10_500)], at(10_510)).await.expect("end");
    assert_eq!(pass(at(10_550)).await, 0, "two in a row by their ends: no second alert");
    s.finish_many(&[ended(&ids[5], RunStatus::Succeeded, 11_000)], at(11_010)).await.expect("end");
    assert_eq!(pass(at(11_050)).await, 1, "the success that ends the streak answers the alert");
    let hold = Duration::from_secs(60);
    let alert = s.claim_notifications(ME, 10, hold, at(11_100)).await.expect("claim");
    assert_eq!((alert.len(), alert[0].event.as_str(), &alert[0].payload["consecutive_failures"]), (1, "failure", &serde_json::json!(3)));
    s.notification_sent(&alert[0].key, ME, &Sent::Delivered("run r1".into()), at(11_100)).await.expect("sent");
    let answer = s.claim_notifications(ME, 10, hold, at(11_200)).await.expect("claim");
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!((answer[0].event.as_str(), answer[0].payload["run_id"].as_str()), ("recovery", Some(ids[5].as_str())));
    assert_eq!(answer[0].payload["consecutive_failures"], 3, "the recovery reports the streak the alert told of");
}

/// A job's failure sent to one target goes before its recovery sent to another; once the
/// failure was tried, a retry it waits for holds back only its own target.
async fn a_jobs_notifications_go_out_in_order_across_targets(s: &dyn RunStore) {
    use crate::notify::Sent;
    let rules = |job: &str| (job == "x").then(|| pager_and_chat(1));
    let t = t0();
    let ids = ticked_runs(s, "x", 2).await;
    s.finish_many(&[RunEnd { last: true, ..end(&ids[0], RunStatus::Failed) }], t + secs(70)).await.expect("end");
    s.finish_many(&[RunEnd { last: true, ..end(&ids[1], RunStatus::Succeeded) }], t + secs(80)).await.expect("end");
    assert_eq!(
        s.notice(&rules, &no_after, false, t + secs(81)).await.expect("notice").recorded,
        2,
        "the failure and its recovery, in one pass"
    );
    let now = t + secs(82);
    let hold = Duration::from_secs(60);
    let first = s.claim_notifications(ME, 10, hold, now).await.expect("claim");
    assert_eq!(first.iter().map(|c| c.event.as_str()).collect::<Vec<_>>(), ["failure"], "the recovery waits for the failure's send");
    assert!(s.claim_notifications("worker-b", 10, hold, now).await.expect("claim").is_empty(), "nor does another worker take it");
    s.notification_sent(&first[0].key, ME, &Sent::Failed { error: "HTTP 503".into(), retry_at: Some(now + secs(30)) }, now)
        .await
        .expect("failed");
    let second = s.claim_notifications(ME, 10, hold, now).await.expect("claim");
    assert_eq!(second.iter().map(|c| c.event.as_str()).collect::<Vec<_>>(), ["recovery"], "tried once: the other target's line moves on");
}

async fn waits_are_notified_once_each(s: &dyn RunStore) {
    use lamplighter_config::{NotifyOn, NotifyRule, NotifyTarget};
    let to = NotifyTarget::Agent("triage".into());
    let rule = |on| NotifyRule { on, after_consecutive: 1, to: to.clone() };
    let rules = |job: &str| (job == "w").then(|| vec![rule(NotifyOn::ApprovalWaiting), rule(NotifyOn::BudgetAsked)]);
    let id = waiting_run(s, &["gate", "agent:budget-1"], None).await;
    let t = t0();
    assert_eq!(s.notice(&rules, &no_after, false, t).await.expect("notice").recorded, 0, "waits are read only when a rule is about them");
    assert_eq!(s.notice(&rules, &no_after, true, t).await.expect("notice").recorded, 2);
    assert_eq!(s.notice(&rules, &no_after, true, t + secs(1)).await.expect("again").recorded, 0, "a wait is told once");
    let mut told: Vec<(String, String)> = s.notifications(&id).await.expect("read").into_iter().map(|n| (n.event, n.key)).collect();
    told.sort();
    assert_eq!(
        told,
        [
            ("approval_waiting".to_owned(), format!("{id}/approval_waiting/gate/0")),
            ("budget_asked".to_owned(), format!("{id}/budget_asked/agent:budget-1/1"))
        ]
    );
    // Both go to one agent: one at a time, in the order recorded.
    let claimed = s.claim_notifications(ME, 10, Duration::from_secs(60), t + secs(2)).await.expect("claim");
    assert_eq!(claimed.len(), 1, "a job's notifications one at a time");
    assert!(claimed[0].payload["command"].as_str().is_some_and(|cmd| cmd.starts_with("lampctl approvals approve")));
}

/// A notification claimed by a worker that is gone (killed mid-send) goes again at recovery,
/// with its key, instead of when the claim would have run out; one claimed by a live worker
/// (here this one) stays with it.
async fn recovery_hands_back_the_notifications_of_workers_that_are_gone(s: &dyn RunStore) {
    use lamplighter_config::{NotifyOn, NotifyRule, NotifyTarget};
    let rules = |job: &str| {
        (job == "w").then(|| vec![NotifyRule { on: NotifyOn::ApprovalWaiting, after_consecutive: 1, to: NotifyTarget::Agent("t".into()) }])
    };
    let hold = Duration::from_secs(60);
    let t = t0();
    let gone = waiting_run(s, &["gate"], None).await;
    assert_eq!(s.notice(&rules, &no_after, true, t).await.expect("notice").recorded, 1);
    let claimed = s.claim_notifications("worker-gone", 10, hold, t).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    assert!(s.claim_notifications(ME, 10, hold, t + secs(1)).await.expect("claim").is_empty(), "held by its claim");
    s.recover(Some(ME), t + secs(2)).await.expect("recover");
    let again = s.claim_notifications(ME, 10, hold, t + secs(2)).await.expect("claim");
    assert_eq!((again.len(), again[0].key.as_str(), again[0].attempts), (1, claimed[0].key.as_str(), 2), "sent again at once");
    assert_eq!(s.notifications(&gone).await.expect("read")[0].status, crate::notify::NotificationStatus::Sending);
    s.recover(Some(ME), t + secs(3)).await.expect("recover");
    assert!(s.claim_notifications("worker-b", 10, hold, t + secs(3)).await.expect("claim").is_empty(), "a live worker's claim stays");
}

/// A deadline watched from the database: the runs not ended of the jobs asked about, with
/// their roots; a miss (and its notification) recorded once, however many passes (workers)
/// tell it; read back with its run identity.
async fn a_missed_deadline_is_told_once_with_its_notifications(s: &dyn RunStore) {
    use crate::deadline::{Miss, Which};
    let run = running_run(s, "etl").await;
    s.insert_run(manual("other", t0()), t0()).await.expect("insert");
    let all = s.watched(None).await.expect("watched");
    assert_eq!(all.runs.len(), 2, "every run not ended");
    let watched = s.watched(Some(&["etl"])).await.expect("watched");
    assert_eq!(watched.runs.iter().map(|(r, root)| (r.id.as_str(), root.started)).collect::<Vec<_>>(), [(run.id.as_str(), true)]);
    assert!(watched.told.is_empty());
    let miss = Miss {
        root_id: run.root_id.clone(),
        run_id: run.id.clone(),
        job: "etl".into(),
        which: Which::FinishWithin,
        tick: None,
        due_at: t0() + secs(60),
        told_at: None,
        cancel: false,
    };
    let rule = lamplighter_config::NotifyRule {
        on: lamplighter_config::NotifyOn::DeadlineMissed,
        after_consecutive: 1,
        to: lamplighter_config::NotifyTarget::Workflow("pager".into()),
    };
    let notes = crate::deadline::notifications(&miss, &run, std::slice::from_ref(&rule), t0() + secs(61));
    assert_eq!(notes.len(), 1);
    let told = s.tell_misses(&[(miss.clone(), notes.clone())], t0() + secs(61)).await.expect("tell");
    assert_eq!(told.iter().map(|m| m.which).collect::<Vec<_>>(), [Which::FinishWithin]);
    // Another pass (another worker's) tells it again: nothing is recorded.
    assert!(s.tell_misses(&[(miss, notes)], t0() + secs(62)).await.expect("tell again").is_empty());
    let read = s.misses_of(&run.root_id).await.expect("read");
    assert_eq!(
        read.iter().map(|m| (m.which, m.told_at, m.due_at)).collect::<Vec<_>>(),
        [(Which::FinishWithin, Some(t0() + secs(61)), t0() + secs(60))]
    );
    let watched = s.watched(Some(&["etl"])).await.expect("watched");
    assert!(watched.told.contains(&(run.root_id.clone(), Which::FinishWithin)));
    let notified = s.notifications(&run.root_id).await.expect("notifications");
    assert_eq!(notified.iter().map(|n| n.event.as_str()).collect::<Vec<_>>(), ["deadline_missed"]);
}

/// Ticks no worker fired on time: told once per job and first missed tick however many passes
/// see them (a crash before the tick's batch, another worker), with their notification; the
/// last set read back for the job's listing.
async fn missed_ticks_are_told_once_per_job_and_first_tick(s: &dyn RunStore) {
    use crate::schedule::MissedTicks;
    let m = MissedTicks { first: t0(), last: t0() + secs(240), count: 5, caught_up: 1, skipped: 2, outside_window: 2 };
    let rule = lamplighter_config::NotifyRule {
        on: lamplighter_config::NotifyOn::Missed,
        after_consecutive: 1,
        to: lamplighter_config::NotifyTarget::Workflow("pager".into()),
    };
    let notes = crate::notify::missed_notifications("etl", &m, Some(lamplighter_config::CatchUp::Latest), std::slice::from_ref(&rule));
    assert_eq!(notes.len(), 1);
    let told = s.tell_missed(&[("etl".into(), m, notes.clone())], t0() + secs(300)).await.expect("tell");
    assert_eq!(told, [("etl".to_string(), m)]);
    let again = MissedTicks { last: t0() + secs(300), count: 6, ..m };
    assert!(s.tell_missed(&[("etl".into(), again, notes.clone())], t0() + secs(301)).await.expect("again").is_empty());
    assert_eq!(s.last_missed("etl").await.expect("read"), Some((m, t0() + secs(300))));
    assert_eq!(s.last_missed("other").await.expect("read"), None);
    let later = MissedTicks { first: t0() + secs(3600), last: t0() + secs(3600), count: 1, caught_up: 1, skipped: 0, outside_window: 0 };
    s.tell_missed(&[("etl".into(), later, Vec::new())], t0() + secs(3700)).await.expect("tell");
    assert_eq!(s.last_missed("etl").await.expect("read").map(|(m, _)| m), Some(later), "the last set");
    let notified = s.notifications(&notes[0].root_id).await.expect("notifications");
    assert_eq!(notified.iter().map(|n| n.event.as_str()).collect::<Vec<_>>(), ["missed"]);
}

macro_rules! contract {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;
            contract!(@tests $make;
                a_tick_fires_once_even_when_a_batch_repeats_it,
                a_held_tick_transaction_is_seen_only_once_it_commits,
                ticks_with_slots_are_claimed_in_their_own_transaction,
                the_tick_decision_follows_pause_and_overlap,
                due_runs_are_handed_over_once,
                a_run_cancelled_while_queued_is_not_claimed,
                ends_and_the_claims_that_replace_them_go_together,
                ends_follow_the_allowed_transitions,
                an_idempotency_key_returns_the_first_run,
                each_owner_is_read_back_as_stored,
                a_follow_up_keeps_identity_snapshot_and_checkpoints,
                recovery_interrupts_running_runs_and_hands_queued_ones_over_again,
                a_restart_under_the_same_name_takes_the_lease_over,
                retention_deletes_only_finished_runs,
                retention_by_count_passes_over_older_runs_not_done_with,
                tick_keys_guard_a_window_then_go,
                retention_of_many_jobs_is_applied_each_its_own_way_in_one_call,
                listings_page_newest_first_and_count,
                job_state_persists_and_the_last_tick_only_moves_forward,
                a_group_pauses_and_resumes_at_once,
                waits_decisions_and_step_records,
                agent_calls_and_resuming_rejections,
                listing_changes_move_with_what_a_listing_shows,
                runtime_jobs_keep_versions_history_and_refuse_stale_changes,
                a_window_knows_which_ticks_have_runs,
                a_cancel_request_is_kept_with_its_running_run,
                output_lines_are_kept_once_each_in_order,
                outcomes_are_noticed_once_and_notifications_sent_once,
                successes_noticed_at_their_end_move_their_job_in_the_same_write,
                a_success_written_after_failures_that_ended_later_leaves_them_in_the_streak,
                the_success_that_ends_a_streak_answers_an_alert_a_late_success_took_back,
                jobs_run_after_their_upstream_jobs_once,
                limits_admit_in_line_and_free_slots_with_their_runs,
                limited_runs_wait_in_line_from_their_insert,
                a_run_that_needs_no_decision_is_queued_by_its_insert,
                waits_are_notified_once_each,
                a_jobs_notifications_go_out_in_order_across_targets,
                recovery_hands_back_the_notifications_of_workers_that_are_gone,
                a_missed_deadline_is_told_once_with_its_notifications,
                missed_ticks_are_told_once_per_job_and_first_tick,
            );
        }
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                let (_guard, store) = $make.await;
                take_lease(&*store).await;
                super::$name(&*store).await;
            }
        )*
    };
}

async fn sqlite() -> (tempfile::TempDir, Box<dyn RunStore>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = super::sqlite::SqliteStore::open(&dir.path().join("contract.db")).await.expect("open");
    super::Upkeep::migrate(&store).await.expect("migrate");
    (dir, Box::new(store))
}

contract!(sqlite_store, sqlite());

mod sqlite_alone {
    use super::*;
    contract!(@tests sqlite(); a_lone_worker_shares_with_nobody);
}

/// A fresh cluster per check (about a second to create): checks run in parallel and never see
/// each other's rows.
async fn postgres() -> (lamplighter_tests::pg::Cluster, Box<dyn RunStore>) {
    let cluster = lamplighter_tests::pg::Cluster::start();
    let store = super::postgres::PgStore::connect(&cluster.url(), 4, Duration::from_secs(30)).await.expect("connect");
    super::Upkeep::migrate(&store).await.expect("migrate");
    (cluster, Box::new(store))
}

contract!(postgres_store, postgres());

mod postgres_shared {
    use super::*;
    contract!(@tests postgres(); workers_that_know_the_same_jobs_share_them);
}

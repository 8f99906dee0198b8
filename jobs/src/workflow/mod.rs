//! The workflow engine: runs one workflow run's steps, durably.
//!
//! Durability is replay of recorded steps, not of code: every step's record (running, then its
//! end with its output) is written to the store under the run's identity before the next step
//! starts. A run that executes again — a retry, a run recovered after a crash, a run resumed
//! after an approval — reads those records first; steps recorded `succeeded` or `skipped` are
//! not run again and their outputs feed the templates as before. A step that was running when
//! the process died has no end recorded and runs again (plugins get `${run.id}` and the step id
//! to make that safe).
//!
//! - Steps run in order; a `parallel` runs its children concurrently and joins them. The first
//!   failed step fails the run, naming it; inside a `parallel` its siblings are stopped and
//!   recorded `cancelled`.
//! - `condition` records its result and marks the steps named only in the branch not taken
//!   `skipped`; any step's `when` that renders false skips it.
//! - `approval` records the step `waiting_approval` and the run gives its slot back
//!   ([`Outcome::Waiting`]); the decision is recorded on the step by the job service
//!   (`Records::record_decision`), which resumes the run. A timeout resumes it too, and the step then
//!   applies `on_timeout`.
//! - A step with `limits` (a `parallel`: its children's too) needs a slot of each when it
//!   starts: a run that holds them all goes on; otherwise it is queued again, in line for its
//!   job's pools and the step's ([`Outcome::WaitingForLimits`]), and admitted, resumes at the
//!   step. The step's slots are given back when it ends (a top-level step's; the run's end
//!   gives back the rest).
//! - `agent` steps run a conversation (see [`crate::agent`]) keyed by the step id, so a resumed
//!   run continues it from its recorded calls; `group_chat` runs its agents in order, each
//!   given the previous one's answer. A conversation waiting for a decision (a tool call,
//!   more budget) leaves its step `running` and the run waiting.

mod values;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::{Value, json};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use lamplighter_config::{Decision, Step, StepKind, Template, Templated, Workflow};
use lamplighter_plugins::{ActionContext, ActionError, Registry};

use crate::agent::{AgentRuntime, RunHost, Session, Stopped, input_text};
use opentelemetry::context::FutureExt as _;

use crate::context::RunContext;
use crate::events::{Cancelled, Ended, Op, RunRef};
use crate::limits::{Pool, pools_of};
use crate::run::{Outcome, RunStatus, StepRecord, StepStatus};

use values::{Scope, cap, truthy};

/// How a step (and everything in it) ended, for its parent.
#[derive(Debug)]
enum End {
    Done,
    /// Waits for a decision; resumed by one, or at `until`.
    Waiting(Option<DateTime<Utc>>),
    /// Needs slots of limits the run does not hold: these pools (the job's and the step's).
    WaitingForLimits(Vec<Pool>),
    Failed {
        error: String,
        retry: bool,
    },
}

impl End {
    fn failed(error: String, retry: bool) -> Self {
        End::Failed { error, retry }
    }
}

/// Runs `workflow` for the run in `ctx`, continuing from the steps its earlier attempts (or
/// its own earlier execution, before a wait) recorded.
pub(crate) async fn run(ctx: RunContext, workflow: Arc<Workflow>, registry: Arc<Registry>, agents: Arc<AgentRuntime>) -> Outcome {
    let records = match ctx.steps().await {
        Ok(r) => r,
        Err(e) => return Outcome::failed(format!("cannot read the recorded steps of the run: {e}")),
    };
    let own = pools_of(&ctx.job().limits, ctx.run().input.as_ref());
    let held = Mutex::new(ctx.run().pools.clone());
    let engine = Interpreter {
        own,
        held,
        ctx,
        workflow: workflow.name.clone(),
        registry,
        agents,
        session: OnceCell::new(),
        steps: Mutex::new(records.into_iter().map(|r| (r.step.clone(), r)).collect()),
    };
    let cancel = engine.ctx.cancelled().clone();
    for step in &workflow.steps {
        match engine.step(step, &cancel, true).await {
            End::Done => {}
            End::Waiting(until) => return Outcome::Waiting { until },
            End::WaitingForLimits(pools) => return Outcome::WaitingForLimits { pools },
            End::Failed { error, retry } => return Outcome::Failed { error, retry },
        }
    }
    // The run's output: that of the last top-level step that ran.
    let steps = engine.lock();
    let output = workflow
        .steps
        .iter()
        .rev()
        .filter_map(|s| steps.get(&s.id))
        .find(|r| r.status == StepStatus::Succeeded)
        .and_then(|r| r.output.clone())
        .unwrap_or(Value::Null);
    Outcome::Succeeded { output }
}

struct Interpreter {
    ctx: RunContext,
    /// The workflow's name, for events.
    workflow: String,
    registry: Arc<Registry>,
    agents: Arc<AgentRuntime>,
    /// The run's agent session, opened by the first agent step that runs.
    session: OnceCell<Session>,
    /// Every step recorded for the run identity, by id: read at start, kept up to date with
    /// each record written. Never locked across an `.await`.
    steps: Mutex<HashMap<String, StepRecord>>,
    /// The pools of the job's own limits, held from the run's start to its end.
    own: Vec<Pool>,
    /// The pools the run holds a slot of now: its own, and those of the step that runs.
    held: Mutex<Vec<Pool>>,
}

impl Interpreter {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, StepRecord>> {
        self.steps.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> DateTime<Utc> {
        self.ctx.clock().now()
    }

    fn status(&self, id: &str) -> Option<StepStatus> {
        self.lock().get(id).map(|r| r.status)
    }

    fn with_scope<T>(&self, f: impl FnOnce(&Scope<'_>) -> T) -> T {
        let steps = self.lock();
        let run = self.ctx.run();
        f(&Scope { input: run.input.as_ref(), steps: &steps, run_id: &run.root_id, attempt: run.attempt })
    }

    fn text(&self, t: &Template) -> String {
        self.with_scope(|s| s.text(t))
    }

    fn value(&self, t: &Templated) -> Value {
        self.with_scope(|s| s.value(t))
    }

    /// A record of `step` by this attempt.
    fn record(&self, step: &str, status: StepStatus, started_at: Option<DateTime<Utc>>) -> StepRecord {
        crate::run::step_record(self.ctx.run(), step, status, started_at)
    }

    /// Writes records (durable when this returns), then keeps them.
    async fn write(&self, records: Vec<StepRecord>) -> Result<(), End> {
        if let Err(e) = self.ctx.record_steps(&records).await {
            let which = records.iter().map(|r| r.step.as_str()).collect::<Vec<_>>().join(", ");
            return Err(End::failed(format!("cannot record workflow step {which}: {e}"), true));
        }
        let mut steps = self.lock();
        for r in records {
            steps.insert(r.step.clone(), r);
        }
        Ok(())
    }

    /// Records that `step` started now.
    async fn begin(&self, step: &str) -> Result<DateTime<Utc>, End> {
        let now = self.now();
        self.write(vec![self.record(step, StepStatus::Running, Some(now))]).await?;
        Ok(now)
    }

    /// Records how `step` (started at `started`) ended.
    async fn end(
        &self,
        step: &str,
        started: Option<DateTime<Utc>>,
        status: StepStatus,
        output: Option<Value>,
        error: Option<String>,
    ) -> Result<(), End> {
        let mut r = self.record(step, status, started);
        r.finished_at = Some(self.now());
        r.output = output;
        r.error = error;
        self.write(vec![r]).await
    }

    /// A `before` hook refused step `id`: recorded failed with the hook's reason; not retried.
    async fn not_run(&self, id: &str, why: String) -> Result<End, End> {
        let now = Some(self.now());
        self.end(id, now, StepStatus::Failed, None, Some(why.clone())).await?;
        Ok(End::failed(format!("step \"{id}\" was not run: {why}"), false))
    }

    /// The pools `step` (and the steps in it) holds while it runs, its keys over the run's input.
    fn pools_of(&self, step: &Step) -> Vec<Pool> {
        let limits: Vec<lamplighter_config::LimitUse> = step.held_limits().into_iter().cloned().collect();
        pools_of(&limits, self.ctx.run().input.as_ref())
    }

    /// The pools the run must wait for to run a step that needs `needed`: none when it holds
    /// them all; otherwise its own and the step's.
    fn wait_for(&self, needed: &[Pool]) -> Option<Vec<Pool>> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if needed.iter().all(|p| held.contains(p)) {
            return None;
        }
        let mut pools = self.own.clone();
        pools.extend(needed.iter().filter(|p| !self.own.contains(p)).cloned());
        Some(pools)
    }

    /// A top-level step that held `needed` ended: the slots of those not the job's own are
    /// given back.
    async fn release(&self, id: &str, needed: &[Pool]) -> Result<(), End> {
        let freed: Vec<Pool> = needed.iter().filter(|p| !self.own.contains(p)).cloned().collect();
        if freed.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.ctx.release_limits(&self.own, &freed).await {
            return Err(End::failed(format!("cannot give back the limits step \"{id}\" held: {e}"), true));
        }
        self.held.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| !freed.contains(p));
        Ok(())
    }

    /// Runs one step (and its children), unless a record says it finished already. `top`: a
    /// step of the workflow itself, not of a `parallel` (which holds its children's limits).
    fn step<'a>(&'a self, step: &'a Step, cancel: &'a CancellationToken, top: bool) -> BoxFuture<'a, End> {
        Box::pin(async move {
            if self.status(&step.id).is_some_and(StepStatus::is_done) {
                return End::Done;
            }
            if let Some(when) = &step.when {
                let rendered = self.text(when);
                if !truthy(&rendered) {
                    let now = Some(self.now());
                    let why = format!("skipped: when \"{when}\" rendered \"{rendered}\", which is false");
                    return match self.end(&step.id, now, StepStatus::Skipped, None, Some(why)).await {
                        Ok(()) => End::Done,
                        Err(e) => e,
                    };
                }
            }
            // Before anything of the step begins (its hooks, its span): a step waiting in line
            // has not started.
            let needed = self.pools_of(step);
            if let Some(pools) = self.wait_for(&needed) {
                return End::WaitingForLimits(pools);
            }
            let op = Op::Step { workflow: self.workflow.clone(), step: step.id.clone(), kind: step.kind.step_type().as_str() };
            let obs = self.ctx.observer();
            let started = match obs.begin(op, RunRef::from(self.ctx.run()), None).await {
                Ok(s) => s,
                Err(Cancelled(why)) => return self.not_run(&step.id, why).await.unwrap_or_else(|e| e),
            };
            let work = async {
                match &step.kind {
                    StepKind::Plugin { plugin, action, input, parameters } => {
                        self.plugin(&step.id, plugin, action, input.as_ref(), parameters.as_ref(), cancel).await
                    }
                    StepKind::Condition { condition, then, otherwise } => self.condition(&step.id, condition, then, otherwise).await,
                    StepKind::Parallel { steps } => self.parallel(&step.id, steps, cancel).await,
                    StepKind::Approval { input, timeout, on_timeout } => {
                        self.approval(&step.id, input.as_ref(), *timeout, *on_timeout).await
                    }
                    StepKind::Agent { agent, input } => self.agent(&step.id, agent, input.as_ref(), cancel).await,
                    StepKind::GroupChat { agents, input, max_iterations } => {
                        self.group_chat(&step.id, agents, input.as_ref(), max_iterations.unwrap_or(1), cancel).await
                    }
                }
            };
            let mut end = work.with_context(started.context()).await.unwrap_or_else(|e| e);
            if top && matches!(end, End::Done) {
                end = self.release(&step.id, &needed).await.err().unwrap_or(End::Done);
            }
            let ended = match &end {
                End::Failed { error, .. } => Ended::failed(error),
                End::Waiting(_) => Ended { status: Some(RunStatus::WaitingApproval), ..Ended::ok() },
                End::WaitingForLimits(_) => Ended { status: Some(RunStatus::Queued), ..Ended::ok() },
                End::Done => Ended::ok(),
            };
            started.end(obs, ended).await;
            end
        })
    }

    async fn plugin(
        &self,
        id: &str,
        plugin: &str,
        action: &str,
        input: Option<&Templated>,
        parameters: Option<&Templated>,
        cancel: &CancellationToken,
    ) -> Result<End, End> {
        let mut params = parameters.map_or_else(|| json!({}), |p| self.value(p));
        if let Some(input) = input {
            let input = self.value(input);
            match &mut params {
                Value::Object(map) => {
                    map.insert("input".into(), input);
                }
                _ => return Ok(End::failed(format!("step \"{id}\": parameters must be a map of name → value"), false)),
            }
        }
        let started = self.begin(id).await?;
        let dir = self.ctx.working_directory();
        if let Err(error) = crate::context::make_working_directory(&dir) {
            self.end(id, Some(started), StepStatus::Failed, None, Some(error.clone())).await?;
            return Ok(End::failed(format!("step \"{id}\" failed: {error}"), true));
        }
        let actx = ActionContext {
            working_directory: dir,
            allowed_commands: self.ctx.job().allowed_commands.to_vec(),
            cancel: cancel.clone(),
            usage: Default::default(),
            output: Some(self.ctx.output().sink()),
            host: self.registry.is_wasm(plugin).then(|| RunHost::for_run(&self.ctx, &self.agents)),
        };
        match self.ctx.invoke(&self.registry, plugin, action, params, &actx).await {
            Ok(output) => {
                self.end(id, Some(started), StepStatus::Succeeded, Some(cap(output)), None).await?;
                Ok(End::Done)
            }
            Err(e) => {
                let retry = matches!(e, ActionError::Timeout { .. }) || !e.is_permanent();
                self.end(id, Some(started), StepStatus::Failed, None, Some(e.to_string())).await?;
                Ok(End::failed(format!("step \"{id}\" failed: {e}"), retry))
            }
        }
    }

    /// Records the result, and the steps named only in the branch not taken as skipped, in one
    /// write: a crash never leaves a branch half decided.
    async fn condition(&self, id: &str, condition: &Template, then: &[String], otherwise: &[String]) -> Result<End, End> {
        let rendered = self.text(condition);
        let result = truthy(&rendered);
        let (taken, not_taken, branch) = if result { (then, otherwise, "then") } else { (otherwise, then, "else") };
        let now = Some(self.now());
        let mut cond = self.record(id, StepStatus::Succeeded, now);
        cond.finished_at = now;
        cond.output = Some(json!({"result": result, "value": rendered, "branch": branch}));
        let mut records = vec![cond];
        for skip in not_taken.iter().filter(|s| !taken.contains(s)) {
            if self.status(skip).is_some_and(StepStatus::is_done) {
                continue;
            }
            let mut r = self.record(skip, StepStatus::Skipped, None);
            r.finished_at = now;
            r.error = Some(format!("skipped: condition \"{id}\" took the {branch} branch"));
            records.push(r);
        }
        self.write(records).await?;
        Ok(End::Done)
    }

    async fn parallel(&self, id: &str, children: &[Step], cancel: &CancellationToken) -> Result<End, End> {
        let started = self.begin(id).await?;
        let token = cancel.child_token();
        let mut running: FuturesUnordered<_> =
            children.iter().map(|c| async { (c.id.as_str(), self.step(c, &token, false).await) }).collect();
        let mut waiting: Option<Option<DateTime<Utc>>> = None;
        // The parallel took its children's limits: a child finds them held, unless they were
        // given back meanwhile (then the run waits in line for them once its siblings are done).
        let mut in_line: Vec<Pool> = Vec::new();
        let mut failure = None;
        while let Some((child, end)) = running.next().await {
            match end {
                End::Done => {}
                End::Waiting(until) => {
                    waiting = Some(match (waiting.flatten(), until) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    });
                }
                End::WaitingForLimits(pools) => {
                    in_line.extend(pools.into_iter().filter(|p| !in_line.contains(p)).collect::<Vec<_>>());
                }
                End::Failed { error, retry } => {
                    failure = Some((child, error, retry));
                    break;
                }
            }
        }
        // Stops the children still going (their futures are dropped here).
        token.cancel();
        drop(running);
        if let Some((child, error, retry)) = failure {
            let now = Some(self.now());
            let note = format!("cancelled: step \"{child}\" in the same parallel failed");
            let records: Vec<StepRecord> = {
                let steps = self.lock();
                children
                    .iter()
                    .filter(|c| c.id != child)
                    .flat_map(Step::walk)
                    .filter(|s| match steps.get(&s.id) {
                        Some(r) => matches!(r.status, StepStatus::Running | StepStatus::WaitingApproval),
                        None => children.iter().any(|c| c.id == s.id),
                    })
                    .map(|s| {
                        let mut r = self.record(&s.id, StepStatus::Cancelled, steps.get(&s.id).and_then(|r| r.started_at));
                        r.finished_at = now;
                        r.error = Some(note.clone());
                        r
                    })
                    .collect()
            };
            self.write(records).await?;
            self.end(id, Some(started), StepStatus::Failed, None, Some(format!("step \"{child}\" failed"))).await?;
            return Ok(End::Failed { error, retry });
        }
        if let Some(until) = waiting {
            // The parallel itself stays `running`: only the steps that wait for a decision are
            // recorded waiting (a decision resumes the run once none is left).
            return Ok(End::Waiting(until));
        }
        if !in_line.is_empty() {
            return Ok(End::WaitingForLimits(in_line));
        }
        let output: serde_json::Map<String, Value> = {
            let steps = self.lock();
            children.iter().map(|c| (c.id.clone(), steps.get(&c.id).and_then(|r| r.output.clone()).unwrap_or(Value::Null))).collect()
        };
        self.end(id, Some(started), StepStatus::Succeeded, Some(cap(Value::Object(output))), None).await?;
        Ok(End::Done)
    }

    async fn approval(
        &self,
        id: &str,
        input: Option<&Templated>,
        timeout: Option<std::time::Duration>,
        on_timeout: Decision,
    ) -> Result<End, End> {
        let now = self.now();
        let earlier = self.lock().get(id).cloned();
        match earlier {
            // Rejected (a decision is never retried into an approval).
            Some(r) if r.status == StepStatus::Failed && r.output.as_ref().and_then(|o| o.get("approved")) == Some(&json!(false)) => {
                let why = r.error.unwrap_or_else(|| "rejected".into());
                Ok(End::failed(format!("step \"{id}\" was {why}"), false))
            }
            Some(r) if r.status == StepStatus::WaitingApproval => {
                let since = r.started_at.unwrap_or(now);
                let deadline = timeout.map(|t| since + chrono::Duration::from_std(t).unwrap_or(chrono::Duration::MAX));
                if deadline.is_some_and(|d| d <= now) {
                    return self.timed_out(id, r, timeout.unwrap_or_default(), on_timeout).await;
                }
                if r.run_id != self.ctx.run().id {
                    // Waiting on behalf of this attempt now (a decision looks it up by run).
                    self.write(vec![StepRecord { run_id: self.ctx.run().id.clone(), attempt: self.ctx.run().attempt, ..r }]).await?;
                }
                Ok(End::Waiting(deadline))
            }
            _ => {
                let question = input.map(|i| self.value(i));
                let mut r = self.record(id, StepStatus::WaitingApproval, Some(now));
                r.output = Some(json!({ "question": question }));
                self.write(vec![r]).await?;
                self.ctx.observer().approval_requested(self.ctx.run(), id);
                Ok(End::Waiting(timeout.map(|t| now + chrono::Duration::from_std(t).unwrap_or(chrono::Duration::MAX))))
            }
        }
    }

    /// Nobody decided within the timeout: `on_timeout` decides, recorded like a person's decision.
    async fn timed_out(&self, id: &str, waiting: StepRecord, timeout: std::time::Duration, on_timeout: Decision) -> Result<End, End> {
        let approved = on_timeout == Decision::Approve;
        let waited = humantime::format_duration(timeout);
        let comment = format!("no decision within {waited}");
        let output = json!({
            "approved": approved,
            "comment": comment,
            "decided_by": "timeout",
            "decided_at": self.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        });
        let (status, error) = if approved {
            (StepStatus::Succeeded, None)
        } else {
            (StepStatus::Failed, Some(format!("rejected: {comment} (on_timeout: reject)")))
        };
        self.end(id, waiting.started_at, status, Some(output), error.clone()).await?;
        Ok(match error {
            None => End::Done,
            Some(e) => End::failed(format!("step \"{id}\" was {e}"), false),
        })
    }

    async fn session(&self) -> Result<&Session, String> {
        self.session.get_or_try_init(|| Session::open(self.ctx.clone(), self.agents.clone(), self.registry.clone())).await
    }

    /// Records the step running, keeping the first start of a step resumed after a wait.
    async fn begin_or_resume(&self, id: &str) -> Result<DateTime<Utc>, End> {
        let running = self.lock().get(id).filter(|r| r.status == StepStatus::Running).and_then(|r| r.started_at);
        match running {
            Some(started) => Ok(started),
            None => self.begin(id).await,
        }
    }

    async fn agent(&self, id: &str, agent: &str, input: Option<&Templated>, cancel: &CancellationToken) -> Result<End, End> {
        let input = input_text(input.map(|i| self.value(i)).as_ref());
        self.conversations(id, &[(agent, String::new())], input, cancel).await
    }

    /// Each agent in turn, `rounds` times, each given the previous one's answer.
    async fn group_chat(
        &self,
        id: &str,
        agents: &[String],
        input: Option<&Templated>,
        rounds: u32,
        cancel: &CancellationToken,
    ) -> Result<End, End> {
        let input = input_text(input.map(|i| self.value(i)).as_ref());
        let turns: Vec<(&str, String)> = (0..rounds.max(1))
            .flat_map(|round| agents.iter().enumerate().map(move |(i, a)| (a.as_str(), format!("#{round}.{i}"))))
            .collect();
        let obs = self.ctx.observer();
        let op = Op::GroupChat { step: id.to_string(), agents: agents.to_vec() };
        let chat = match obs.begin(op, RunRef::from(self.ctx.run()), None).await {
            Ok(c) => c,
            Err(Cancelled(why)) => return self.not_run(id, why).await,
        };
        let end = self.conversations(id, &turns, input, cancel).with_context(chat.context()).await;
        let ended = match &end {
            Ok(End::Failed { error, .. }) | Err(End::Failed { error, .. }) => Ended::failed(error),
            Ok(End::Waiting(_)) | Err(End::Waiting(_)) => Ended { status: Some(RunStatus::WaitingApproval), ..Ended::ok() },
            _ => Ended::ok(),
        };
        chat.end(obs, ended).await;
        end
    }

    /// Runs conversations in order (`(agent, suffix of the step id)`), each given the previous
    /// answer; the last answer is the step's output.
    async fn conversations(&self, id: &str, turns: &[(&str, String)], input: String, cancel: &CancellationToken) -> Result<End, End> {
        let started = self.begin_or_resume(id).await?;
        let session = match self.session().await {
            Ok(s) => s,
            Err(e) => return Ok(End::failed(format!("step \"{id}\" failed: {e}"), true)),
        };
        let turns: Vec<(&str, String)> = turns.iter().map(|(agent, suffix)| (*agent, format!("{id}{suffix}"))).collect();
        match session.relay(&turns, input, 0, cancel).await {
            Ok(text) => {
                self.end(id, Some(started), StepStatus::Succeeded, Some(cap(Value::String(text))), None).await?;
                Ok(End::Done)
            }
            Err(Stopped::Failed { error, retry, .. }) => {
                self.end(id, Some(started), StepStatus::Failed, None, Some(error.clone())).await?;
                Ok(End::failed(format!("step \"{id}\" failed: {error}"), retry))
            }
            Err(Stopped::Waiting) => Ok(End::Waiting(None)),
        }
    }
}

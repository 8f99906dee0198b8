//! MCP tasks (the `io.modelcontextprotocol/tasks` extension): `trigger_job` and `run_workflow`
//! with `wait`, from a client that declares the extension, answer at once with a task that
//! follows the run. Its status follows the run's: `working`, then `completed` (the run
//! succeeded; the result is what the tool's own wait answers), `failed` (the run failed, timed
//! out, was skipped or interrupted) or `cancelled`. A step waiting for a person makes the task
//! `input_required` with one elicitation per step (approve or reject, with a comment) that
//! `tasks/update` answers; a decision given elsewhere (lampctl, `approve_step`) withdraws it.
//! `tasks/cancel` cancels the run.
//!
//! Task ids are random UUIDs (rmcp's [`TaskManager`]) and each is tied to the credentials of
//! the request that made it: `tasks/get`, `update` and `cancel` with other credentials are
//! told the task does not exist.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lamplighter_contract::{RunDetail, StepStatus, StepView, TriggerOutcome};
use lamplighter_jobs::{DecisionRequest, JobService, RunStatus, ServiceError};
use rmcp::model::{
    CallToolResult, DetailedTask, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, EnumSchema,
    InputRequest, InputResponses, Task,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;

/// How long a task lives when the call gives no `timeout_seconds` (the longest wait).
const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The worker's tasks and who may see each.
#[derive(Clone, Default)]
pub(crate) struct Tasks {
    manager: TaskManager,
    /// Task id → a keyed hash of the `Authorization` header that created it.
    owners: Arc<Mutex<HashMap<String, u64>>>,
    hasher: RandomState,
}

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks").field("running", &self.manager.running_task_count()).finish_non_exhaustive()
    }
}

/// What a task needs to follow its run.
pub(crate) struct Follow {
    pub(crate) run_id: String,
    pub(crate) created: bool,
    pub(crate) timeout: Option<Duration>,
    /// Recorded as `decided_by` for decisions given through the task.
    pub(crate) decided_by: String,
}

impl Tasks {
    /// Starts a task that follows `follow.run_id`, owned by the caller of `context`.
    pub(crate) fn start(&self, service: JobService, follow: Follow, context: &RequestContext<RoleServer>) -> Task {
        let ttl = follow.timeout.unwrap_or(DEFAULT_TTL);
        let options = TaskOptions::new()
            .with_ttl_ms(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .with_status_message(format!("run {} is queued", follow.run_id));
        let manager = self.manager.clone();
        let task = self.manager.spawn(options, move |ctx| Box::pin(follow_run(service, manager, ctx, follow)));
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        // Forget the owners of tasks the manager has dropped (it keeps a finished task one TTL).
        owners.retain(|id, _| self.manager.get_task(id).is_ok());
        owners.insert(task.task_id.clone(), self.owner(context));
        task
    }

    pub(crate) fn get(&self, task_id: &str, context: &RequestContext<RoleServer>) -> Result<DetailedTask, ErrorData> {
        self.check(task_id, context)?;
        self.manager.get_task(task_id)
    }

    pub(crate) fn update(&self, task_id: &str, responses: InputResponses, context: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.check(task_id, context)?;
        self.manager.update_task(task_id, responses)
    }

    pub(crate) fn cancel(&self, task_id: &str, context: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.check(task_id, context)?;
        self.manager.cancel_task(task_id)
    }

    /// Another caller's task is as unknown as one that never existed.
    fn check(&self, task_id: &str, context: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.check_owner(task_id, self.owner(context))
    }

    fn check_owner(&self, task_id: &str, caller: u64) -> Result<(), ErrorData> {
        match self.owners.lock().unwrap_or_else(PoisonError::into_inner).get(task_id) {
            Some(owner) if *owner == caller => Ok(()),
            _ => Err(ErrorData::invalid_params(format!("unknown task: {task_id}"), None)),
        }
    }

    /// The caller's credential, hashed with this worker's random key.
    fn owner(&self, context: &RequestContext<RoleServer>) -> u64 {
        let headers = context.extensions.get::<axum::http::request::Parts>().map(|parts| &parts.headers);
        self.hasher.hash_one(credential(headers))
    }
}

/// The bearer token a request presents, as the guard reads it (`security.rs`): the scheme in
/// any case, spaces trimmed. None over stdio, or over HTTP without auth.
fn credential(headers: Option<&axum::http::HeaderMap>) -> Option<String> {
    let value = headers?.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_owned())
}

/// One step (or agent wait) that waits for a decision, as the elicitation asks it.
#[derive(Debug, Clone, PartialEq)]
struct Waiting {
    step: String,
    question: Option<Value>,
}

/// The task's operation: follows the run ([`JobService::follow`]) until it ends.
async fn follow_run(service: JobService, manager: TaskManager, ctx: TaskContext, follow: Follow) -> Result<CallToolResult, TaskExit> {
    let Follow { run_id, created, timeout, decided_by } = follow;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut follow = service.follow::<RunDetail>(&run_id);
    // Step → the key of the elicitation that asks about it.
    let mut asked: HashMap<String, String> = HashMap::new();
    // Steps whose elicitation the person dismissed: not asked again (other ways stay open).
    let mut dismissed: HashSet<String> = HashSet::new();
    let mut answers = FuturesUnordered::new();
    let mut asked_so_far = 0u32;
    let mut cancel_asked = false;
    let mut detail = match follow.next().await {
        Some(d) => d.map_err(failed)?,
        None => service.get_run_detail(&run_id).await.map_err(failed)?,
    };
    loop {
        let run = &detail.run;
        if run.status.is_final() {
            return ended(detail, created);
        }
        ctx.set_status_message(format!("run {run_id} is {}", run.status));
        let waiting = waiting_steps(&detail);
        // Withdraw what was decided elsewhere: the task then leaves `input_required`.
        let decided: Vec<(String, String)> =
            asked.iter().filter(|(step, _)| !waiting.iter().any(|w| &w.step == *step)).map(|(s, k)| (s.clone(), k.clone())).collect();
        for (step, key) in decided {
            asked.remove(&step);
            let _ = manager.update_task(ctx.task_id(), [(key, Value::Null)]);
        }
        let new: Vec<Waiting> = waiting.into_iter().filter(|w| !asked.contains_key(&w.step) && !dismissed.contains(&w.step)).collect();
        for w in new {
            asked_so_far += 1;
            let key = format!("approval-{asked_so_far}");
            asked.insert(w.step.clone(), key.clone());
            let request = elicitation(&run_id, &w).map_err(TaskExit::Error)?;
            let ctx = ctx.clone();
            answers.push(async move { (w.step, key.clone(), ctx.request_input(key, request).await) });
        }
        let limit = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            next = follow.next() => {
                detail = match next {
                    Some(d) => d.map_err(failed)?,
                    None => service.get_run_detail(&run_id).await.map_err(failed)?,
                };
            }
            Some((step, key, answer)) = answers.next() => {
                // A withdrawn or superseded question's answer is moot.
                if asked.get(&step) != Some(&key) {
                    continue;
                }
                asked.remove(&step);
                match answer.map(|value| decision(&value)) {
                    Ok(Ok(Some((approve, comment)))) => {
                        let request = DecisionRequest { run_id: run_id.clone(), step: Some(step.clone()), approve, comment, decided_by: decided_by.clone() };
                        if let Err(e) = service.decide(request).await {
                            ctx.set_status_message(format!("the decision on step \"{step}\" was not recorded: {e}"));
                        }
                    }
                    Ok(Ok(None)) => {
                        dismissed.insert(step);
                    }
                    // Not an answer this question takes: it is asked again.
                    Ok(Err(why)) => ctx.set_status_message(format!("the answer about step \"{step}\" was not understood ({why}); asked again")),
                    // `tasks/cancel` cleared the questions; the cancel arm below acts.
                    Err(_) => {}
                }
            }
            () = ctx.cancelled(), if !cancel_asked => {
                cancel_asked = true;
                match service.cancel_run(&run_id).await {
                    Ok(_) | Err(ServiceError::NotCancellable { .. }) => {}
                    Err(e) => return Err(failed(e)),
                }
            }
            () = limit => {
                let run = service.get_run(&run_id).await.map_err(failed)?;
                let note = format!("stopped waiting after {} s; the run is still {}", timeout.unwrap_or_default().as_secs(), run.status);
                return Ok(result(&TriggerOutcome { run_id, created, finished: false, run: Some(run), note: Some(note) }));
            }
        }
    }
}

/// The steps and agent waits of the run that wait for a decision, in order.
fn waiting_steps(detail: &RunDetail) -> Vec<Waiting> {
    fn walk(steps: &[StepView], out: &mut Vec<Waiting>) {
        for s in steps {
            if s.status == Some(StepStatus::WaitingApproval) && s.steps.is_empty() {
                out.push(Waiting { step: s.id.clone(), question: s.output.as_ref().and_then(|o| o.get("question")).cloned() });
            }
            walk(&s.steps, out);
        }
    }
    let mut out = Vec::new();
    walk(&detail.steps, &mut out);
    out.extend(
        detail
            .agent_waits
            .iter()
            .filter(|w| w.status == StepStatus::WaitingApproval && w.run_id == detail.run.id)
            .map(|w| Waiting { step: w.step.clone(), question: w.output.as_ref().and_then(|o| o.get("question").or(Some(o))).cloned() }),
    );
    out
}

/// The question for one waiting step: approve or reject, with an optional comment.
fn elicitation(run_id: &str, w: &Waiting) -> Result<InputRequest, ErrorData> {
    let question = match &w.question {
        Some(Value::String(text)) => format!(": {text}"),
        Some(other) => format!(": {other}"),
        None => String::new(),
    };
    let message = format!("Run {run_id} waits for a decision on step \"{}\"{question}", w.step);
    let decision = EnumSchema::builder(vec!["approve".into(), "reject".into()]).build();
    let schema = ElicitationSchema::builder()
        .required_enum_schema("decision", decision)
        .optional_string("comment")
        .description("Approve or reject the step; the comment is recorded with the decision")
        .build()
        .map_err(|e| ErrorData::internal_error(format!("cannot build the approval question: {e}"), None))?;
    let params = ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema: schema };
    Ok(InputRequest::Elicitation(ElicitRequest::new(params)))
}

/// An elicitation answer: `Some((approve, comment))` to decide, `None` when dismissed.
fn decision(value: &Value) -> Result<Option<(bool, Option<String>)>, String> {
    let answer: ElicitResult = serde_json::from_value(value.clone()).map_err(|e| format!("not an elicitation result: {e}"))?;
    let content = answer.content.unwrap_or(Value::Null);
    let comment = content.get("comment").and_then(Value::as_str).map(str::to_owned);
    match answer.action {
        ElicitationAction::Accept => match content.get("decision").and_then(Value::as_str) {
            Some("approve") => Ok(Some((true, comment))),
            Some("reject") => Ok(Some((false, comment))),
            other => Err(format!("`decision` must be \"approve\" or \"reject\", not {other:?}")),
        },
        ElicitationAction::Decline => Ok(Some((false, comment.or_else(|| Some("declined".into()))))),
        ElicitationAction::Cancel => Ok(None),
        other => Err(format!("unknown action {other:?}")),
    }
}

/// How the task ends with its run: completed when it succeeded, cancelled, else failed.
fn ended(detail: RunDetail, created: bool) -> Result<CallToolResult, TaskExit> {
    let run = detail.run;
    match run.status {
        RunStatus::Succeeded => Ok(result(&TriggerOutcome { run_id: run.id.clone(), created, finished: true, run: Some(run), note: None })),
        RunStatus::Cancelled => Err(TaskExit::Cancelled),
        status => {
            let why = run.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default();
            let message = format!("run {} {status}{why}", run.id);
            Err(TaskExit::Error(ErrorData::internal_error(message, Some(serde_json::json!({ "run": run })))))
        }
    }
}

fn result(outcome: &TriggerOutcome) -> CallToolResult {
    CallToolResult::structured(serde_json::to_value(outcome).unwrap_or_default())
}

fn failed(e: ServiceError) -> TaskExit {
    TaskExit::Error(ErrorData::internal_error(e.to_string(), None))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_task_answers_only_the_credential_that_made_it() {
        let headers = |value: &str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert(axum::http::header::AUTHORIZATION, value.parse().unwrap());
            h
        };
        assert_eq!(credential(Some(&headers("Bearer abc"))), Some("abc".into()));
        assert_eq!(credential(Some(&headers("bearer   abc "))), Some("abc".into()), "read as the guard reads it");
        assert_eq!(credential(Some(&headers("Basic abc"))), None);
        assert_eq!(credential(None), None);

        let tasks = Tasks::default();
        let (mine, theirs) = (tasks.hasher.hash_one(Some("abc")), tasks.hasher.hash_one(Some("xyz")));
        tasks.owners.lock().unwrap().insert("t1".into(), mine);
        assert!(tasks.check_owner("t1", mine).is_ok());
        for (id, caller) in [("t1", theirs), ("t1", tasks.hasher.hash_one(None::<&str>)), ("t2", mine)] {
            let e = tasks.check_owner(id, caller).unwrap_err();
            assert_eq!((e.code.0, e.message.as_ref()), (-32602, format!("unknown task: {id}").as_str()));
        }
    }

    #[test]
    fn answers_become_decisions() {
        let accept = |content: Value| json!({"action": "accept", "content": content});
        assert_eq!(decision(&accept(json!({"decision": "approve", "comment": "ok"}))), Ok(Some((true, Some("ok".into())))));
        assert_eq!(decision(&accept(json!({"decision": "reject"}))), Ok(Some((false, None))));
        assert_eq!(decision(&json!({"action": "decline"})), Ok(Some((false, Some("declined".into())))));
        assert_eq!(decision(&json!({"action": "cancel"})), Ok(None));
        assert!(decision(&accept(json!({"decision": "maybe"}))).unwrap_err().contains("\"approve\" or \"reject\""));
        assert!(decision(&json!("yes")).unwrap_err().starts_with("not an elicitation result"));
    }

    #[test]
    fn the_question_offers_approve_and_reject_with_a_comment() {
        let request = elicitation("r1", &Waiting { step: "gate".into(), question: Some(json!("Publish draft?")) }).unwrap();
        let wire = serde_json::to_value(&request).unwrap();
        assert_eq!(wire["params"]["message"], "Run r1 waits for a decision on step \"gate\": Publish draft?");
        assert_eq!(wire["params"]["requestedSchema"]["properties"]["decision"]["enum"], json!(["approve", "reject"]));
        assert_eq!(wire["params"]["requestedSchema"]["required"], json!(["decision"]));
        assert!(wire["params"]["requestedSchema"]["properties"]["comment"].is_object());
    }
}

//! The MCP control surface: one rmcp server handler, [`Control`], whose tools wrap the job
//! service one to one (SPEC §8), plus the seed worker's tool names as aliases. It is served over
//! streamable HTTP at `/mcp` (see `http.rs`) and over stdio (`lamplighter run --mcp-stdio`).
//!
//! Errors come in two kinds. A call the tool cannot accept (unknown tool, arguments of the wrong
//! shape or out of range) is a protocol error (`-32602 invalid params`) naming the field. A call
//! that was understood but could not be done (unknown job, run already finished, config
//! rejected) is a tool error: a result with `isError: true` and a message a person can act on.

use std::borrow::Cow;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::{IntoCallToolResult, ToolCallContext, ToolRouter};
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CompleteRequestParams, CompleteResult,
    ContentBlock, CreateTaskResult, GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult, Implementation,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, MetaObject, NotificationMetaObject,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ResourceUpdatedNotificationParam, ResultType, ServerCapabilities, ServerConfig, SubscribeRequestParams, SubscriptionFilter, Tool,
    UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool, tool_router};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use lamplighter_config::Role;
pub(crate) use lamplighter_contract::ReloadSummary;
use lamplighter_contract::args::{
    self, ArgError, BackfillJobArgs, CreateJobArgs, DecisionArgs, DeleteJobArgs, GetJobArgs, ListJobsArgs, ListRunsArgs, NoArgs, PauseArgs,
    PreviewScheduleArgs, ResumeArgs, RunAgentArgs, RunArgs, RunGroupChatArgs, RunPipelineArgs, RunWorkflowArgs, ScheduleArg, SeedJobArgs,
    SeedPauseArgs, SeedStatusArgs, SeedTriggerArgs, ShiftArg, TriggerArgs, UpdateJobArgs, Which, seed_job_name, wait_timeout,
};
use lamplighter_contract::{
    AgentList, ApprovalList, JobList, JobsChanged, LimitList, PluginList, Run, TriggerAnswer, TriggerOutcome, WorkflowList,
};
use lamplighter_jobs::events::Observer;
use lamplighter_jobs::{
    Backfill, Decision, DecisionRequest, JobDeleted, JobDetail, JobPage, JobRequest, JobSaved, JobService, JobSummary, RunDetail,
    RunFilter, RunPage, RunStatus, SchedulePreview, ScheduleSpec, ServiceError, TriggerRequest, WorkerStatus,
};

use crate::answer::Answer;
use crate::security::Caller;
use crate::tasks::{Follow, Tasks};
use crate::{prompts, resources};

/// The read-only tools `direct.rs` answers outside rmcp, for clients at 2026-07-28.
pub(crate) const DIRECT_TOOLS: [&str; 4] = ["list_jobs", "get_job", "list_runs", "get_run"];

/// What one of [`DIRECT_TOOLS`] read, before it is written as the tool's [`Answer`].
pub(crate) enum Read {
    Jobs(JobPage),
    Job(JobDetail),
    Runs(RunPage),
    Run(RunDetail),
}

impl Read {
    /// The tool's answer, as the tool itself gives it (`None`: a result serde cannot write).
    pub(crate) fn answer(&self) -> Option<Answer> {
        match self {
            Read::Jobs(r) => Answer::of(r),
            Read::Job(r) => Answer::of(r),
            Read::Runs(r) => Answer::of(r),
            Read::Run(r) => Answer::of(r),
        }
        .ok()
    }
}

/// The role each tool needs (`worker.mcp.auth.tokens`): reads, then what operates runs, then
/// what changes jobs or the config.
pub(crate) fn tool_role(tool: &str) -> Role {
    match tool {
        "pause_job"
        | "resume_job"
        | "trigger_job"
        | "cancel_run"
        | "approve_step"
        | "reject_step"
        | "run_workflow"
        | "run_agent"
        | "run_pipeline"
        | "run_group_chat"
        | "scheduler_trigger_job"
        | "scheduler_pause_job"
        | "scheduler_resume_job" => Role::Operate,
        "create_job" | "update_job" | "delete_job" | "backfill_job" | "reload_config" => Role::Manage,
        _ => Role::Read,
    }
}

/// Who calls: the caller the HTTP guard admitted, or (stdio, where the client launched the
/// worker itself) a trusted one.
pub(crate) fn caller_of(extensions: &rmcp::model::Extensions) -> Caller {
    extensions.get::<axum::http::request::Parts>().and_then(|parts| parts.extensions.get::<Caller>()).cloned().unwrap_or(Caller::TRUSTED)
}

/// `tools/list` order: the SPEC §8 tools, then the seed worker's names.
const TOOL_ORDER: [&str; 32] = args::TOOLS;

const INSTRUCTIONS: &str = "Lamplighter is a scheduler worker. List, inspect, pause, resume and trigger jobs; follow, list and \
     cancel runs; run workflows, agents, pipelines and group chats, and approve or reject what waits for a person; list \
     workflows, agents and plugins; \
     reload the config. Job and run errors come back as tool results with \
     isError set and a message that says what to do.";

/// How often `trigger_job … wait` reports progress (and re-reads the run) while it waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// A reload request: the main loop in `run.rs` reloads and answers on the enclosed channel with
/// the summary, or with every config error (`file:line:col: error: …`) when the new config was
/// rejected and the old one kept.
pub(crate) type ReloadReply = oneshot::Sender<Result<ReloadSummary, Vec<String>>>;

/// The MCP server handler. Cheap to clone: the HTTP transport makes one per session or request.
#[derive(Clone)]
pub(crate) struct Control {
    service: JobService,
    reload: mpsc::Sender<ReloadReply>,
    /// Cancelled when the worker stops serving: waits end and streams close.
    stop: CancellationToken,
    /// The tools, routed and as listed: built at the first request that needs them, not at
    /// start (their schemas are about 2.8 MB a worker nobody asks does not need).
    tools: Arc<LazyLock<Toolbox>>,
    /// Counts the requests (`lamplighter.mcp.requests`).
    observer: Arc<Observer>,
    /// This session's `resources/subscribe` subscriptions (clients before 2026-07-28), by URI:
    /// each a watch that `resources/unsubscribe` (or the worker's stop) ends.
    subscriptions: Arc<Mutex<HashMap<String, CancellationToken>>>,
    /// The runs followed as MCP tasks, shared by every session.
    tasks: Tasks,
}

impl Control {
    pub(crate) fn new(service: JobService, reload: mpsc::Sender<ReloadReply>, stop: CancellationToken, observer: Arc<Observer>) -> Self {
        Self {
            service,
            reload,
            stop,
            tools: Arc::new(LazyLock::new(Toolbox::build)),
            observer,
            subscriptions: Arc::default(),
            tasks: Tasks::default(),
        }
    }

    /// The handler for a new session: the same worker, its own subscriptions.
    pub(crate) fn for_session(&self) -> Self {
        Self { subscriptions: Arc::default(), ..self.clone() }
    }

    pub(crate) fn service(&self) -> &JobService {
        &self.service
    }

    /// The tools served now to a caller of `role`: those its role allows, and the job-changing
    /// ones only while `worker.mcp.manage_jobs` is on.
    fn served(&self, role: Role) -> impl Iterator<Item = &Tool> {
        let manage = self.service.manages_jobs();
        self.tools.listed.iter().filter(move |t| (manage || !args::MANAGE_TOOLS.contains(&t.name.as_ref())) && tool_role(&t.name) <= role)
    }

    /// Counts a call `direct.rs` answered from what it kept.
    pub(crate) fn observe_kept(&self, tool: &str) {
        self.observer.mcp_request(tool, true);
    }

    /// Cancelled when the worker stops serving MCP.
    pub(crate) fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }
}

/// Serves MCP over stdin/stdout until stdin closes (the client went away) or `stop` is
/// cancelled. Logs go to stderr, so stdout carries only protocol messages.
pub(crate) async fn serve_stdio(control: Control, stop: CancellationToken) {
    // Non-blocking pipes when the client launched us with pipes (the usual case), so a pending
    // read never keeps the runtime from shutting down.
    let transport = rmcp::transport::stdio_pipes();
    match control.serve_with_ct(transport, stop.child_token()).await {
        Ok(running) => match running.waiting().await {
            Ok(reason) => tracing::info!(?reason, "MCP over stdio ended"),
            Err(e) => tracing::warn!(error = %e, "MCP over stdio stopped abnormally"),
        },
        Err(e) => tracing::info!(error = %e, "MCP over stdio ended before a client spoke"),
    }
}

// ---------------------------------------------------------------------------------------------
// Arguments

/// Tool arguments, deserialized strictly: unknown fields and wrong types are protocol errors
/// (`-32602`) that name the field.
///
/// It has to be called `Parameters`: `#[tool]` finds a tool's input schema by that name. It
/// replaces rmcp's own `Parameters`, which reports bad arguments as tool results (`isError`)
/// without saying which field was wrong.
struct Parameters<P>(P);

impl<P: JsonSchema> JsonSchema for Parameters<P> {
    fn inline_schema() -> bool {
        P::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        P::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        P::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        P::json_schema(generator)
    }
}

impl<'a, S, P: DeserializeOwned> FromContextPart<ToolCallContext<'a, S>> for Parameters<P> {
    fn from_context_part(context: &mut ToolCallContext<'a, S>) -> Result<Self, ErrorData> {
        let tool = &context.name;
        args::from_arguments(tool, context.arguments.take().unwrap_or_default())
            .map(Parameters)
            .map_err(|e| ErrorData::invalid_params(e.message, Some(serde_json::json!({ "tool": tool, "field": e.field }))))
    }
}

/// A tool's typed result. rmcp's `#[tool]` reads the output schema off a return type named
/// `Json<T>`; unlike rmcp's own, this one writes the result once ([`Answer`]) and takes both the
/// structured content and the text from that JSON.
struct Json<T>(T);

impl<T: Serialize> IntoCallToolResult for Json<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        let answer =
            Answer::of(&self.0).map_err(|e| ErrorData::internal_error(format!("cannot serialize the tool's result: {e}"), None))?;
        Ok(answer.into_result().into())
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

/// Why a tool call did not succeed.
enum Failure {
    /// Understood but not done: a result with `isError: true` and this message.
    Tool(String),
    /// Not acceptable as a call (bad arguments): a JSON-RPC error.
    Protocol(ErrorData),
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Self {
        let message: String = message.into();
        Failure::Protocol(ErrorData::invalid_params(message, None))
    }
}

impl From<ArgError> for Failure {
    fn from(e: ArgError) -> Self {
        Failure::invalid(e.message)
    }
}

impl From<ServiceError> for Failure {
    fn from(e: ServiceError) -> Self {
        if matches!(e, ServiceError::Storage(_)) {
            tracing::warn!(error = %e, "storage error while serving an MCP call");
        }
        // Arguments the service refuses are bad arguments, like those serde refuses.
        if let ServiceError::InvalidArgument(m) = e {
            return Failure::invalid(m);
        }
        Failure::Tool(e.to_string())
    }
}

impl IntoCallToolResult for Failure {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        match self {
            Failure::Tool(message) => Ok(tool_error(message).into()),
            Failure::Protocol(error) => Err(error),
        }
    }
}

/// A tool error: the call was understood but could not be done; the message says why.
fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

// ---------------------------------------------------------------------------------------------
// Tools

#[tool_router]
#[allow(unreachable_pub, reason = "#[tool] generates `pub fn …_tool_attr` on this crate-private type")]
impl Control {
    /// Worker health: version, uptime, jobs, running runs, queue depth and storage.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn worker_status(&self, _: Parameters<NoArgs>) -> Result<Json<WorkerStatus>, Failure> {
        Ok(Json(self.service.worker_status().await?))
    }

    /// The configured jobs by name, one page at a time (pass `next_cursor` back as `cursor`): target, schedule, time zone, enabled/paused state, next fire time and last run.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_jobs(&self, Parameters(a): Parameters<ListJobsArgs>) -> Result<Json<JobPage>, Failure> {
        Ok(Json(self.jobs_page(a).await?))
    }

    /// One job in detail: its next fire times (UTC and the job's zone), run counts by status, recent runs, its catch-up, overlap, timeout and retry policy, and where it is defined (`origin`: a file and line, or created at runtime by whom, when, at which version). A runtime job also shows its definition and its changes (`history`: who, when, before and after).
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn get_job(&self, Parameters(a): Parameters<GetJobArgs>) -> Result<Json<JobDetail>, Failure> {
        Ok(Json(self.job_detail(&a).await?))
    }

    /// The next fire times of a schedule (`cron`, `every` or `at`, with `timezone`) before any job uses it, in its zone and UTC, with the daylight-saving changes they cross and warnings (it fires very often, or never). With `calendar`, only fires on that calendar's days, and the days passed over with why (with `shift: previous | next`, a fire on a day off the calendar moves to its day before or after, and the days shifted are listed); `from` previews from another instant than now. For checking a translation of "every weekday at 7:30 Berlin time" before saving it.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn preview_schedule(&self, Parameters(a): Parameters<PreviewScheduleArgs>) -> Result<Json<SchedulePreview>, Failure> {
        let (schedule, count) = a.schedule()?;
        let spec = match schedule {
            ScheduleArg::Cron(s) => ScheduleSpec::Cron(s),
            ScheduleArg::Every(s) => ScheduleSpec::Every(s),
            ScheduleArg::At(s) => ScheduleSpec::At(s),
        };
        let shift = match a.shift {
            None => lamplighter_config::Shift::Skip,
            Some(ShiftArg::Previous) => lamplighter_config::Shift::Previous,
            Some(ShiftArg::Next) => lamplighter_config::Shift::Next,
        };
        let calendar = a.calendar.as_deref().map(|c| (c, shift));
        if a.shift.is_some() && calendar.is_none() {
            return Err(ServiceError::InvalidArgument(
                "shift: moves fires off a calendar's days, so it needs calendar; give calendar: NAME".into(),
            )
            .into());
        }
        Ok(Json(self.service.preview_schedule(spec, a.timezone.as_deref(), calendar, a.from.as_deref(), count)?))
    }

    /// Creates a job at runtime, stored in the worker's database and scheduled by every worker from the moment it is saved, with no reload. `definition` is the job exactly as its entry under `scheduling.jobs` in YAML (as JSON, or as YAML text): a schedule (`cron` with `timezone`, `every` or `at`), a target (`workflow`, `agent`, or `plugin` with `action`), and optional `input`, `parameters`, `catch_up`, `overlap`, `retries`, `timeout`. Every error is returned at once, naming its field. Answers the compiled job, its next 10 fire times in its zone and UTC (with daylight-saving notes and warnings) and its version. With `dry_run`, nothing is saved: check a definition first.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false))]
    async fn create_job(
        &self,
        Parameters(a): Parameters<CreateJobArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<JobSaved>, Failure> {
        let request =
            JobRequest { name: a.name, definition: a.definition, expected_version: None, dry_run: a.dry_run, actor: client_name(&ctx) };
        Ok(Json(self.service.create_job(request).await?))
    }

    /// Replaces a runtime job's definition, whole (as `create_job` takes it); every worker reschedules it at once. Pass the `version` you read (`origin.version` in `get_job`) as `expected_version`: a job changed since is refused, naming its current version. Jobs of the config files are read-only. With `dry_run`, nothing is saved.
    #[tool(annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false))]
    async fn update_job(
        &self,
        Parameters(a): Parameters<UpdateJobArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<JobSaved>, Failure> {
        let request = JobRequest {
            name: a.name,
            definition: a.definition,
            expected_version: Some(a.expected_version),
            dry_run: a.dry_run,
            actor: client_name(&ctx),
        };
        Ok(Json(self.service.update_job(request).await?))
    }

    /// Deletes a runtime job: it stops firing on every worker; its runs and its history stay readable. Runs in flight finish unless `cancel_runs`. Jobs of the config files are read-only.
    #[tool(annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false))]
    async fn delete_job(
        &self,
        Parameters(a): Parameters<DeleteJobArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<JobDeleted>, Failure> {
        Ok(Json(self.service.delete_job(&a.name, Some(a.expected_version), a.cancel_runs, &client_name(&ctx)).await?))
    }

    /// Runs a job's past ticks in a window (`from`, `to`: RFC 3339) that have no run yet, once each and in order, one at a time; ticks that already ran are listed, not run again. With `dry_run`, only lists them.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = true))]
    async fn backfill_job(&self, Parameters(a): Parameters<BackfillJobArgs>) -> Result<Json<Backfill>, Failure> {
        let (from, to) = a.window()?;
        Ok(Json(self.service.backfill_job(&a.name, from, to, a.dry_run).await?))
    }

    /// Pauses a job: it stops firing until resumed (persisted across restarts; manual triggers still work). Pausing a paused job updates the reason.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false))]
    async fn pause_job(&self, Parameters(a): Parameters<PauseArgs>) -> Result<Json<JobsChanged>, Failure> {
        let reason = a.reason.as_deref();
        Ok(Json(match a.which()? {
            Which::Name(name) => JobsChanged { job: Some(self.service.pause_job(name, reason).await?), group: None },
            Which::Tag(tag) => JobsChanged { job: None, group: Some(self.service.set_tag_paused(tag, true, reason).await?) },
        }))
    }

    /// Resumes a paused job. Ticks missed while it was paused are not caught up.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false))]
    async fn resume_job(&self, Parameters(a): Parameters<ResumeArgs>) -> Result<Json<JobsChanged>, Failure> {
        Ok(Json(match a.which()? {
            Which::Name(name) => JobsChanged { job: Some(self.service.resume_job(name).await?), group: None },
            Which::Tag(tag) => JobsChanged { job: None, group: Some(self.service.set_tag_paused(tag, false, None).await?) },
        }))
    }

    /// Starts a run of a job now, paused or not, optionally with its own input, parameters and idempotency key. Returns the run id at once; with `wait`, waits for the run to finish (sending progress notifications) and returns it.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true))]
    async fn trigger_job(
        &self,
        Parameters(a): Parameters<TriggerArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TriggerAnswer>, Failure> {
        let timeout = wait_timeout(a.wait, a.timeout_seconds)?;
        let request = TriggerRequest {
            input: a.input.clone(),
            parameters: a.parameters.clone().map(Value::Object),
            idempotency_key: a.idempotency_key.clone(),
            requested_by: Some(client_name(&ctx)),
        };
        match a.which()? {
            Which::Name(name) => {
                let triggered = self.service.trigger_job(name, request).await?;
                let Json(run) = self.outcome(triggered, a.wait, timeout, &ctx).await?;
                Ok(Json(TriggerAnswer { run: Some(run), group: None }))
            }
            Which::Tag(tag) => Ok(Json(TriggerAnswer { run: None, group: Some(self.service.trigger_tag(tag, request).await?) })),
        }
    }

    /// Lists runs, newest first, filtered by job and status, one page at a time: pass `next_cursor` back as `cursor` for the next page.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_runs(&self, Parameters(a): Parameters<ListRunsArgs>) -> Result<Json<RunPage>, Failure> {
        Ok(Json(self.runs_page(a).await?))
    }

    /// One run in full: trigger, times, status, attempt, input, parameters, output, error, worker, token usage, and for a workflow run each step (status, attempt, times, output, error) as a tree.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn get_run(&self, Parameters(a): Parameters<RunArgs>) -> Result<Json<RunDetail>, Failure> {
        Ok(Json(self.service.get_run_detail(&a.id).await?))
    }

    /// Cancels a queued or running run and returns it. A run that already finished cannot be cancelled.
    #[tool(annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false))]
    async fn cancel_run(&self, Parameters(a): Parameters<RunArgs>) -> Result<Json<Run>, Failure> {
        Ok(Json(self.service.cancel_run(&a.id).await?))
    }

    /// Workflow steps waiting for a person to approve or reject them: run, job, step, the question, since when, and when a timeout decides.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_approvals(&self, _: Parameters<NoArgs>) -> Result<Json<ApprovalList>, Failure> {
        Ok(Json(ApprovalList { approvals: self.service.list_approvals().await? }))
    }

    /// The limits jobs share (`scheduling.limits`): for each, its slots per key, the runs holding them (running, or handed to the queue and about to start) and the runs waiting, first in line first, with since when the longest has waited.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_limits(&self, _: Parameters<NoArgs>) -> Result<Json<LimitList>, Failure> {
        Ok(Json(LimitList { limits: self.service.list_limits().await? }))
    }

    /// Approves a workflow step that waits for a person, with an optional comment; the run continues. Deciding a step twice, or a run that is not waiting, is an error that says who decided.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false))]
    async fn approve_step(
        &self,
        Parameters(a): Parameters<DecisionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Decision>, Failure> {
        self.decide(a, true, &ctx).await
    }

    /// Rejects a workflow step that waits for a person, with an optional comment; the run fails naming the step.
    #[tool(annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false))]
    async fn reject_step(
        &self,
        Parameters(a): Parameters<DecisionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<Decision>, Failure> {
        self.decide(a, false, &ctx).await
    }

    /// Runs a workflow by hand, without a job, with an optional input and idempotency key (as `lampctl workflows run`). Returns the run id at once; with `wait`, waits for the run to finish (sending progress notifications) and returns it.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true))]
    async fn run_workflow(
        &self,
        Parameters(a): Parameters<RunWorkflowArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TriggerOutcome>, Failure> {
        let timeout = wait_timeout(a.wait, a.timeout_seconds)?;
        let started = self.service.run_workflow(&a.name, a.input, a.idempotency_key, Some(client_name(&ctx))).await?;
        self.outcome(started, a.wait, timeout, &ctx).await
    }

    /// Runs an agent by hand on a task (its input), as a durable run with its transcript, listed under the job `agent:NAME` (as `lampctl agents run`). Returns the run id at once; with `wait`, waits for the run to finish (sending progress notifications) and returns it.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true))]
    async fn run_agent(
        &self,
        Parameters(a): Parameters<RunAgentArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TriggerOutcome>, Failure> {
        let timeout = wait_timeout(a.wait, a.timeout_seconds)?;
        let started = self.service.run_agent(&a.name, a.input, a.idempotency_key, Some(client_name(&ctx))).await?;
        self.outcome(started, a.wait, timeout, &ctx).await
    }

    /// Runs a named pipeline by hand: its agents in order, each given the previous one's answer, as one durable run listed under the job `pipeline:NAME`. Returns the run id at once; with `wait`, waits for it to finish and returns it.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true))]
    async fn run_pipeline(
        &self,
        Parameters(a): Parameters<RunPipelineArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TriggerOutcome>, Failure> {
        let timeout = wait_timeout(a.wait, a.timeout_seconds)?;
        let started = self.service.run_pipeline(&a.name, a.input, a.idempotency_key, Some(client_name(&ctx))).await?;
        self.outcome(started, a.wait, timeout, &ctx).await
    }

    /// Runs a group chat by hand (as `lampctl agents chat a,b,c`): the agents speak in turn, each given the previous one's answer, `max_iterations` rounds; one durable run listed under the job `group-chat:A,B,C`. Returns the run id at once; with `wait`, waits for it to finish and returns it.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true))]
    async fn run_group_chat(
        &self,
        Parameters(a): Parameters<RunGroupChatArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TriggerOutcome>, Failure> {
        let timeout = wait_timeout(a.wait, a.timeout_seconds)?;
        a.checked()?;
        let started = self.service.run_group_chat(&a.agents, a.max_iterations, a.input, a.idempotency_key, Some(client_name(&ctx))).await?;
        self.outcome(started, a.wait, timeout, &ctx).await
    }

    /// The configured workflows: description, trigger, number of steps, and why one is disabled.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_workflows(&self, _: Parameters<NoArgs>) -> Result<Json<WorkflowList>, Failure> {
        Ok(Json(WorkflowList { workflows: self.service.list_workflows() }))
    }

    /// The configured agents: description, model, provider, plugins, MCP servers, and why one is disabled.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_agents(&self, _: Parameters<NoArgs>) -> Result<Json<AgentList>, Failure> {
        Ok(Json(AgentList { agents: self.service.list_agents() }))
    }

    /// The plugins this worker knows: version, kind, description, actions with their parameter schemas, and why one cannot be used.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_plugins(&self, _: Parameters<NoArgs>) -> Result<Json<PluginList>, Failure> {
        Ok(Json(PluginList { plugins: self.service.list_plugins() }))
    }

    /// Reloads the config from disk, as SIGHUP does: jobs are added, removed and changed without a restart. An invalid config is rejected with every error and its location, and the running config is kept.
    #[tool(annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false))]
    async fn reload_config(&self, _: Parameters<NoArgs>) -> Result<Json<ReloadSummary>, Failure> {
        let shutting_down = || Failure::Tool("the worker is shutting down; the config was not reloaded".into());
        let (reply, answer) = oneshot::channel();
        self.reload.send(reply).await.map_err(|_| shutting_down())?;
        match answer.await {
            Ok(Ok(summary)) => Ok(Json(summary)),
            Ok(Err(diagnostics)) => Err(Failure::Tool(format!(
                "config reload rejected; the running config is kept. Fix these and reload again:\n{}",
                diagnostics.join("\n")
            ))),
            Err(_) => Err(shutting_down()),
        }
    }

    /// Seed-compatible name of `list_jobs`.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn scheduler_list_jobs(&self, _: Parameters<NoArgs>) -> Result<Json<JobList>, Failure> {
        self.do_list_jobs().await
    }

    /// Seed-compatible name of `trigger_job` (without waiting): starts a run of the job (`job_name` or `name`) now and returns its id.
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true))]
    async fn scheduler_trigger_job(
        &self,
        Parameters(a): Parameters<SeedTriggerArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<TriggerOutcome>, Failure> {
        let name = seed_job_name(a.name, a.job_name)?;
        let request = TriggerRequest {
            input: a.input,
            parameters: a.parameters.map(Value::Object),
            idempotency_key: a.idempotency_key,
            requested_by: Some(client_name(&ctx)),
        };
        let triggered = self.service.trigger_job(&name, request).await?;
        Ok(Json(TriggerOutcome { run_id: triggered.run_id, created: triggered.created, run: None, finished: false, note: None }))
    }

    /// Seed-compatible name of `pause_job` (the job as `job_name` or `name`).
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false))]
    async fn scheduler_pause_job(&self, Parameters(a): Parameters<SeedPauseArgs>) -> Result<Json<JobSummary>, Failure> {
        let name = seed_job_name(a.name, a.job_name)?;
        Ok(Json(self.service.pause_job(&name, a.reason.as_deref()).await?))
    }

    /// Seed-compatible name of `resume_job` (the job as `job_name` or `name`).
    #[tool(annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false))]
    async fn scheduler_resume_job(&self, Parameters(a): Parameters<SeedJobArgs>) -> Result<Json<JobSummary>, Failure> {
        let name = seed_job_name(a.name, a.job_name)?;
        Ok(Json(self.service.resume_job(&name).await?))
    }

    /// Seed-compatible name of `get_job` (the job as `job_name` or `name`).
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn scheduler_job_status(&self, Parameters(a): Parameters<SeedStatusArgs>) -> Result<Json<JobDetail>, Failure> {
        let name = seed_job_name(a.name, a.job_name)?;
        Ok(Json(self.job_detail(&GetJobArgs { name, next: a.next, history: None }).await?))
    }

    /// Seed-compatible name of `list_plugins`.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn worker_plugin_list(&self, _: Parameters<NoArgs>) -> Result<Json<PluginList>, Failure> {
        Ok(Json(PluginList { plugins: self.service.list_plugins() }))
    }
}

impl Control {
    /// `trigger_job` and `run_workflow` with `wait`, from a client that declares the tasks
    /// extension: the run starts as the tool would start it, and the answer is a task that
    /// follows it (see `tasks.rs`). `None` for every other call, and for arguments the tool
    /// itself must refuse (it says why).
    async fn as_task(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Option<Result<CallToolResponse, ErrorData>> {
        if !context.client_capabilities().is_some_and(|c| c.supports_tasks()) {
            return None;
        }
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        let (started, timeout) = match request.name.as_ref() {
            "trigger_job" => {
                let a: TriggerArgs = serde_json::from_value(args).ok()?;
                let timeout = wait_timeout(a.wait, a.timeout_seconds).ok()?;
                let Ok(Which::Name(name)) = a.which() else { return None };
                let name = name.to_owned();
                if !a.wait {
                    return None;
                }
                let trigger = TriggerRequest {
                    input: a.input,
                    parameters: a.parameters.map(Value::Object),
                    idempotency_key: a.idempotency_key,
                    requested_by: Some(client_name(context)),
                };
                (self.service.trigger_job(&name, trigger).await, timeout)
            }
            "run_workflow" => {
                let a: RunWorkflowArgs = serde_json::from_value(args).ok()?;
                let timeout = wait_timeout(a.wait, a.timeout_seconds).ok()?;
                if !a.wait {
                    return None;
                }
                (self.service.run_workflow(&a.name, a.input, a.idempotency_key, Some(client_name(context))).await, timeout)
            }
            "run_agent" => {
                let a: RunAgentArgs = serde_json::from_value(args).ok()?;
                let timeout = wait_timeout(a.wait, a.timeout_seconds).ok()?;
                if !a.wait {
                    return None;
                }
                (self.service.run_agent(&a.name, a.input, a.idempotency_key, Some(client_name(context))).await, timeout)
            }
            "run_pipeline" => {
                let a: RunPipelineArgs = serde_json::from_value(args).ok()?;
                let timeout = wait_timeout(a.wait, a.timeout_seconds).ok()?;
                if !a.wait {
                    return None;
                }
                (self.service.run_pipeline(&a.name, a.input, a.idempotency_key, Some(client_name(context))).await, timeout)
            }
            "run_group_chat" => {
                let a: RunGroupChatArgs = serde_json::from_value(args).ok()?;
                let timeout = wait_timeout(a.wait, a.timeout_seconds).ok()?;
                if !a.wait || a.checked().is_err() {
                    return None;
                }
                let by = Some(client_name(context));
                (self.service.run_group_chat(&a.agents, a.max_iterations, a.input, a.idempotency_key, by).await, timeout)
            }
            _ => return None,
        };
        let started = match started {
            Ok(started) => started,
            Err(e) => return Some(Failure::from(e).into_call_tool_result()),
        };
        let decided_by = format!("{} (task)", client_name(context));
        let follow = Follow { run_id: started.run_id, created: started.created, timeout, decided_by };
        let task = self.tasks.start(self.service.clone(), follow, context);
        Some(Ok(CallToolResponse::Task(CreateTaskResult::new(task))))
    }

    async fn do_list_jobs(&self) -> Result<Json<JobList>, Failure> {
        Ok(Json(JobList { jobs: self.service.list_jobs().await? }))
    }

    async fn job_detail(&self, a: &GetJobArgs) -> Result<JobDetail, Failure> {
        let next = args::next_fires(a.next)?;
        Ok(self.service.get_job_with_history(&a.name, next, a.history()?).await?)
    }

    async fn jobs_page(&self, a: ListJobsArgs) -> Result<JobPage, Failure> {
        let limit = a.page_size()?;
        Ok(self.service.list_jobs_page(a.cursor.as_deref(), limit, a.tag.as_deref()).await?)
    }

    async fn runs_page(&self, a: ListRunsArgs) -> Result<RunPage, Failure> {
        let q = a.query()?;
        Ok(self.service.list_runs(RunFilter { job: q.job, status: q.status, limit: Some(q.limit), before: q.before }).await?)
    }

    /// A call to one of [`DIRECT_TOOLS`], for `direct.rs`: what the tool answers, or `None`
    /// when the arguments are refused, the call fails or panics. rmcp then takes the request
    /// and words the refusal; these tools only read, so running one twice changes nothing.
    pub(crate) async fn read_directly(&self, tool: &str, arguments: Map<String, Value>) -> Option<Read> {
        let read = async {
            match tool {
                "list_jobs" => self.jobs_page(args::from_arguments(tool, arguments).ok()?).await.ok().map(Read::Jobs),
                "get_job" => {
                    let a: GetJobArgs = args::from_arguments(tool, arguments).ok()?;
                    self.job_detail(&a).await.ok().map(Read::Job)
                }
                "list_runs" => self.runs_page(args::from_arguments(tool, arguments).ok()?).await.ok().map(Read::Runs),
                "get_run" => {
                    let a: RunArgs = args::from_arguments(tool, arguments).ok()?;
                    self.service.get_run_detail(&a.id).await.ok().map(Read::Run)
                }
                _ => None,
            }
        };
        let Ok(read) = AssertUnwindSafe(read).catch_unwind().await else {
            tracing::error!(tool, "MCP tool call panicked (answered directly); rmcp answers it instead");
            return None;
        };
        let read = read?;
        self.observer.mcp_request(tool, true);
        Some(read)
    }

    /// Records a decision; `decided_by` defaults to the MCP client's name.
    async fn decide(&self, a: DecisionArgs, approve: bool, ctx: &RequestContext<RoleServer>) -> Result<Json<Decision>, Failure> {
        // A named token is always on the record: what a client says about who decided is kept
        // beside it, never instead of it.
        let decided_by = match (a.decided_by, caller_of(&ctx.extensions).actor) {
            (Some(by), Some(actor)) => format!("{by} ({actor})"),
            (Some(by), None) => by,
            (None, _) => client_name(ctx),
        };
        let request = DecisionRequest { run_id: a.run_id, step: a.step, approve, comment: a.comment, decided_by };
        Ok(Json(self.service.decide(request).await?))
    }

    /// A started run, returned at once, or after waiting for it when asked to.
    async fn outcome(
        &self,
        started: lamplighter_jobs::Triggered,
        wait: bool,
        timeout: Option<Duration>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Json<TriggerOutcome>, Failure> {
        if !wait {
            return Ok(Json(TriggerOutcome { run_id: started.run_id, created: started.created, run: None, finished: false, note: None }));
        }
        let (run, note) = self.wait_for(&started.run_id, timeout, ctx).await?;
        let finished = run.status.is_final();
        Ok(Json(TriggerOutcome { run_id: started.run_id, created: started.created, run: Some(run), finished, note }))
    }

    /// Waits for a run to reach a final status, reporting progress every [`PROGRESS_EVERY`]
    /// when the caller asked for it. Returns early, with the run as it is and a note, when
    /// `timeout` passes, the caller cancels, or the worker stops.
    async fn wait_for(
        &self,
        run_id: &str,
        timeout: Option<Duration>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(Run, Option<String>), Failure> {
        let progress_token = ctx.meta.get_progress_token();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let limit = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(limit);
        let mut reports: u32 = 0;
        // The first report goes out at once: it tells the caller the run's id (in `_meta`), so a
        // client that gives up waiting can still say which run goes on.
        if let Some(token) = &progress_token {
            self.report(ctx, token, &mut reports, run_id, "queued").await;
        }
        // The run alone: the progress reported is its status.
        let mut follow = self.service.follow::<Run>(run_id);
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        let mut run: Option<Run> = None;
        loop {
            tokio::select! {
                biased;
                () = ctx.ct.cancelled() => return self.run_now(run_id, "the caller cancelled the wait; the run goes on").await,
                () = self.stop.cancelled() => return self.run_now(run_id, "the worker is shutting down").await,
                () = &mut limit => {
                    let run = match run {
                        Some(r) => r,
                        None => self.service.get_run(run_id).await?,
                    };
                    let note = format!("stopped waiting after {} s; the run is still {}", timeout.unwrap_or_default().as_secs(), run.status);
                    return Ok((run, Some(note)));
                }
                next = follow.next() => match next {
                    Some(now) => {
                        let now = now?;
                        if now.status.is_final() {
                            return Ok((now, None));
                        }
                        run = Some(now);
                    }
                    None => return self.run_now(run_id, "the run can no longer be followed").await,
                },
                _ = every.tick() => {
                    if let (Some(token), Some(run)) = (&progress_token, &run) {
                        let status = match run.status {
                            RunStatus::WaitingApproval => format!("waiting for approval (lampctl approvals approve {})", run.id),
                            other => other.as_str().to_string(),
                        };
                        self.report(ctx, token, &mut reports, &run.id, &status).await;
                    }
                }
            }
        }
    }

    async fn report(&self, ctx: &RequestContext<RoleServer>, token: &ProgressToken, reports: &mut u32, run_id: &str, status: &str) {
        *reports = reports.saturating_add(1);
        let mut meta = Map::new();
        meta.insert("run_id".into(), Value::from(run_id));
        let mut param =
            ProgressNotificationParam::new(token.clone(), f64::from(*reports)).with_message(format!("run {run_id} is {status}"));
        param.meta = Some(NotificationMetaObject(MetaObject(meta)));
        if let Err(e) = ctx.peer.notify_progress(param).await {
            tracing::debug!(error = %e, "cannot send a progress notification");
        }
    }

    async fn run_now(&self, run_id: &str, note: &str) -> Result<(Run, Option<String>), Failure> {
        let run = self.service.get_run(run_id).await?;
        let note = (!run.status.is_final()).then(|| note.to_string());
        Ok((run, note))
    }
}

/// Who a call comes from, as records name it: the MCP client's name.
/// Who a call comes from, as records name it: the token's name when tokens have names, else
/// the MCP client's (the request's own client info first: clients at 2026-07-28 send it with
/// each request; else the session's).
fn client_name(ctx: &RequestContext<RoleServer>) -> String {
    if let Some(actor) = caller_of(&ctx.extensions).actor {
        return actor;
    }
    match ctx.client_info().or_else(|| ctx.peer.peer_info().map(|i| i.client_info.clone())) {
        Some(info) => format!("mcp client {}", info.name),
        None => "mcp client".to_string(),
    }
}

/// The tool router and every tool in [`TOOL_ORDER`] as listed, made together once.
struct Toolbox {
    router: ToolRouter<Control>,
    listed: Box<[Tool]>,
}

impl Toolbox {
    fn build() -> Self {
        let router = Control::tool_router();
        let listed = listed_tools(&router).into();
        Self { router, listed }
    }
}

// ---------------------------------------------------------------------------------------------
/// The tools as `tools/list` shows them: in [`TOOL_ORDER`], every schema an object.
fn listed_tools(tools: &ToolRouter<Control>) -> Vec<Tool> {
    let mut listed: Vec<Tool> = TOOL_ORDER.iter().filter_map(|name| tools.get(name).cloned()).collect();
    // A tool missing from TOOL_ORDER is still listed (last, by name) rather than hidden.
    let mut rest: Vec<Tool> = tools.list_all().into_iter().filter(|t| !TOOL_ORDER.iter().any(|n| *n == t.name)).collect();
    debug_assert!(rest.is_empty(), "tools missing from TOOL_ORDER: {:?}", rest.iter().map(|t| &t.name).collect::<Vec<_>>());
    listed.append(&mut rest);
    for tool in &mut listed {
        // Tools without arguments have no `properties`; some clients insist on the key.
        if !tool.input_schema.contains_key("properties") {
            Arc::make_mut(&mut tool.input_schema).insert("properties".into(), Value::Object(Map::new()));
        }
        // schemars writes `true` for any-JSON fields (e.g. a run's `input`); MCP Inspector
        // 0.15 (TypeScript SDK) rejects a whole `tools/list` for a boolean sub-schema.
        objects_for_boolean_schemas(Arc::make_mut(&mut tool.input_schema));
        if let Some(out) = tool.output_schema.as_mut() {
            let out = Arc::make_mut(out);
            objects_for_boolean_schemas(out);
            // A client checks results against the output schema; the prose is for people, who
            // read it in the Rust types and the README. Without it `tools/list` is a third
            // smaller (113 KB → 78 KB for 31 tools; BENCHMARKS.md). Input schemas keep theirs:
            // a model reads them to call the tool.
            without_prose(out);
        }
    }
    listed
}

/// Removes the `description` and `title` keywords from a schema and every sub-schema in it
/// (a property *named* `description` stays: `properties` maps names to schemas).
fn without_prose(schema: &mut Map<String, Value>) {
    schema.remove("description");
    schema.remove("title");
    for (k, v) in schema.iter_mut() {
        match (k.as_str(), v) {
            ("properties" | "$defs" | "definitions" | "patternProperties", Value::Object(named)) => {
                for sub in named.values_mut() {
                    if let Value::Object(o) = sub {
                        without_prose(o);
                    }
                }
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(list)) => {
                for sub in list {
                    if let Value::Object(o) = sub {
                        without_prose(o);
                    }
                }
            }
            (
                "items" | "additionalProperties" | "additionalItems" | "not" | "if" | "then" | "else" | "contains" | "propertyNames",
                Value::Object(o),
            ) => without_prose(o),
            _ => {}
        }
    }
}

/// Rewrites every boolean sub-schema of `schema` as the object that means the same: `true` as
/// `{}`, `false` as `{"not": {}}`.
fn objects_for_boolean_schemas(schema: &mut Map<String, Value>) {
    fn fix(v: &mut Value) {
        match v {
            Value::Bool(true) => *v = Value::Object(Map::new()),
            Value::Bool(false) => *v = serde_json::json!({"not": {}}),
            Value::Object(o) => objects_for_boolean_schemas(o),
            _ => {}
        }
    }
    for (k, v) in schema.iter_mut() {
        match (k.as_str(), v) {
            // A sub-schema.
            ("items" | "additionalProperties" | "additionalItems" | "not" | "if" | "then" | "else" | "contains" | "propertyNames", v) => {
                fix(v)
            }
            // A list of sub-schemas.
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(a)) => a.iter_mut().for_each(fix),
            // A map of sub-schemas.
            ("properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas", Value::Object(o)) => {
                o.values_mut().for_each(fix)
            }
            _ => {}
        }
    }
}

// The handler

impl ServerHandler for Control {
    /// Exactly what is served: tools (a fixed list). No prompts, resources, completions or
    /// logging, so those methods answer "method not found".
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .enable_tasks()
            .enable_prompts()
            .enable_completions()
            .build();
        if let Some(tools) = capabilities.tools.as_mut() {
            tools.list_changed = Some(false);
        }
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("lamplighter", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn call_tool(&self, request: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.clone();
        if self.tools.router.get(&name).is_none() {
            return Err(ErrorData::invalid_params(format!("unknown tool \"{name}\"; known tools: {}", TOOL_ORDER.join(", ")), None));
        }
        let caller = caller_of(&context.extensions);
        let needs = tool_role(&name);
        if needs > caller.role {
            self.observer.mcp_request(&name, false);
            let who = caller.actor.as_deref().unwrap_or("this caller");
            return Ok(tool_error(format!(
                "tool \"{name}\" needs the {} role; {who} has the {} role (worker.mcp.auth)",
                needs.as_str(),
                caller.role.as_str()
            ))
            .into());
        }
        if let Some(response) = self.as_task(&request, &context).await {
            self.observer.mcp_request(&name, response.is_ok());
            return response;
        }
        let call = ToolCallContext::new(self, request, context);
        // A panic in a tool fails that call, not the worker (STYLE §9).
        let response = match AssertUnwindSafe(self.tools.router.call(call)).catch_unwind().await {
            Ok(response) => response,
            Err(_) => {
                tracing::error!(tool = %name, "MCP tool call panicked");
                Ok(tool_error(format!("internal error in tool \"{name}\"; the worker log has details")).into())
            }
        };
        let ok = matches!(&response, Ok(CallToolResponse::Complete(r)) if r.is_error != Some(true))
            || matches!(&response, Ok(CallToolResponse::Task(_) | CallToolResponse::InputRequired(_)));
        self.observer.mcp_request(&name, ok);
        response
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let cache_hints = context.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        Ok(ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            tools: self.served(caller_of(&context.extensions).role).cloned().collect(),
            meta: None,
            next_cursor: None,
            ttl_ms: cache_hints.then_some(0),
            cache_scope: cache_hints.then_some(CacheScope::Public),
        })
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.served(Role::Manage).find(|t| t.name == name).cloned()
    }

    // rmcp's defaults answer these with empty lists even though the capability is not declared.

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(prompts::list()).with_ttl_ms(0).with_cache_scope(CacheScope::Public))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        Ok(prompts::get(&self.service, request).await?.into())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let cursor = request.and_then(|r| r.cursor);
        let (resources, next_cursor) = resources::list(&self.service, cursor.as_deref()).await?;
        let mut result = ListResourcesResult::with_all_items(resources);
        result.next_cursor = next_cursor;
        Ok(result)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(resources::templates()))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        Ok(resources::read(&self.service, &request.uri).await?.into())
    }

    /// `subscriptions/listen`: the resources this worker serves, and `resources/list` changes.
    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.resources_list_changed = requested.resources_list_changed;
        accepted.resource_subscriptions = requested
            .resource_subscriptions
            .as_ref()
            .map(|uris| uris.iter().filter(|uri| resources::Uri::parse(uri).is_ok()).cloned().collect());
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let accepted = context.accepted().clone();
        let uris = accepted.resource_subscriptions.iter().flatten().filter_map(|uri| resources::Uri::parse(uri).ok()).collect();
        let sink = context.sink().clone();
        let until = async {
            tokio::select! {
                () = context.cancelled() => {}
                () = self.stop.cancelled() => {}
            }
        };
        resources::watch(&self.service, uris, accepted.resources_list_changed == Some(true), until, |change| {
            let sink = sink.clone();
            async move {
                let sent = match change {
                    resources::Change::Updated(uri) => sink.notify_resource_updated(uri).await,
                    resources::Change::ListChanged => sink.notify_resource_list_changed().await,
                };
                sent.is_ok()
            }
        })
        .await;
        Ok(())
    }

    #[allow(deprecated, reason = "resources/subscribe is what clients before 2026-07-28 send")]
    async fn subscribe(&self, request: SubscribeRequestParams, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let uri = resources::Uri::parse(&request.uri)?;
        let stop = self.stop.child_token();
        let previous = self.subscriptions.lock().unwrap_or_else(PoisonError::into_inner).insert(request.uri.clone(), stop.clone());
        if let Some(previous) = previous {
            previous.cancel();
        }
        let (service, peer) = (self.service.clone(), context.peer.clone());
        tokio::spawn(async move {
            resources::watch(&service, vec![uri], false, stop.cancelled_owned(), |change| {
                let peer = peer.clone();
                async move {
                    match change {
                        resources::Change::Updated(uri) => {
                            peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri)).await.is_ok()
                        }
                        resources::Change::ListChanged => true,
                    }
                }
            })
            .await;
        });
        Ok(())
    }

    #[allow(deprecated, reason = "resources/unsubscribe is what clients before 2026-07-28 send")]
    async fn unsubscribe(&self, request: UnsubscribeRequestParams, _context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        if let Some(stop) = self.subscriptions.lock().unwrap_or_else(PoisonError::into_inner).remove(&request.uri) {
            stop.cancel();
        }
        Ok(())
    }

    async fn get_task(&self, request: GetTaskParams, context: RequestContext<RoleServer>) -> Result<GetTaskResult, ErrorData> {
        Ok(GetTaskResult::new(self.tasks.get(&request.task_id, &context)?))
    }

    async fn update_task(&self, request: UpdateTaskParams, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.tasks.update(&request.task_id, request.input_responses, &context)
    }

    async fn cancel_task(&self, request: CancelTaskParams, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.tasks.cancel(&request.task_id, &context)
    }

    async fn complete(&self, request: CompleteRequestParams, _context: RequestContext<RoleServer>) -> Result<CompleteResult, ErrorData> {
        prompts::complete(&self.service, request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_tool_schema_has_a_boolean_sub_schema() {
        fn booleans(v: &Value, path: &str, found: &mut Vec<String>) {
            let Value::Object(o) = v else { return };
            for (k, x) in o {
                let subs: Vec<(String, &Value)> = match (k.as_str(), x) {
                    ("items" | "additionalProperties" | "not", x) => vec![(k.clone(), x)],
                    ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(a)) => {
                        a.iter().enumerate().map(|(i, x)| (format!("{k}[{i}]"), x)).collect()
                    }
                    ("properties" | "$defs" | "definitions", Value::Object(m)) => m.iter().map(|(n, x)| (format!("{k}.{n}"), x)).collect(),
                    _ => vec![],
                };
                for (p, sub) in subs {
                    if sub.is_boolean() {
                        found.push(format!("{path}/{p}"));
                    }
                    booleans(sub, &format!("{path}/{p}"), found);
                }
            }
        }
        let listed = listed_tools(&Control::tool_router());
        let mut found = Vec::new();
        for t in &listed {
            booleans(&Value::Object((*t.input_schema).clone()), &format!("{}:input", t.name), &mut found);
            if let Some(out) = &t.output_schema {
                booleans(&Value::Object((**out).clone()), &format!("{}:output", t.name), &mut found);
            }
        }
        assert!(found.is_empty(), "boolean sub-schemas: {found:?}");
        // Without the rewrite there are some (a run's `input`, a step's output): the check is live.
        let raw: usize = Control::tool_router()
            .list_all()
            .iter()
            .filter_map(|t| t.output_schema.clone())
            .map(|o| {
                let mut f = Vec::new();
                booleans(&Value::Object((*o).clone()), "", &mut f);
                f.len()
            })
            .sum();
        assert!(raw > 0, "the router's own schemas should have boolean sub-schemas to rewrite");
        assert_eq!(
            objects_for_boolean_schemas_of(serde_json::json!({"properties": {"a": true, "b": false}})),
            serde_json::json!({"properties": {"a": {}, "b": {"not": {}}}})
        );
    }

    #[test]
    fn output_schemas_lose_their_prose_but_not_a_property_named_description() {
        let mut schema = serde_json::json!({
            "title": "JobSummary", "description": "A job.", "type": "object",
            "properties": {"description": {"description": "What it does.", "type": ["string", "null"]},
                           "runs": {"type": "array", "items": {"$ref": "#/$defs/Run", "description": "x"}}},
            "$defs": {"Run": {"description": "One run.", "anyOf": [{"description": "y", "type": "null"}]}}
        });
        without_prose(schema.as_object_mut().unwrap());
        assert_eq!(
            schema,
            serde_json::json!({"type": "object",
                "properties": {"description": {"type": ["string", "null"]}, "runs": {"type": "array", "items": {"$ref": "#/$defs/Run"}}},
                "$defs": {"Run": {"anyOf": [{"type": "null"}]}}})
        );
    }

    fn objects_for_boolean_schemas_of(v: Value) -> Value {
        let Value::Object(mut o) = v else { panic!("an object") };
        objects_for_boolean_schemas(&mut o);
        Value::Object(o)
    }

    #[test]
    fn every_tool_is_listed_in_order() {
        let tools = Control::tool_router();
        let mut names: Vec<&str> = TOOL_ORDER.to_vec();
        names.sort_unstable();
        let routed: Vec<String> = tools.list_all().into_iter().map(|t| t.name.to_string()).collect();
        assert_eq!(routed, names);
        for name in TOOL_ORDER {
            let tool = tools.get(name).expect("routed");
            assert!(tool.output_schema.is_some(), "{name} has no output schema");
            assert!(tool.annotations.is_some(), "{name} has no annotations");
            assert!(tool.description.as_deref().is_some_and(|d| !d.is_empty()), "{name} has no description");
        }
    }
}

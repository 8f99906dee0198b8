//! The contract between the worker and its clients: the types its MCP tools answer with,
//! defined once. The worker serializes them (and, with the `schema` feature, derives its tools'
//! output schemas from them); `lampctl` deserializes them, so a field renamed on one side is a
//! compile error on the other rather than a "-" in a table.
//!
//! serde, serde_json, serde_path_to_error and chrono only: `lampctl` depends on this crate and
//! stays small.

pub mod args;
mod run;
mod tools;
mod views;

/// The git revision the binaries were built from (`LAMPLIGHTER_GIT_REV`, the checkout's
/// HEAD, or `unknown`), as `jobs/contract/build.rs` found it.
pub const REVISION: &str = env!("LAMPLIGHTER_REV");

/// What `lamplighter --version` and `lampctl --version` print after the binary's name, e.g.
/// `0.1.0 (rev 1a2b3c4d5e6f)`.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (rev ", env!("LAMPLIGHTER_REV"), ")");

pub use run::{
    AgentUsage, CallKind, CallRecord, Notification, NotificationStatus, OutputLine, Run, RunStatus, StepRecord, StepStatus, Trigger,
};
pub use tools::{
    ActionView, AgentInfo, AgentList, ApprovalList, JobList, JobsChanged, LimitKeyView, LimitList, LimitView, PluginList, PluginView,
    ReloadSummary, StepOutline, TagChange, TagTriggered, TaggedRefusal, TaggedRun, TriggerAnswer, TriggerOutcome, WorkflowInfo,
    WorkflowList,
};
pub use views::{
    AfterView, Approval, Backfill, BackfillTick, DeadlineMissed, Decision, FireTime, JobChange, JobDeleted, JobDetail, JobOrigin, JobPage,
    JobSaved, JobSummary, MissedTicks, RunBrief, RunDetail, RunPage, SchedulePreview, StepView, Triggered, UpstreamOutcome, WorkerLease,
    WorkerStatus,
};

//! The contract between the worker and its clients: the types its MCP tools answer with,
//! defined once. The worker serializes them (and, with the `schema` feature, derives its tools'
//! output schemas from them); `lampctl` deserializes them, so a field renamed on one side is a
//! compile error on the other rather than a "-" in a table.
//!
//! serde, serde_json and chrono only: `lampctl` depends on this crate and stays small.

mod run;
mod tools;
mod views;

pub use run::{AgentUsage, CallKind, CallRecord, Run, RunStatus, StepRecord, StepStatus, Trigger};
pub use tools::{
    ActionView, AgentInfo, AgentList, ApprovalList, JobList, PluginList, PluginView, ReloadSummary, StepOutline, TriggerOutcome,
    WorkflowInfo, WorkflowList,
};
pub use views::{
    Approval, Decision, FireTime, JobDetail, JobPage, JobSummary, RunBrief, RunDetail, RunPage, StepView, Triggered, WorkerLease,
    WorkerStatus,
};

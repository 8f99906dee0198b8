//! MCP prompts and completion. One prompt, `triage-failures`, sets a model to work on what
//! failed: it names the tools to call and what to answer, for every job or one. Completion
//! offers job names for the prompt's `job` argument and for `lamplighter://jobs/{name}`; any
//! other argument has no completions (an empty list, not an error).

use lamplighter_jobs::JobService;
use rmcp::ErrorData;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, CompletionInfo, GetPromptRequestParams, GetPromptResult, Prompt, PromptArgument, PromptMessage,
    Reference, Role,
};
use serde_json::Value;

const TRIAGE: &str = "triage-failures";
const JOB_TEMPLATE: &str = "lamplighter://jobs/{name}";

pub(crate) fn list() -> Vec<Prompt> {
    let job = PromptArgument::new("job").with_description("Only this job's runs (all jobs when left out)").with_required(false);
    let mut prompt = Prompt::new(
        TRIAGE,
        Some("Find what failed recently, why, and what to do about it (retry, pause, fix the config)"),
        Some(vec![job]),
    );
    prompt.title = Some("Triage failed runs".into());
    vec![prompt]
}

pub(crate) async fn get(service: &JobService, request: GetPromptRequestParams) -> Result<GetPromptResult, ErrorData> {
    if request.name != TRIAGE {
        return Err(ErrorData::invalid_params(format!("no prompt \"{}\"; this worker has {TRIAGE}", request.name), None));
    }
    let arguments = request.arguments.unwrap_or_default();
    if let Some(unknown) = arguments.keys().find(|k| *k != "job") {
        return Err(ErrorData::invalid_params(format!("{TRIAGE} takes one argument, `job`, not `{unknown}`"), None));
    }
    let job = match arguments.get("job") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if !name.is_empty() => {
            // Named the way the tools name it, so an unknown job is said now, not by the model.
            service.get_job(name, 1).await.map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
            Some(name.clone())
        }
        Some(other) => return Err(ErrorData::invalid_params(format!("`job` must be a job's name, not {other}"), None)),
    };
    let (scope, filter) = match &job {
        Some(name) => (format!("of the job \"{name}\""), format!(" and job \"{name}\"")),
        None => ("of this worker".to_owned(), String::new()),
    };
    let text = format!(
        "Look after the failed runs {scope} of the Lamplighter scheduler. Call `list_runs` with status \"failed\"{filter} (and \
         \"timed_out\", then \"interrupted\"), then `get_run` on the newest of each job for its error and its steps. Answer per \
         job: what failed, since when and how often (`get_job` has the counts), the likely cause, and one next step: retry it \
         (`trigger_job`), pause it until it is fixed (`pause_job` with the reason), or the change its config needs. Do not \
         trigger or pause anything without saying so first."
    );
    let mut result = GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)]);
    result.description = Some(format!("Triage the failed runs {scope}"));
    Ok(result)
}

pub(crate) async fn complete(service: &JobService, request: CompleteRequestParams) -> Result<CompleteResult, ErrorData> {
    let names_a_job = match &request.r#ref {
        Reference::Prompt(p) => p.name == TRIAGE && request.argument.name == "job",
        Reference::Resource(r) => r.uri == JOB_TEMPLATE && request.argument.name == "name",
        _ => false,
    };
    let mut values = Vec::new();
    if names_a_job {
        let prefix = request.argument.value.as_str();
        let jobs = service.list_jobs().await.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        values.extend(jobs.into_iter().map(|j| j.name).filter(|n| n.starts_with(prefix)));
    }
    let total = values.len();
    values.truncate(CompletionInfo::MAX_VALUES);
    let has_more = total > values.len();
    let mut info = CompletionInfo::new(values).map_err(|e| ErrorData::internal_error(e, None))?;
    info.total = u32::try_from(total).ok();
    info.has_more = Some(has_more);
    Ok(CompleteResult::new(info))
}

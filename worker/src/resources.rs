//! MCP resources: the jobs, one job and one run, as JSON of the same contract types the tools
//! answer with, and what tells a client they changed. `lamplighter://jobs` is every job,
//! `lamplighter://jobs/{name}` one job in detail and `lamplighter://runs/{id}` one run with its
//! steps (listed as templates: runs are too many to list).
//!
//! A subscription (`subscriptions/listen` at 2026-07-28, `resources/subscribe` before) is one
//! [`watch`]: it wakes on the service's change signals (a run's progress or end, a pause, a
//! reload; from other workers too on PostgreSQL), reads the resources it follows again and
//! notifies those whose JSON changed, and `notifications/resources/list_changed` when the set
//! of jobs did. Signals are hints: what is notified is what a read shows.

use std::collections::HashMap;
use std::time::Duration;

use lamplighter_jobs::{Interest, JobService, ServiceError};
use rmcp::ErrorData;
use rmcp::model::{CacheScope, ReadResourceResult, Resource, ResourceContents, ResourceTemplate};
use serde::Serialize;

/// Every job.
pub(crate) const JOBS: &str = "lamplighter://jobs";
const JOB: &str = "lamplighter://jobs/";
const RUN: &str = "lamplighter://runs/";
const JSON: &str = "application/json";
/// Resources listed per `resources/list` page (the jobs, one each).
const PAGE: usize = 100;
/// A watch reads again at most this often, however many signals come: under a burst of runs
/// one read covers them all.
const AT_MOST_EVERY: Duration = Duration::from_millis(100);
/// How long a finished run's JSON may be cached: it does not change any more.
const FINISHED_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// A resource this worker serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Uri {
    Jobs,
    Job(String),
    Run(String),
}

impl Uri {
    pub(crate) fn parse(uri: &str) -> Result<Self, ErrorData> {
        let named = |rest: &str| (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_owned());
        let parsed = if uri == JOBS {
            Some(Uri::Jobs)
        } else if let Some(name) = uri.strip_prefix(JOB) {
            named(name).map(Uri::Job)
        } else {
            uri.strip_prefix(RUN).and_then(named).map(Uri::Run)
        };
        parsed.ok_or_else(|| {
            ErrorData::resource_not_found(
                format!("no resource \"{uri}\"; this worker serves {JOBS}, {JOB}{{name}} and {RUN}{{id}}"),
                Some(serde_json::json!({ "uri": uri })),
            )
        })
    }

    fn text(&self) -> String {
        match self {
            Uri::Jobs => JOBS.to_owned(),
            Uri::Job(name) => format!("{JOB}{name}"),
            Uri::Run(id) => format!("{RUN}{id}"),
        }
    }
}

/// One page of `resources/list`: `lamplighter://jobs` first, then a resource per job.
pub(crate) async fn list(service: &JobService, cursor: Option<&str>) -> Result<(Vec<Resource>, Option<String>), ErrorData> {
    let page = service.list_jobs_page(cursor, PAGE, None).await.map_err(not_read)?;
    let mut out = Vec::with_capacity(page.jobs.len() + 1);
    if cursor.is_none() {
        out.push(Resource::new(JOBS, "jobs").with_description("Every job with its state, next fire and last run").with_mime_type(JSON));
    }
    out.extend(page.jobs.iter().map(|j| {
        let r = Resource::new(Uri::Job(j.name.clone()).text(), j.name.clone()).with_mime_type(JSON);
        match &j.description {
            Some(d) => r.with_description(d.clone()),
            None => r,
        }
    }));
    Ok((out, page.next_cursor))
}

pub(crate) fn templates() -> Vec<ResourceTemplate> {
    let template = |uri: &str, name: &str, description: &str| {
        let mut t = ResourceTemplate::new(uri, name).with_description(description).with_mime_type(JSON);
        t.title = Some(name.to_owned());
        t
    };
    vec![
        template(&format!("{JOB}{{name}}"), "job", "One job: next fire times, run counts, recent runs and its policies"),
        template(&format!("{RUN}{{id}}"), "run", "One run: status, times, steps, agent calls and output"),
    ]
}

/// `resources/read`, with caching hints: a finished run never changes; the rest may at any
/// moment (subscribe to hear when).
pub(crate) async fn read(service: &JobService, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let parsed = Uri::parse(uri)?;
    let (text, finished) = contents(service, &parsed).await?;
    let ttl = if finished { FINISHED_TTL_MS } else { 0 };
    let contents = ResourceContents::TextResourceContents { uri: uri.to_owned(), mime_type: Some(JSON.to_owned()), text, meta: None };
    Ok(ReadResourceResult::new(vec![contents]).with_ttl_ms(ttl).with_cache_scope(CacheScope::Private))
}

/// The resource's JSON, and whether it is final (a finished run).
async fn contents(service: &JobService, uri: &Uri) -> Result<(String, bool), ErrorData> {
    match uri {
        Uri::Jobs => Ok((to_json(&lamplighter_contract::JobList { jobs: service.list_jobs().await.map_err(not_read)? }), false)),
        Uri::Job(name) => Ok((to_json(&service.get_job(name, 5).await.map_err(not_read)?), false)),
        Uri::Run(id) => {
            let detail = service.get_run_detail(id).await.map_err(not_read)?;
            Ok((to_json(&detail), detail.run.status.is_final()))
        }
    }
}

fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn not_read(e: ServiceError) -> ErrorData {
    match e {
        ServiceError::JobNotFound { .. } | ServiceError::RunNotFound { .. } => ErrorData::resource_not_found(e.to_string(), None),
        other => {
            tracing::warn!(error = %other, "cannot read a resource");
            ErrorData::internal_error(format!("cannot read the resource: {other}"), None)
        }
    }
}

/// What a watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// The resource at this URI reads differently now.
    Updated(String),
    /// Jobs were added or removed (a reload): `resources/list` answers differently.
    ListChanged,
}

/// Follows `uris` (and, with `list_changed`, the set of jobs) until `until` resolves or `send`
/// returns false (the client went away). Reads each once at the start, then again after each
/// burst of change signals, and sends what differs.
pub(crate) async fn watch<F, Fut>(service: &JobService, uris: Vec<Uri>, list_changed: bool, until: impl Future<Output = ()>, mut send: F)
where
    F: FnMut(Change) -> Fut,
    Fut: Future<Output = bool>,
{
    // Taken before the first read: a change between the read and the wait is not lost.
    let mut changes = service.watch(Interest::Anything).at_most_every(AT_MOST_EVERY);
    let mut seen: HashMap<Uri, Option<String>> = HashMap::new();
    // Resources already final here are announced at once. The subscription was acknowledged
    // before this watch began, so the client may have read the resource before these reads; a
    // run that ended in between would change no more, and its follower would wait for ever
    // (seen: `lampctl jobs trigger --wait` on a run of a few milliseconds, once in ~25).
    let mut final_now = Vec::new();
    for uri in &uris {
        let read = contents(service, uri).await.ok();
        if read.as_ref().is_some_and(|(_, finished)| *finished) {
            final_now.push(uri.text());
        }
        seen.insert(uri.clone(), read.map(|(text, _)| text));
    }
    let mut names = if list_changed { job_names(service).await } else { None };
    for uri in final_now {
        if !send(Change::Updated(uri)).await {
            return;
        }
    }
    tokio::pin!(until);
    loop {
        tokio::select! {
            biased;
            () = &mut until => return,
            () = changes.changed() => {}
        }
        for uri in &uris {
            let now = contents(service, uri).await.ok().map(|(text, _)| text);
            if seen.get(uri) != Some(&now) {
                seen.insert(uri.clone(), now);
                if !send(Change::Updated(uri.text())).await {
                    return;
                }
            }
        }
        if list_changed {
            let now = job_names(service).await;
            if now != names {
                names = now;
                if !send(Change::ListChanged).await {
                    return;
                }
            }
        }
    }
}

async fn job_names(service: &JobService) -> Option<Vec<String>> {
    service.list_jobs().await.ok().map(|jobs| jobs.into_iter().map(|j| j.name).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_to_resources_and_others_are_named_in_the_error() {
        assert_eq!(Uri::parse("lamplighter://jobs").unwrap(), Uri::Jobs);
        assert_eq!(Uri::parse("lamplighter://jobs/report").unwrap(), Uri::Job("report".into()));
        assert_eq!(Uri::parse("lamplighter://runs/0193-ab").unwrap(), Uri::Run("0193-ab".into()));
        for bad in ["lamplighter://jobs/", "lamplighter://runs/a/b", "file:///etc/passwd", "lamplighter://job/x", ""] {
            let e = Uri::parse(bad).unwrap_err();
            assert_eq!(e.code.0, -32002, "{bad}");
            assert!(e.message.contains("lamplighter://runs/{id}"), "{}", e.message);
        }
        for uri in [Uri::Jobs, Uri::Job("a".into()), Uri::Run("r".into())] {
            assert_eq!(Uri::parse(&uri.text()).unwrap(), uri);
        }
    }
}

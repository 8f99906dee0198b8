//! `git-operations.*`: runs `git` with an argument list (never a shell) in a directory inside
//! the working directory and returns its text output.
//!
//! Every call disables hooks and fsmonitor, which would otherwise let files in the repository
//! (writable through `file-save`) run arbitrary programs.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::confine;
use super::params::Params;
use super::process::{self, RunError};
use crate::{ActionContext, ActionError};

const GIT_TIMEOUT: Duration = Duration::from_secs(120);
const HARDENING: &[&str] = &["--no-pager", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"];

pub(crate) async fn status(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let dir = confine::resolve_dir(params.action(), &ctx.working_directory, params.str("directory"))?;
    git(params, ctx, &dir, &["status"]).await.map(Value::String)
}

pub(crate) async fn diff(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let dir = confine::resolve_dir(params.action(), &ctx.working_directory, params.str("directory"))?;
    let mut args = vec!["diff".to_owned()];
    if params.bool_or("staged", false) {
        args.push("--staged".to_owned());
    }
    if let Some(path) = params.str("path") {
        // Relative to the repository directory, which is itself inside the working directory.
        let resolved = confine::resolve(params.action(), &dir, path)?;
        args.push("--".to_owned());
        args.push(resolved.to_string_lossy().into_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    git(params, ctx, &dir, &args).await.map(Value::String)
}

pub(crate) async fn log(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let dir = confine::resolve_dir(params.action(), &ctx.working_directory, params.str("directory"))?;
    let count = params.int_in("count", 10, 1, 10_000)?;
    let count = format!("--max-count={count}");
    let mut args = vec!["log", count.as_str()];
    if params.bool_or("oneline", true) {
        args.push("--oneline");
    }
    git(params, ctx, &dir, &args).await.map(Value::String)
}

pub(crate) async fn commit(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let message = params.required_str("message")?;
    if message.trim().is_empty() {
        return Err(params.invalid("message", "is empty"));
    }
    let dir = confine::resolve_dir(params.action(), &ctx.working_directory, None)?;
    let paths = params.strings("paths");
    if paths.is_empty() {
        git(params, ctx, &dir, &["add", "--all"]).await?;
    } else {
        let mut resolved = Vec::with_capacity(paths.len());
        for path in paths {
            resolved.push(confine::resolve(params.action(), &dir, path)?.to_string_lossy().into_owned());
        }
        let mut args = vec!["add", "--"];
        args.extend(resolved.iter().map(String::as_str));
        git(params, ctx, &dir, &args).await?;
    }
    git(params, ctx, &dir, &["commit", "--message", message]).await.map(Value::String)
}

async fn git(params: &Params, ctx: &ActionContext, dir: &Path, args: &[&str]) -> Result<String, ActionError> {
    let mut full: Vec<&str> = HARDENING.to_vec();
    full.extend_from_slice(args);
    let sub = args.first().copied().unwrap_or_default();
    // Stop repository discovery at the working directory, so a directory that is not a
    // repository never reaches a repository above the working directory.
    let root = ctx.working_directory.canonicalize().unwrap_or_else(|_| ctx.working_directory.clone());
    let ceiling = root.parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let env = [("GIT_TERMINAL_PROMPT", "0"), ("GIT_OPTIONAL_LOCKS", "0"), ("GIT_CEILING_DIRECTORIES", ceiling.as_str())];
    match process::run("git", &full, dir, &env, GIT_TIMEOUT, &ctx.cancel, None).await {
        Ok(out) if out.exit_code == Some(0) => Ok(out.stdout),
        Ok(out) => {
            let code = out.exit_code.map_or_else(|| "a signal".to_owned(), |c| format!("code {c}"));
            let detail = if out.stderr.trim().is_empty() { out.stdout.trim() } else { out.stderr.trim() };
            Err(params.failed(format!("\"git {sub}\" exited with {code}: {detail}")))
        }
        Err(RunError::Timeout) => Err(ActionError::Timeout { action: params.action().to_owned(), seconds: GIT_TIMEOUT.as_secs() }),
        Err(RunError::Cancelled) => Err(ActionError::Cancelled { action: params.action().to_owned() }),
        Err(RunError::Spawn(e)) => Err(params.failed(format!("could not start \"git\": {e}"))),
        Err(RunError::Wait(e)) => Err(params.failed(format!("could not wait for \"git\": {e}"))),
    }
}

//! `file-read.read`, `file-save.save` and `file-delete.delete`: read a file with line numbers,
//! write a file creating its parent directories, delete one file; all confined to the working
//! directory.

use std::path::Path;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};

use super::confine;
use super::file_pool::{Pool, Stopped};
use super::params::Params;
use crate::{ActionContext, ActionError};

const DEFAULT_LIMIT: u64 = 500;
const MAX_LIMIT: u64 = 100_000;
/// Most bytes of numbered text one read returns; the rest is cut with a note.
const MAX_READ_BYTES: usize = 1024 * 1024;
/// Most bytes of one line read at once ([`read`]): a longer line is cut there.
const LINE_PIECE: u64 = MAX_READ_BYTES as u64 + 1;

pub(crate) async fn read(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let user_path = params.required_str("path")?.to_owned();
    let offset = params.int_in("offset", 1, 1, u64::from(u32::MAX))?;
    let limit = params.int_in("limit", DEFAULT_LIMIT, 1, MAX_LIMIT)?;
    let (action, root, cancel) = (params.action().to_owned(), ctx.working_directory.clone(), ctx.cancel.clone());
    off_the_runtime(params, &ctx.cancel, move || {
        let failed = |message: String| ActionError::Failed { action: action.clone(), message };
        let io_failed = |e: std::io::Error| failed(format!("cannot read \"{user_path}\": {e}"));
        let path = confine::resolve(&action, &root, &user_path)?;
        if std::fs::metadata(&path).map_err(io_failed)?.is_dir() {
            return Err(failed(format!("\"{user_path}\" is a directory; use directory-list.tree to list it")));
        }
        let mut reader = BufReader::new(std::fs::File::open(&path).map_err(io_failed)?);
        let mut out = String::new();
        let mut line = Vec::new();
        let mut number: u64 = 0;
        loop {
            if cancel.is_cancelled() {
                return Err(ActionError::Cancelled { action: action.clone() });
            }
            line.clear();
            // A line is read a piece at a time, so that a file with no newline neither fills
            // memory nor outlives its run's stop: what is past a piece is skipped.
            let mut piece = (&mut reader).take(LINE_PIECE).read_until(b'\n', &mut line).map_err(io_failed)?;
            if piece == 0 {
                break;
            }
            let mut rest = Vec::new();
            while piece as u64 == LINE_PIECE && !line.ends_with(b"\n") && !rest.ends_with(b"\n") {
                if cancel.is_cancelled() {
                    return Err(ActionError::Cancelled { action: action.clone() });
                }
                rest.clear();
                piece = (&mut reader).take(LINE_PIECE).read_until(b'\n', &mut rest).map_err(io_failed)?;
            }
            number += 1;
            if number < offset {
                continue;
            }
            if number >= offset.saturating_add(limit) {
                break;
            }
            let text = String::from_utf8_lossy(&line);
            out.push_str(&format!("{number:>6}\t{}\n", text.trim_end_matches(['\n', '\r'])));
            if out.len() > MAX_READ_BYTES {
                out.push_str(&format!("(output cut at {MAX_READ_BYTES} bytes; read from line {} to see more)\n", number + 1));
                break;
            }
        }
        Ok(Value::String(out))
    })
    .await
}

pub(crate) async fn save(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let user_path = params.required_str("path")?.to_owned();
    let content = params.required_str("content")?.to_owned();
    let (action, root) = (params.action().to_owned(), ctx.working_directory.clone());
    off_the_runtime(params, &ctx.cancel, move || {
        let failed = |message: String| ActionError::Failed { action: action.clone(), message };
        let io_failed = |e: std::io::Error| failed(format!("cannot write \"{user_path}\": {e}"));
        let path = confine::resolve(&action, &root, &user_path)?;
        if std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(failed(format!("\"{user_path}\" is a directory")));
        }
        if let Some(parent) = path.parent() {
            confine::make_dir(parent).map_err(io_failed)?;
        }
        std::fs::write(&path, &content).map_err(io_failed)?;
        Ok(json!({ "path": user_path, "bytes_written": content.len() }))
    })
    .await
}

/// Runs an action's file work off the runtime's threads in one hand-over: its path checks
/// (which read the file system too) and its I/O together, on the file pool
/// ([`file_pool::Pool::files`]).
///
/// Measured on a burst of a thousand `file-save` runs (`cargo bench … runcore -- burst`,
/// BENCHMARKS.md): each `tokio::fs` call was a hand-over of its own, three or four per action,
/// and with nothing to bound them the pool grew to its 512 threads, which then took the
/// machine's cores from the runtime threads that start the burst's other runs. Waiting for a
/// thread holds none; a run cancelled meanwhile stops waiting, and its work never runs.
async fn off_the_runtime<T: Send + 'static>(
    params: &Params,
    cancel: &tokio_util::sync::CancellationToken,
    work: impl FnOnce() -> Result<T, ActionError> + Send + 'static,
) -> Result<T, ActionError> {
    match Pool::files().run(cancel, work).await {
        Ok(answer) => answer,
        Err(Stopped::Cancelled) => Err(ActionError::Cancelled { action: params.action().to_owned() }),
        Err(e) => Err(params.failed(format!("the file work stopped: {e}"))),
    }
}

/// Deletes one file, or one symlink (never what it points to). Directories are refused, since the
/// seed's action has no recursive flag, and so is the working directory itself.
pub(crate) async fn delete(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let user_path = params.required_str("path")?;
    let action = params.action();
    let root = confine::resolve(action, &ctx.working_directory, ".")?;
    // The whole path must resolve inside, even when its last component is a symlink that is
    // about to be removed: the same rule as every other action, and the conservative one.
    let resolved = confine::resolve(action, &ctx.working_directory, user_path)?;
    if resolved == root {
        return Err(ActionError::PathNotAllowed {
            action: action.to_owned(),
            path: user_path.to_owned(),
            problem: "is the working directory itself, which is never deleted".to_owned(),
        });
    }
    let io_failed = |e: std::io::Error| params.failed(format!("cannot delete \"{user_path}\": {e}"));

    // `resolved` has symlinks followed; to remove a link itself, find it through its parent.
    let user = Path::new(user_path);
    if let (Some(parent), Some(name)) = (user.parent(), user.file_name()) {
        let parent = confine::resolve_dir(action, &ctx.working_directory, parent.to_str())?;
        let candidate = parent.join(name);
        if tokio::fs::symlink_metadata(&candidate).await.is_ok_and(|m| m.file_type().is_symlink()) {
            tokio::fs::remove_file(&candidate).await.map_err(io_failed)?;
            return Ok(json!({ "path": user_path, "deleted": "symlink" }));
        }
    }
    let meta = tokio::fs::symlink_metadata(&resolved).await.map_err(io_failed)?;
    if meta.is_dir() {
        return Err(params.invalid("path", format!("\"{user_path}\" is a directory; file-delete.delete deletes files only")));
    }
    tokio::fs::remove_file(&resolved).await.map_err(io_failed)?;
    Ok(json!({ "path": user_path, "deleted": "file" }))
}

//! `file-edit.search-replace` and `file-edit.insert`: change a text file in place, confined to
//! the working directory. Both read the whole file, so they refuse files larger than
//! [`MAX_EDIT_BYTES`] and files that are not UTF-8 text.
//!
//! A search text that does not occur, or an occurrence past the last one, is an
//! `InvalidParameter` error (permanent: the same call cannot succeed on the same file) that names
//! the text and how often it was found, so an agent can correct its call.

use std::path::Path;

use serde_json::{Value, json};

use super::confine;
use super::params::Params;
use crate::{ActionContext, ActionError};

/// Largest file either action edits: agents edit source files, not logs or data dumps.
const MAX_EDIT_BYTES: u64 = 16 * 1024 * 1024;
/// How much of the search text an error message quotes.
const QUOTED_CHARS: usize = 80;

pub(crate) async fn search_replace(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let user_path = params.required_str("path")?;
    let search = params.required_str("search")?;
    let replace = params.required_str("replace")?;
    // The seed: 1 = first (the default), 0 = all, N = the N-th.
    let occurrence = params.int_in("occurrence", 1, 0, u64::from(u32::MAX))?;
    if search.is_empty() {
        return Err(params.invalid("search", "is empty; give the exact text to find"));
    }
    let path = confine::resolve(params.action(), &ctx.working_directory, user_path)?;
    let text = read_text(params, &path, user_path).await?;

    let found = text.matches(search).count();
    if found == 0 {
        return Err(params.invalid("search", format!("does not occur in \"{user_path}\" (searched for {})", quote(search))));
    }
    // The result's size, checked before it is built: replacing every `a` in a large file by a
    // long text must be a clear error, not an allocation that aborts the worker.
    let replaced_count = if occurrence == 0 { found } else { 1 };
    let new_len = (text.len() - replaced_count * search.len()).checked_add(replaced_count.saturating_mul(replace.len()));
    if new_len.is_none_or(|n| n as u64 > MAX_EDIT_BYTES) {
        return Err(params.failed(format!(
            "replacing {replaced_count} occurrence(s) in \"{user_path}\" would make it larger than {MAX_EDIT_BYTES} bytes"
        )));
    }
    let (updated, replaced) = if occurrence == 0 {
        (text.replace(search, replace), found)
    } else {
        let index = usize::try_from(occurrence - 1).unwrap_or(usize::MAX);
        let Some((at, _)) = text.match_indices(search).nth(index) else {
            let times = if found == 1 { "once" } else { "times" };
            let count = if found == 1 { String::new() } else { format!("{found} ") };
            return Err(params.invalid(
                "occurrence",
                format!(
                    "is {occurrence}, but {} occurs only {count}{times} in \"{user_path}\" (use 0 to replace every occurrence)",
                    quote(search)
                ),
            ));
        };
        let mut updated = String::with_capacity(text.len() - search.len() + replace.len());
        updated.push_str(&text[..at]);
        updated.push_str(replace);
        updated.push_str(&text[at + search.len()..]);
        (updated, 1)
    };
    write_text(params, &path, user_path, updated).await?;
    Ok(json!({ "path": user_path, "replacements": replaced }))
}

pub(crate) async fn insert(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let user_path = params.required_str("path")?;
    let content = params.required_str("content")?;
    // "Line number to insert before", 1-based; one past the last line appends.
    let line = params.int_in("line", 1, 1, u64::from(u32::MAX))?;
    let path = confine::resolve(params.action(), &ctx.working_directory, user_path)?;
    let text = read_text(params, &path, user_path).await?;

    let lines = text.split_inclusive('\n').count();
    let before = usize::try_from(line).unwrap_or(usize::MAX);
    if before > lines + 1 {
        let plural = if lines == 1 { "" } else { "s" };
        return Err(params.invalid(
            "line",
            format!("is {line}, but \"{user_path}\" has {lines} line{plural}; use 1 to {} ({} appends)", lines + 1, lines + 1),
        ));
    }
    let offset: usize = text.split_inclusive('\n').take(before - 1).map(str::len).sum();
    // Keep the file's line endings.
    let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut updated = String::with_capacity(text.len() + content.len() + 2 * newline.len());
    updated.push_str(&text[..offset]);
    if offset == text.len() && !text.is_empty() && !text.ends_with('\n') {
        // Appending after a last line that has no line break: end that line first.
        updated.push_str(newline);
    }
    updated.push_str(content);
    if !content.ends_with('\n') {
        updated.push_str(newline);
    }
    updated.push_str(&text[offset..]);
    write_text(params, &path, user_path, updated).await?;
    let inserted = content.split_inclusive('\n').count().max(1);
    Ok(json!({ "path": user_path, "line": line, "lines_inserted": inserted }))
}

async fn read_text(params: &Params, path: &Path, user_path: &str) -> Result<String, ActionError> {
    let io_failed = |e: std::io::Error| params.failed(format!("cannot read \"{user_path}\": {e}"));
    let meta = tokio::fs::metadata(path).await.map_err(io_failed)?;
    if meta.is_dir() {
        return Err(params.failed(format!("\"{user_path}\" is a directory, not a file")));
    }
    if meta.len() > MAX_EDIT_BYTES {
        return Err(
            params.failed(format!("\"{user_path}\" has {} bytes; file-edit edits files of up to {MAX_EDIT_BYTES} bytes", meta.len()))
        );
    }
    let bytes = tokio::fs::read(path).await.map_err(io_failed)?;
    String::from_utf8(bytes).map_err(|_| params.failed(format!("\"{user_path}\" is not UTF-8 text")))
}

async fn write_text(params: &Params, path: &Path, user_path: &str, text: String) -> Result<(), ActionError> {
    // Written next to the file and renamed over it: a crash mid-write leaves the old file whole.
    let tmp = path.with_file_name(format!(".{}.lamplighter-edit", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    let failed = |e: std::io::Error| params.failed(format!("cannot write \"{user_path}\": {e}"));
    tokio::fs::write(&tmp, text).await.map_err(failed)?;
    // The edited file keeps its mode.
    if let Ok(meta) = tokio::fs::metadata(path).await {
        let _ = tokio::fs::set_permissions(&tmp, meta.permissions()).await;
    }
    if let Err(e) = tokio::fs::rename(&tmp, path).await {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(failed(e));
    }
    Ok(())
}

/// `"text"` with escapes, cut to [`QUOTED_CHARS`] characters.
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        Some((at, _)) => format!("{:?}…", &text[..at]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quotes_are_escaped_and_cut() {
        assert_eq!(quote("a \"b\"\nc"), "\"a \\\"b\\\"\\nc\"");
        let long = "é".repeat(100);
        assert_eq!(quote(&long), format!("{:?}…", "é".repeat(80)));
    }
}

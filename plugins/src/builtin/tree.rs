//! `directory-list.tree`: an indented listing with file sizes, confined to the working
//! directory. Symlinks are listed but never followed, so the walk cannot leave the directory.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::confine;
use super::params::Params;
use crate::{ActionContext, ActionError};

const DEFAULT_DEPTH: u64 = 3;
const MAX_DEPTH: u64 = 32;
/// Most entries one listing shows; the rest is cut with a note.
const MAX_ENTRIES: usize = 5000;

struct Walk {
    pattern: Option<glob::Pattern>,
    include_hidden: bool,
    max_depth: u64,
    entries: usize,
    out: String,
}

pub(crate) async fn tree(params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    let dir = confine::resolve_dir(params.action(), &ctx.working_directory, params.str("directory"))?;
    let max_depth = params.int_in("depth", DEFAULT_DEPTH, 1, MAX_DEPTH)?;
    let pattern = match params.str("pattern") {
        None => None,
        Some(p) => Some(glob::Pattern::new(p).map_err(|e| params.invalid("pattern", format!("is not a valid glob: {e}")))?),
    };
    if !dir.is_dir() {
        let shown = params.str("directory").unwrap_or(".");
        return Err(params.failed(format!("\"{shown}\" is not a directory")));
    }
    let mut walk = Walk { pattern, include_hidden: params.bool_or("include_hidden", false), max_depth, entries: 0, out: String::new() };
    let action = params.action().to_owned();
    let cancel = ctx.cancel.clone();
    let result = tokio::task::spawn_blocking(move || {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "/".to_owned());
        let _ = writeln!(walk.out, "{name}/");
        walk.dir(&dir, 1, &cancel);
        if walk.entries > MAX_ENTRIES {
            let _ = writeln!(walk.out, "(listing cut at {MAX_ENTRIES} entries; use a smaller depth or a pattern)");
        }
        (walk.out, cancel.is_cancelled())
    })
    .await;
    match result {
        Ok((_, true)) => Err(ActionError::Cancelled { action }),
        Ok((out, false)) => Ok(Value::String(out)),
        Err(e) => Err(ActionError::Failed { action, message: format!("listing task failed: {e}") }),
    }
}

impl Walk {
    fn dir(&mut self, dir: &Path, depth: u64, cancel: &tokio_util::sync::CancellationToken) {
        let indent = "  ".repeat(usize::try_from(depth).unwrap_or(0));
        let mut children: Vec<_> = match std::fs::read_dir(dir) {
            Ok(rd) => rd.filter_map(Result::ok).collect(),
            Err(e) => {
                let _ = writeln!(self.out, "{indent}(cannot read: {e})");
                return;
            }
        };
        children.sort_by_key(|e| e.file_name());
        for child in children {
            if cancel.is_cancelled() || self.entries > MAX_ENTRIES {
                return;
            }
            let name = child.file_name().to_string_lossy().into_owned();
            if !self.include_hidden && name.starts_with('.') {
                continue;
            }
            let Ok(kind) = child.file_type() else {
                continue;
            };
            if kind.is_dir() {
                self.entries += 1;
                let _ = writeln!(self.out, "{indent}{name}/");
                if depth < self.max_depth {
                    self.dir(&child.path(), depth + 1, cancel);
                }
            } else if self.pattern.as_ref().is_none_or(|p| p.matches(&name)) {
                self.entries += 1;
                if kind.is_symlink() {
                    let target = std::fs::read_link(child.path()).map(|t| t.display().to_string()).unwrap_or_default();
                    let _ = writeln!(self.out, "{indent}{name} -> {target}");
                } else {
                    let size = child.metadata().map(|m| m.len()).unwrap_or(0);
                    let _ = writeln!(self.out, "{indent}{name} ({})", human_size(size));
                }
            }
        }
    }
}

fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::human_size;

    #[test]
    fn sizes_are_human_readable() {
        assert_eq!(human_size(12), "12 B");
        assert_eq!(human_size(1536), "1.5 KB");
        assert_eq!(human_size(3 * 1024 * 1024), "3.0 MB");
    }
}

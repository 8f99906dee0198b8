//! The built-in plugins: their manifests (copied from the seed), parameter validation, and
//! dispatch from `plugin.action` to the code that runs it.

pub(crate) mod confine;
mod edit;
mod file_pool;
mod files;
mod find;
mod git;
pub(crate) mod params;
mod process;
mod project;
pub(crate) mod shell;
mod tree;
mod web;

use std::sync::LazyLock;

use serde_json::Value;

use crate::{ActionContext, ActionError, ActionInfo, PluginInfo};

pub(crate) use params::Params;
pub use process::{ServerProcess, start_server};

/// The seed's manifests, embedded so the daemon needs no plugin directory for built-ins. Listed
/// in the order of the seed's "Built-in Plugin Parameters" tables.
const MANIFESTS: &[(&str, &str)] = &[
    ("file-read", include_str!("manifests/file-read.json")),
    ("file-save", include_str!("manifests/file-save.json")),
    ("file-edit", include_str!("manifests/file-edit.json")),
    ("file-delete", include_str!("manifests/file-delete.json")),
    ("file-glob", include_str!("manifests/file-glob.json")),
    ("directory-list", include_str!("manifests/directory-list.json")),
    ("shell-exec", include_str!("manifests/shell-exec.json")),
    ("git-operations", include_str!("manifests/git-operations.json")),
    ("project-detect", include_str!("manifests/project-detect.json")),
    ("web-fetch", include_str!("manifests/web-fetch.json")),
];

/// Parsed once; a manifest that fails to parse becomes a plugin with `error` set, not a panic.
static INFOS: LazyLock<Vec<PluginInfo>> = LazyLock::new(|| MANIFESTS.iter().map(|(name, text)| parse_manifest(name, text)).collect());

fn parse_manifest(name: &str, text: &str) -> PluginInfo {
    let broken = |why: String| PluginInfo {
        name: name.to_owned(),
        version: String::new(),
        kind: "builtin".to_owned(),
        description: String::new(),
        actions: Vec::new(),
        hooks: Vec::new(),
        error: Some(format!("built-in manifest of \"{name}\" is invalid: {why}")),
    };
    let manifest: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return broken(e.to_string()),
    };
    let str_of = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
    let Some(actions) = manifest.pointer("/exports/actions").and_then(Value::as_array) else {
        return broken("\"exports.actions\" is missing".to_owned());
    };
    let actions = actions
        .iter()
        .map(|a| ActionInfo {
            name: str_of(a, "name"),
            description: str_of(a, "description"),
            parameters: a.get("parameters").cloned().unwrap_or(Value::Null),
        })
        .collect();
    PluginInfo {
        name: name.to_owned(),
        version: str_of(&manifest, "version"),
        kind: "builtin".to_owned(),
        description: str_of(&manifest, "description"),
        actions,
        hooks: Vec::new(),
        error: None,
    }
}

pub(crate) fn infos() -> Vec<PluginInfo> {
    INFOS.clone()
}

/// Runs a built-in action with parameters already checked against its manifest.
pub(crate) async fn invoke(plugin: &str, action: &str, params: &Params, ctx: &ActionContext) -> Result<Value, ActionError> {
    match (plugin, action) {
        ("file-read", "read") => files::read(params, ctx).await,
        ("file-save", "save") => files::save(params, ctx).await,
        ("file-edit", "search-replace") => edit::search_replace(params, ctx).await,
        ("file-edit", "insert") => edit::insert(params, ctx).await,
        ("file-delete", "delete") => files::delete(params, ctx).await,
        ("file-glob", "search") => find::search(params, ctx).await,
        ("shell-exec", "run") => shell::run(params, ctx).await,
        ("git-operations", "status") => git::status(params, ctx).await,
        ("git-operations", "diff") => git::diff(params, ctx).await,
        ("git-operations", "log") => git::log(params, ctx).await,
        ("git-operations", "commit") => git::commit(params, ctx).await,
        ("directory-list", "tree") => tree::tree(params, ctx).await,
        ("project-detect", "analyze") => project::analyze(params, ctx).await,
        ("web-fetch", "fetch") => web::fetch(params, ctx).await,
        _ => Err(ActionError::Failed {
            action: params.action().to_owned(),
            message: "is listed in a manifest but has no implementation".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_manifest_parses_and_every_action_is_dispatched() {
        let infos = infos();
        assert_eq!(infos.len(), MANIFESTS.len());
        for p in &infos {
            assert_eq!(p.error, None, "{}", p.name);
            assert_eq!(p.kind, "builtin");
            assert_eq!(p.version, "1.0.0");
            assert!(!p.actions.is_empty(), "{}", p.name);
            for a in &p.actions {
                assert_eq!(a.parameters.get("type").and_then(Value::as_str), Some("object"), "{}.{}", p.name, a.name);
            }
        }
        let names: Vec<_> = infos.iter().flat_map(|p| p.actions.iter().map(move |a| format!("{}.{}", p.name, a.name))).collect();
        assert_eq!(
            names,
            [
                "file-read.read",
                "file-save.save",
                "file-edit.search-replace",
                "file-edit.insert",
                "file-delete.delete",
                "file-glob.search",
                "directory-list.tree",
                "shell-exec.run",
                "git-operations.status",
                "git-operations.diff",
                "git-operations.log",
                "git-operations.commit",
                "project-detect.analyze",
                "web-fetch.fetch"
            ]
        );
    }

    #[test]
    fn broken_manifest_becomes_plugin_error() {
        let p = parse_manifest("x", "{not json");
        assert!(p.error.as_deref().is_some_and(|e| e.starts_with("built-in manifest of \"x\" is invalid")));
    }
}

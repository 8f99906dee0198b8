//! Plugin discovery: every folder of `plugins.dirs` with a `manifest.json` becomes a plugin
//! (SPEC §9). `type: wasm` is compiled and checked here, once; `type: native` (the seed's .NET
//! assemblies) is listed as unsupported. A broken plugin is listed with its error, for
//! `list_plugins` — never a panic, and never a reason to refuse the others.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use wasmtime::Engine;

use crate::wasm::{self, Spec, WasmOptions, WasmPlugin};
use crate::{ActionInfo, PluginInfo, Registry};

const MANIFEST: &str = "manifest.json";
const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;
const MAX_MODULE_BYTES: u64 = 64 * 1024 * 1024;
const MAX_NAME_LEN: usize = 64;

/// `manifest.json`, in the seed's format.
#[derive(Deserialize)]
struct Manifest {
    name: String,
    #[serde(default)]
    version: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    entry: Option<String>,
    #[serde(default)]
    capabilities: Capabilities,
    #[serde(default)]
    exports: Exports,
}

#[derive(Default, Deserialize)]
struct Capabilities {
    #[serde(default)]
    required: Vec<String>,
    #[serde(default)]
    optional: Vec<String>,
}

#[derive(Default, Deserialize)]
struct Exports {
    #[serde(default)]
    actions: Vec<ManifestAction>,
    #[serde(default)]
    hooks: Vec<HookExport>,
}

#[derive(Deserialize)]
struct ManifestAction {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    parameters: Value,
}

/// The seed leaves the shape of `exports.hooks` open: a name, or an object with one.
#[derive(Deserialize)]
#[serde(untagged)]
enum HookExport {
    Name(String),
    Described { name: String },
}

impl HookExport {
    fn name(&self) -> &str {
        match self {
            HookExport::Name(name) | HookExport::Described { name } => name,
        }
    }
}

/// Where a plugin name was first seen, for the message when another plugin takes it.
enum Origin {
    Builtin,
    Folder(PathBuf),
}

impl Registry {
    /// The built-ins, then the plugins in the folders of each of `dirs`, in order (folders by
    /// name). WASM modules are compiled here, so this blocks for a while: call it from
    /// `spawn_blocking` in async code. Problems are per plugin, in [`PluginInfo::error`]; an
    /// unreadable directory is logged and skipped.
    pub fn load(dirs: &[PathBuf], opts: WasmOptions) -> Registry {
        let mut registry = Registry::builtin();
        let mut origins: HashMap<String, Origin> = registry.plugins.iter().map(|p| (p.name.clone(), Origin::Builtin)).collect();
        // Created on the first WASM plugin, shared by all of them.
        let mut engine: Option<Result<Engine, String>> = None;
        let mut seen_dirs: Vec<PathBuf> = Vec::new();
        for dir in dirs {
            let canonical = dir.canonicalize().unwrap_or_else(|_| dir.clone());
            if seen_dirs.contains(&canonical) {
                continue;
            }
            seen_dirs.push(canonical);
            for folder in plugin_folders(dir, &mut registry.dir_problems) {
                let (info, module) = load_folder(&folder, &opts, &mut origins, &mut engine);
                // The seed ships its built-ins as .NET plugins under the same names (its
                // `plugins.dirs` points at them); Lamplighter's own built-in is that plugin.
                if info.kind == "native" && matches!(origins.get(&info.name), Some(Origin::Builtin)) {
                    tracing::debug!(plugin = %info.name, folder = %folder.display(), "the seed's .NET build of a built-in; the built-in serves it");
                    continue;
                }
                match &info.error {
                    None => tracing::info!(plugin = %info.name, kind = %info.kind, folder = %folder.display(), "plugin loaded"),
                    Some(error) => tracing::warn!(plugin = %info.name, kind = %info.kind, %error, "plugin not loaded"),
                }
                if let Some(module) = module {
                    registry.wasm.insert(info.name.clone(), Arc::new(module));
                }
                registry.plugins.push(info);
            }
        }
        registry
    }
}

/// The sub-folders of `dir` that hold a `manifest.json`, sorted; hidden ones are skipped.
fn plugin_folders(dir: &Path, problems: &mut Vec<(PathBuf, String)>) -> Vec<PathBuf> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            let why = if error.kind() == std::io::ErrorKind::NotFound {
                "does not exist".to_string()
            } else {
                format!("cannot be read ({error})")
            };
            tracing::warn!(dir = %dir.display(), "plugin directory {why}; skipped");
            problems.push((dir.to_path_buf(), format!("plugin directory {} {why}; no plugins are loaded from it", dir.display())));
            return Vec::new();
        }
    };
    if dir.join(MANIFEST).is_file() {
        tracing::warn!(
            dir = %dir.display(),
            "plugin directory holds a manifest.json itself; list the folder that contains plugin folders instead"
        );
        problems.push((
            dir.to_path_buf(),
            format!(
                "plugin directory {} holds a manifest.json itself; list the folder that contains plugin folders instead",
                dir.display()
            ),
        ));
    }
    let mut folders: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| !path.file_name().is_some_and(|name| name.to_string_lossy().starts_with('.')))
        .filter(|path| path.is_dir() && path.join(MANIFEST).is_file())
        .collect();
    folders.sort();
    folders
}

/// One plugin folder: its listing, and the compiled module when it is a loadable WASM plugin.
fn load_folder(
    folder: &Path,
    opts: &WasmOptions,
    origins: &mut HashMap<String, Origin>,
    engine: &mut Option<Result<Engine, String>>,
) -> (PluginInfo, Option<WasmPlugin>) {
    let manifest_path = folder.join(MANIFEST);
    let manifest = match read_manifest(&manifest_path) {
        Ok(manifest) => manifest,
        Err(error) => {
            let name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            return (broken(name, error), None);
        }
    };
    let name = manifest.name.clone();
    let kind = if matches!(manifest.kind.as_str(), "wasm" | "native") { manifest.kind.clone() } else { "unknown".to_owned() };
    let mut info = PluginInfo {
        name: name.clone(),
        version: manifest.version.clone(),
        kind,
        description: manifest.description.clone(),
        actions: manifest
            .exports
            .actions
            .iter()
            .map(|a| ActionInfo { name: a.name.clone(), description: a.description.clone(), parameters: a.parameters.clone() })
            .collect(),
        hooks: manifest.exports.hooks.iter().map(|h| h.name().to_owned()).collect(),
        error: None,
    };

    if !valid_name(&name) {
        info.error = Some(format!(
            "plugin name \"{name}\" in {} is not valid: use 1 to {MAX_NAME_LEN} letters, digits, \"-\" or \"_\", starting with a letter \
             or digit",
            manifest_path.display()
        ));
        return (info, None);
    }
    if let Some(origin) = origins.get(&name) {
        info.error = Some(match origin {
            Origin::Builtin => {
                format!("plugin \"{name}\" in {} has the name of a built-in plugin; rename it in its manifest.json", folder.display())
            }
            Origin::Folder(first) => format!(
                "plugin \"{name}\" in {} has the same name as the plugin in {}, which was found first; rename one of them",
                folder.display(),
                first.display()
            ),
        });
        return (info, None);
    }
    origins.insert(name.clone(), Origin::Folder(folder.to_path_buf()));

    match manifest.kind.as_str() {
        "wasm" => match load_wasm(folder, &manifest, opts, engine) {
            Ok(module) => (info, Some(module)),
            Err(error) => {
                info.error = Some(error);
                (info, None)
            }
        },
        "native" => {
            info.error = Some(format!(
                "plugin \"{name}\" is a .NET assembly (type: native), which Lamplighter cannot load; port it to WASM (see plugins/examples)"
            ));
            (info, None)
        }
        other => {
            info.error = Some(format!(
                "plugin \"{name}\" in {} has unknown type \"{other}\"; Lamplighter loads \"wasm\" plugins (see plugins/examples)",
                manifest_path.display()
            ));
            (info, None)
        }
    }
}

fn broken(name: String, error: String) -> PluginInfo {
    PluginInfo {
        name,
        version: String::new(),
        kind: "unknown".to_owned(),
        description: String::new(),
        actions: Vec::new(),
        hooks: Vec::new(),
        error: Some(error),
    }
}

/// Reads and parses a manifest; errors name the file and, for bad JSON, `line:column`.
fn read_manifest(path: &Path) -> Result<Manifest, String> {
    let text = read_limited(path, MAX_MANIFEST_BYTES).map_err(|e| format!("cannot read plugin manifest {}: {e}", path.display()))?;
    serde_json::from_slice::<Manifest>(&text).map_err(|e| {
        let message = e.to_string();
        let position = format!(" at line {} column {}", e.line(), e.column());
        let message = message.strip_suffix(&position).unwrap_or(&message);
        format!("invalid plugin manifest {}:{}:{}: {message}", path.display(), e.line(), e.column())
    })
}

fn read_limited(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = fs::File::open(path)?;
    if file.metadata()?.len() > max {
        return Err(io::Error::other(format!("it is larger than {max} bytes")));
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::other(format!("it is larger than {max} bytes")));
    }
    Ok(bytes)
}

/// Plugin names become tool names (`plugin.action`) and folder names (the `fs` sandbox), so
/// they are kept plain.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_NAME_LEN
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn load_wasm(
    folder: &Path,
    manifest: &Manifest,
    opts: &WasmOptions,
    engine: &mut Option<Result<Engine, String>>,
) -> Result<WasmPlugin, String> {
    let name = manifest.name.as_str();
    let cannot = |reason: String| format!("cannot load plugin \"{name}\": {reason}");
    check_export_names(manifest).map_err(cannot)?;
    let Some(entry) = manifest.entry.as_deref().filter(|e| !e.trim().is_empty()) else {
        return Err(cannot(format!("{} has no \"entry\"; set it to the plugin's .wasm file", folder.join(MANIFEST).display())));
    };
    let path = resolve_entry(folder, entry).map_err(|why| cannot(format!("entry \"{entry}\" {why}")))?;
    let bytes = read_limited(&path, MAX_MODULE_BYTES).map_err(|e| cannot(format!("cannot read {}: {e}", path.display())))?;
    let engine = match engine.get_or_insert_with(wasm::new_engine) {
        Ok(engine) => engine,
        Err(error) => return Err(cannot(error.clone())),
    };
    let spec = Spec { name, required: &manifest.capabilities.required, optional: &manifest.capabilities.optional };
    wasm::compile(engine, spec, &bytes, opts)
}

/// Action and hook names: `execute` receives them (hooks as `hook:<name>`) and agents see
/// `plugin.action`, so no `.`, `:` or spaces, and no duplicates.
fn check_export_names(manifest: &Manifest) -> Result<(), String> {
    let mut actions = HashSet::new();
    for name in manifest.exports.actions.iter().map(|a| a.name.as_str()) {
        if !valid_export_name(name) {
            return Err(format!("action name \"{name}\" is not valid: use a non-empty name without \".\", \":\" or spaces"));
        }
        if !actions.insert(name) {
            return Err(format!("action \"{name}\" is listed twice in its manifest"));
        }
    }
    let mut hooks = HashSet::new();
    for name in manifest.exports.hooks.iter().map(HookExport::name) {
        if !valid_export_name(name) {
            return Err(format!("hook name \"{name}\" is not valid: use a non-empty name without \".\", \":\" or spaces"));
        }
        if !hooks.insert(name) {
            return Err(format!("hook \"{name}\" is listed twice in its manifest"));
        }
    }
    Ok(())
}

fn valid_export_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['.', ':']) && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// `entry`, relative to the plugin folder and confined to it (symlinks included).
fn resolve_entry(folder: &Path, entry: &str) -> Result<PathBuf, String> {
    let relative = Path::new(entry);
    if !relative.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(format!("must be a relative path inside the plugin folder {}", folder.display()));
    }
    let root = folder.canonicalize().map_err(|e| format!("cannot be resolved: the plugin folder {}: {e}", folder.display()))?;
    let path = root.join(relative).canonicalize().map_err(|e| format!("cannot be opened: {e}"))?;
    if !path.starts_with(&root) {
        return Err(format!("leads outside the plugin folder {} (through a symlink)", folder.display()));
    }
    if !path.is_file() {
        return Err("is not a file".to_owned());
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_are_plain() {
        for good in ["echo", "my-plugin", "a_b", "X1", "9lives"] {
            assert!(valid_name(good), "{good}");
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        for bad in ["", "-x", "../x", "a/b", "a.b", "a b", "é", long.as_str()] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn export_names_exclude_separators() {
        assert!(valid_export_name("search-replace"));
        for bad in ["", "a.b", "hook:x", "a b", "a\nb"] {
            assert!(!valid_export_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn hooks_may_be_names_or_objects() {
        let exports: Exports = serde_json::from_str(r#"{"hooks": ["a", {"name": "b", "description": "d"}]}"#).expect("parses");
        assert_eq!(exports.hooks.iter().map(HookExport::name).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn manifest_errors_name_file_line_and_column() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(MANIFEST);
        fs::write(&path, "{\n  \"name\": \"x\",\n  oops\n}").expect("write");
        let error = read_manifest(&path).err().expect("error");
        assert!(error.starts_with(&format!("invalid plugin manifest {}:3:", path.display())), "{error}");
        assert!(!error.contains(" at line "), "{error}");
    }
}

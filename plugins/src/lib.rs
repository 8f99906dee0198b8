//! Lamplighter plugins: the plugin interface, the router that finds an action by
//! `plugin.action`, the built-in plugins, plugin discovery and the WASM host. Plugins know
//! nothing of scheduling or MCP.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What bounds one action call: where files may be touched and which commands may run.
#[derive(Clone)]
pub struct ActionContext {
    /// Every file path resolves inside this directory.
    pub working_directory: PathBuf,
    /// `shell-exec` patterns (exact, case-insensitive, or `prefix*`); empty allows any command.
    pub allowed_commands: Vec<String>,
    /// Cancelled when the run is cancelled or times out; long actions stop and clean up.
    pub cancel: CancellationToken,
    /// What the call used, filled in by the host (the caller reports it as metrics).
    pub usage: Arc<Usage>,
    /// Where a command's output goes line by line as it comes (`shell-exec`), besides the
    /// action's result: the run's live log. `None`: only the result.
    pub output: Option<OutputSink>,
    /// What a WASM plugin's `ai_complete` and `mcp_call` reach, and what records its outgoing
    /// calls (the run's). `None`: they answer unavailable, and `http_request` is not recorded.
    /// Built-ins never use it: callers give it only to WASM plugins ([`Registry::is_wasm`]).
    pub host: Option<Arc<dyn HostServices>>,
}

impl std::fmt::Debug for ActionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionContext")
            .field("working_directory", &self.working_directory)
            .field("allowed_commands", &self.allowed_commands)
            .field("output", &self.output.is_some())
            .finish_non_exhaustive()
    }
}

/// Which stream a line of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Takes each line of a command's output as it comes (without its line break).
pub type OutputSink = Arc<dyn Fn(OutputStream, &str) + Send + Sync>;

/// What plugin calls used: WASM fuel so far, added by the host at the end of each call
/// (trapped ones included).
#[derive(Debug, Default)]
pub struct Usage {
    fuel: std::sync::atomic::AtomicU64,
}

impl Usage {
    pub fn fuel(&self) -> u64 {
        self.fuel.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn add_fuel(&self, n: u64) {
        self.fuel.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Why an action failed. Callers branch on the kind (e.g. bad parameters are not retried).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    #[error("unknown action \"{name}\"; known actions: {known}")]
    UnknownAction { name: String, known: String },
    #[error("{action}: parameter \"{parameter}\" {problem}")]
    InvalidParameter { action: String, parameter: String, problem: String },
    #[error("{action}: path \"{path}\" {problem}")]
    PathNotAllowed { action: String, path: String, problem: String },
    #[error("{action}: command \"{command}\" is not allowed: {reason}")]
    CommandNotAllowed { action: String, command: String, reason: String },
    #[error("{action} timed out after {seconds} s")]
    Timeout { action: String, seconds: u64 },
    #[error("{action} was cancelled")]
    Cancelled { action: String },
    /// A `before` hook refused the call.
    #[error("{action} was not run: {reason}")]
    Refused { action: String, reason: String },
    #[error("{action} failed: {message}")]
    Failed { action: String, message: String },
    #[error("plugin \"{plugin}\" has no hook \"{hook}\"; known hooks: {known}")]
    UnknownHook { plugin: String, hook: String, known: String },
}

impl ActionError {
    /// True when running the same call again cannot succeed (bad input, policy).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::UnknownAction { .. }
                | Self::UnknownHook { .. }
                | Self::Refused { .. }
                | Self::InvalidParameter { .. }
                | Self::PathNotAllowed { .. }
                | Self::CommandNotAllowed { .. }
        )
    }
}

/// One action as `list_plugins` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionInfo {
    pub name: String,
    pub description: String,
    /// JSON Schema of the parameters, as in the seed's manifests.
    pub parameters: Value,
}

/// One plugin as `list_plugins` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    /// `builtin`, `wasm`, `native`, or `unknown` when the manifest cannot be read or names
    /// another type.
    pub kind: String,
    pub description: String,
    pub actions: Vec<ActionInfo>,
    /// Hooks the plugin exports (SPEC §7), callable with [`Registry::invoke_hook`].
    pub hooks: Vec<String>,
    /// Why the plugin cannot be used, when it cannot.
    pub error: Option<String>,
}

/// The service manager's variables (systemd's notification socket and watchdog): meant for
/// the worker alone, so the processes it starts (commands, MCP servers) do not inherit them.
pub const WORKER_ONLY_ENV: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

mod builtin;
mod discovery;
mod host;
mod wasm;
mod wasm_output;

pub use builtin::confine::make_dir;
pub use builtin::shell::loose_pattern_warning;
pub use builtin::{ServerProcess, start_server};
pub use host::{HostError, HostFuture, HostPolicy, HostServices};
pub use wasm::WasmOptions;

/// Finds and calls actions by `plugin.action`. Cheap to share behind an `Arc`; immutable once
/// built, so a reload builds a new one.
#[derive(Debug, Default)]
pub struct Registry {
    /// Built-ins first, then discovered plugins in discovery order, broken ones included.
    plugins: Vec<PluginInfo>,
    /// The loaded WASM plugins by name; each has an entry without an error in `plugins`.
    wasm: HashMap<String, Arc<wasm::WasmPlugin>>,
    /// What is wrong with a folder of `plugins.dirs` itself (missing, unreadable, a plugin
    /// folder given instead of the folder of plugin folders): the folder and why.
    dir_problems: Vec<(PathBuf, String)>,
}

impl Registry {
    /// The built-in plugins only. [`Registry::load`] adds the plugins found on disk.
    pub fn builtin() -> Self {
        Self { plugins: builtin::infos(), wasm: HashMap::new(), dir_problems: Vec::new() }
    }

    /// The folders of `plugins.dirs` that gave no plugins because of the folder itself, each
    /// with why: `config validate` shows them, located at `plugins.dirs`.
    pub fn dir_problems(&self) -> &[(PathBuf, String)] {
        &self.dir_problems
    }

    /// Whether `plugin` is a loaded WASM plugin (the only kind that uses an action's `host`).
    pub fn is_wasm(&self, plugin: &str) -> bool {
        self.wasm.contains_key(plugin)
    }

    pub fn plugins(&self) -> &[PluginInfo] {
        &self.plugins
    }

    pub fn has_action(&self, plugin: &str, action: &str) -> bool {
        self.plugins.iter().any(|p| p.name == plugin && p.error.is_none() && p.actions.iter().any(|a| a.name == action))
    }

    /// The JSON Schema of an action's parameters, if the action exists and its plugin loaded.
    pub fn action_parameters(&self, plugin: &str, action: &str) -> Option<&Value> {
        self.plugins
            .iter()
            .filter(|p| p.name == plugin && p.error.is_none())
            .flat_map(|p| p.actions.iter())
            .find(|a| a.name == action)
            .map(|a| &a.parameters)
    }

    /// `"file-read.read", …` for error messages.
    pub fn action_names(&self) -> Vec<String> {
        self.plugins
            .iter()
            .filter(|p| p.error.is_none())
            .flat_map(|p| p.actions.iter().map(move |a| format!("{}.{}", p.name, a.name)))
            .collect()
    }

    pub fn has_hook(&self, plugin: &str, hook: &str) -> bool {
        self.plugins.iter().any(|p| p.name == plugin && p.error.is_none() && p.hooks.iter().any(|h| h == hook))
    }

    /// `"my-logger.log-request", …` for error messages.
    pub fn hook_names(&self) -> Vec<String> {
        self.plugins.iter().filter(|p| p.error.is_none()).flat_map(|p| p.hooks.iter().map(move |h| format!("{}.{h}", p.name))).collect()
    }

    /// Runs one action. Never panics on input, nor on a hostile WASM module; every problem is an
    /// [`ActionError`].
    pub async fn invoke(&self, plugin: &str, action: &str, params: Value, ctx: &ActionContext) -> Result<Value, ActionError> {
        let full = format!("{plugin}.{action}");
        let info =
            self.plugins.iter().filter(|p| p.name == plugin && p.error.is_none()).flat_map(|p| p.actions.iter()).find(|a| a.name == action);
        let Some(info) = info else {
            return Err(ActionError::UnknownAction { name: full, known: self.action_names().join(", ") });
        };
        // One check against the manifest's schema, for built-ins and WASM plugins alike.
        let params = builtin::Params::validate(&full, &info.parameters, params)?;
        match self.wasm.get(plugin) {
            Some(module) => module.invoke_action(action, params.into_value(), &ctx.cancel, &ctx.usage, ctx.host.clone()).await,
            None => builtin::invoke(plugin, action, &params, ctx).await,
        }
    }

    /// Calls a plugin's hook with the event as JSON (the plugin side of SPEC §7). Only WASM
    /// plugins export hooks; what the returned JSON means (e.g. cancelling a `before` event) is
    /// up to the hook engine. Bounded by the same fuel, memory and wall-time limits as actions.
    pub async fn invoke_hook(&self, plugin: &str, hook: &str, event: Value) -> Result<Value, ActionError> {
        let module = self.wasm.get(plugin).filter(|_| self.has_hook(plugin, hook));
        let Some(module) = module else {
            let known = self.hook_names();
            let known = if known.is_empty() { "(none)".to_owned() } else { known.join(", ") };
            return Err(ActionError::UnknownHook { plugin: plugin.to_owned(), hook: hook.to_owned(), known });
        };
        module.invoke_hook(hook, event, &Arc::default()).await
    }
}

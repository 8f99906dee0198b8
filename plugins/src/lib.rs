//! Lamplighter plugins: the plugin interface, the router that finds an action by
//! `plugin.action`, and the built-in plugins. Plugins know nothing of scheduling or MCP.

use std::path::PathBuf;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// What bounds one action call: where files may be touched and which commands may run.
#[derive(Debug, Clone)]
pub struct ActionContext {
    /// Every file path resolves inside this directory.
    pub working_directory: PathBuf,
    /// `shell-exec` patterns (exact, case-insensitive, or `prefix*`); empty allows any command.
    pub allowed_commands: Vec<String>,
    /// Cancelled when the run is cancelled or times out; long actions stop and clean up.
    pub cancel: CancellationToken,
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
    #[error("{action} failed: {message}")]
    Failed { action: String, message: String },
}

impl ActionError {
    /// True when running the same call again cannot succeed (bad input, policy).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::UnknownAction { .. } | Self::InvalidParameter { .. } | Self::PathNotAllowed { .. } | Self::CommandNotAllowed { .. }
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
    /// `builtin`, `wasm`, `native`.
    pub kind: String,
    pub description: String,
    pub actions: Vec<ActionInfo>,
    /// Why the plugin cannot be used, when it cannot.
    pub error: Option<String>,
}

mod builtin;

/// Finds and calls actions by `plugin.action`. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Registry {
    plugins: Vec<PluginInfo>,
}

impl Registry {
    /// The built-in plugins.
    pub fn builtin() -> Self {
        Self { plugins: builtin::infos() }
    }

    pub fn plugins(&self) -> &[PluginInfo] {
        &self.plugins
    }

    pub fn has_plugin(&self, plugin: &str) -> bool {
        self.plugins.iter().any(|p| p.name == plugin && p.error.is_none())
    }

    pub fn has_action(&self, plugin: &str, action: &str) -> bool {
        self.plugins.iter().any(|p| p.name == plugin && p.error.is_none() && p.actions.iter().any(|a| a.name == action))
    }

    /// `"file-read.read", …` for error messages.
    pub fn action_names(&self) -> Vec<String> {
        self.plugins
            .iter()
            .filter(|p| p.error.is_none())
            .flat_map(|p| p.actions.iter().map(move |a| format!("{}.{}", p.name, a.name)))
            .collect()
    }

    /// Runs one action. Never panics on input; every problem is an [`ActionError`].
    pub async fn invoke(&self, plugin: &str, action: &str, params: Value, ctx: &ActionContext) -> Result<Value, ActionError> {
        if !self.has_action(plugin, action) {
            return Err(ActionError::UnknownAction { name: format!("{plugin}.{action}"), known: self.action_names().join(", ") });
        }
        builtin::invoke(plugin, action, params, ctx).await
    }
}

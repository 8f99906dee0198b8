//! The built-in plugins (placeholder until filled in).

use serde_json::Value;

use crate::{ActionContext, ActionError, PluginInfo};

pub(crate) fn infos() -> Vec<PluginInfo> {
    Vec::new()
}

pub(crate) async fn invoke(plugin: &str, action: &str, _params: Value, _ctx: &ActionContext) -> Result<Value, ActionError> {
    Err(ActionError::UnknownAction { name: format!("{plugin}.{action}"), known: String::new() })
}

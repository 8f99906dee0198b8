//! The run's side of WASM plugins' host functions ([`HostServices`]): `ai_complete` through the
//! providers, rate limits and budget agents use, recorded with the run's usage (its own
//! conversation in the transcript); `mcp_call` through the MCP client pool; and every outgoing
//! call (`http_request` too) as an operation of the run ([`Op::HostCall`]: span, metric, hooks).

use std::sync::Arc;

use opentelemetry::context::FutureExt as _;
use serde_json::{Value, json};

use lamplighter_config::resolve_model;
use lamplighter_plugins::{HostError, HostFuture, HostServices};

use super::budget::{BudgetCheck, over_budget};
use super::model::{Endpoint, Msg};
use super::{AgentRuntime, MCP_CALL_TIMEOUT};
use crate::context::RunContext;
use crate::events::{Cancelled, Ended, Op, RunRef};
use crate::run::{AgentUsage, CallKind, CallRecord, StepStatus};

/// One run's host services, handed to the plugin actions it calls.
pub(crate) struct RunHost {
    ctx: RunContext,
    runtime: Arc<AgentRuntime>,
}

impl RunHost {
    pub(crate) fn for_run(ctx: &RunContext, runtime: &Arc<AgentRuntime>) -> Arc<dyn HostServices> {
        Arc::new(Self { ctx: ctx.clone(), runtime: runtime.clone() })
    }
}

/// A completion as a plugin asks for it.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Completion {
    model: Option<String>,
    system: Option<String>,
    prompt: Option<String>,
    #[serde(default)]
    messages: Vec<Message>,
    max_tokens: Option<u32>,
    temperature: Option<f64>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    role: String,
    content: String,
}

impl Completion {
    fn messages(&self) -> Result<Vec<Msg>, HostError> {
        let mut out: Vec<Msg> = self.system.iter().map(|s| Msg::System(s.clone())).collect();
        for m in &self.messages {
            out.push(match m.role.as_str() {
                "system" => Msg::System(m.content.clone()),
                "user" => Msg::User(m.content.clone()),
                "assistant" => Msg::Assistant { content: m.content.clone(), calls: Vec::new() },
                other => return Err(HostError::Invalid(format!("message role \"{other}\" is not system, user or assistant"))),
            });
        }
        if let Some(p) = &self.prompt {
            out.push(Msg::User(p.clone()));
        }
        if !out.iter().any(|m| matches!(m, Msg::User(_))) {
            return Err(HostError::Invalid("a completion needs a prompt, or a user message".into()));
        }
        Ok(out)
    }
}

impl HostServices for RunHost {
    fn observed<'a>(
        &'a self,
        plugin: &'a str,
        function: &'static str,
        target: String,
        call: HostFuture<'a, Result<Value, HostError>>,
    ) -> HostFuture<'a, Result<Value, HostError>> {
        Box::pin(async move {
            let obs = self.ctx.observer();
            let op = Op::HostCall { plugin: plugin.to_string(), function, target };
            let started = obs.begin(op, RunRef::from(self.ctx.run()), None).await.map_err(|Cancelled(why)| HostError::Denied(why))?;
            let result = call.with_context(started.context()).await;
            let ended = match &result {
                Ok(answer) if answer.get("is_error") == Some(&Value::Bool(true)) => Ended::failed("the tool answered an error"),
                Ok(_) => Ended::ok(),
                Err(HostError::Denied(e) | HostError::Invalid(e) | HostError::Failed(e) | HostError::Unavailable(e)) => Ended::failed(e),
            };
            started.end(obs, ended).await;
            result
        })
    }

    fn complete<'a>(&'a self, plugin: &'a str, request: Value) -> HostFuture<'a, Result<Value, HostError>> {
        Box::pin(async move {
            let req: Completion =
                serde_json::from_value(request).map_err(|e| HostError::Invalid(format!("not a completion request: {e}")))?;
            let messages = req.messages()?;
            let catalog = self.ctx.agents();
            let alias = req
                .model
                .clone()
                .or_else(|| catalog.default_model.clone())
                .ok_or_else(|| HostError::Denied("no model named, and no ai.default_model".into()))?;
            let model = resolve_model(&catalog.providers, None, &alias)
                .ok_or_else(|| HostError::Denied(format!("model \"{alias}\" is not defined under ai.providers")))?;
            if let Some(why) = catalog.providers_down.get(&model.provider) {
                return Err(HostError::Denied(format!("model \"{alias}\": provider \"{}\" is disabled: {why}", model.provider)));
            }
            let provider = catalog
                .providers
                .get(&model.provider)
                .ok_or_else(|| HostError::Denied(format!("model \"{alias}\": provider \"{}\" is not defined", model.provider)))?;
            // The job's budget counts what its plugins spend, as it counts its agents' (raised by
            // the budget asks a person approved).
            if let Some(budget) = &self.ctx.job().budget {
                let read = |e: crate::store::StoreError| HostError::Failed(format!("cannot read the run's usage: {e}"));
                let calls = self.ctx.calls().await.map_err(read)?;
                let steps = self.ctx.steps().await.map_err(read)?;
                let raised = steps.iter().filter(|s| s.step.starts_with(super::BUDGET_WAIT) && s.status == StepStatus::Succeeded).count();
                if let Some(why) =
                    over_budget(budget, &AgentUsage::of(&calls), u32::try_from(raised).unwrap_or(u32::MAX), BudgetCheck::ModelCall)
                {
                    return Err(HostError::Denied(format!("the run's budget is spent: {why}")));
                }
            }
            let mut endpoint = Endpoint::new(provider, &model.model).map_err(|e| HostError::Failed(format!("model \"{alias}\": {e}")))?;
            if req.max_tokens.is_some() {
                endpoint.max_tokens = req.max_tokens;
            }
            if req.temperature.is_some() {
                endpoint.temperature = req.temperature;
            }
            let started = self.ctx.clock().now();
            let limiter = self.runtime.limiter(provider);
            let http = self.runtime.http().map_err(|e| HostError::Failed(format!("model \"{alias}\": cannot make HTTP requests: {e}")))?;
            let reply = endpoint
                .call(http, &limiter, &messages, &[], self.ctx.cancelled())
                .await
                .map_err(|e| HostError::Failed(format!("model \"{alias}\": {}", e.error)))?;
            // Recorded as the run's agents' calls are: usage, cost, the transcript, the budget.
            let run = self.ctx.run();
            let record = CallRecord {
                conversation: format!("plugin:{plugin}/{}", uuid::Uuid::now_v7().simple()),
                seq: 0,
                kind: CallKind::Model,
                name: endpoint.model().to_string(),
                call_id: None,
                request: Some(json!({"plugin": plugin, "messages": messages.len()})),
                response: Some(json!({"content": reply.content, "finish_reason": reply.finish_reason, "attempts": reply.attempts})),
                error: None,
                input_tokens: reply.input_tokens,
                output_tokens: reply.output_tokens,
                cost: model.model.pricing.map(|p| p.cost(reply.input_tokens, reply.output_tokens)),
                run_id: run.id.clone(),
                attempt: run.attempt,
                started_at: started,
                finished_at: self.ctx.clock().now(),
            };
            self.ctx.record_call(&record).await.map_err(|e| HostError::Failed(format!("cannot record the completion: {e}")))?;
            Ok(json!({
                "content": reply.content,
                "model": endpoint.model(),
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                "finish_reason": reply.finish_reason,
            }))
        })
    }

    fn mcp_call<'a>(
        &'a self,
        _plugin: &'a str,
        server: &'a str,
        tool: &'a str,
        arguments: Value,
    ) -> HostFuture<'a, Result<Value, HostError>> {
        Box::pin(async move {
            let catalog = self.ctx.agents();
            let def = catalog
                .mcp_servers
                .get(server)
                .ok_or_else(|| HostError::Denied(format!("MCP server \"{server}\" is not defined under mcp.servers")))?;
            let r = tokio::select! {
                r = self.runtime.mcp.call(server, def, tool, arguments, MCP_CALL_TIMEOUT) => r.map_err(HostError::Failed)?,
                () = self.ctx.cancelled().cancelled() => return Err(HostError::Failed("cancelled".into())),
            };
            Ok(json!({"text": r.text, "is_error": r.is_error}))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(v: Value) -> Result<Vec<Msg>, HostError> {
        serde_json::from_value::<Completion>(v).map_err(|e| HostError::Invalid(e.to_string()))?.messages()
    }

    #[test]
    fn a_completion_is_a_system_prompt_messages_and_a_prompt() {
        assert_eq!(
            completion(json!({"system": "be brief", "prompt": "hi"})),
            Ok(vec![Msg::System("be brief".into()), Msg::User("hi".into())])
        );
        let chat =
            completion(json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "prompt": "c"}));
        assert_eq!(chat.map(|m| m.len()), Ok(3));
        assert!(matches!(completion(json!({"system": "only"})), Err(HostError::Invalid(m)) if m.contains("needs a prompt")));
        assert!(matches!(completion(json!({"messages": [{"role": "tool", "content": "x"}]})), Err(HostError::Invalid(_))));
        assert!(matches!(completion(json!({"prompt": "x", "stream": true})), Err(HostError::Invalid(_))));
    }
}

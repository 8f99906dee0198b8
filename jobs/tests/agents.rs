//! Agents on the real engine and SQLite, against the scripted OpenAI-compatible server over
//! real HTTP: the tool loop over plugin tools, what goes back to the model when a tool call is
//! wrong, retries (429 with Retry-After, 500, a reply past the timeout), token accounting,
//! budgets (fail, ask; time on the engine clock), `max_iters`, tool approval (ask, deny), delegation and pipelines, the Responses API,
//! agent steps in a workflow, and keys that stay out of records.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lamplighter_config::Config;
use lamplighter_jobs::{CallKind, DecisionRequest, Engine, ManualClock, RunStatus, TriggerRequest};
use lamplighter_tests::llm::{Reply, ScriptedLlm, last_text, system, tool_results};
use serde_json::{Value, json};

use support::{config_with, detail, ended, start, t0, waiting};

/// A provider `p` at the scripted server and the given agents (YAML under `agents:`), and a
/// job `j` running agent `a` (extra job lines in `job`).
fn agents(dir: &Path, llm: &ScriptedLlm, provider_extra: &str, agents_yaml: &str, job: &str) -> Config {
    let agents: String = agents_yaml.lines().map(|l| format!("  {l}\n")).collect();
    let extra: String = provider_extra.lines().map(|l| format!("      {l}\n")).collect();
    let top = format!(
        "ai:\n  default_model: m\n  providers:\n    p:\n      base_url: {}\n      api_key: sk-test-secret\n{extra}      models:\n        m: {{id: scripted-model, pricing: {{input: 1.0, output: 2.0}}}}\nagents:\n{agents}",
        llm.base_url()
    );
    config_with(dir, &top, &format!("type: agent\nagent: a\n{job}"))
}

async fn trigger(engine: &Engine, input: &str) -> String {
    let req = TriggerRequest { input: Some(json!(input)), ..Default::default() };
    engine.service().trigger_job("j", req).await.expect("trigger").run_id
}

fn decision(run: &str, approve: bool, comment: Option<&str>) -> DecisionRequest {
    DecisionRequest { run_id: run.into(), step: None, approve, comment: comment.map(str::to_string), decided_by: "ana".into() }
}

fn tools_offered(body: &Value) -> Vec<String> {
    body["tools"].as_array().into_iter().flatten().filter_map(|t| t["function"]["name"].as_str().map(str::to_string)).collect()
}

#[tokio::test]
async fn the_tool_loop_runs_plugin_tools_and_records_a_transcript_with_usage_and_cost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((10, 5), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("file-save__save".into(), r##"{"path": "out/news.md", "content": "# News"}"##.into())]),
        _ => Reply::Text(format!("done: {}", last_text(req))),
    })
    .await;
    let config = agents(dir.path(), &llm, "", "a:\n  system_prompt: You save news.\n  plugins: [file-save]\n  working_directory: work", "");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let id = trigger(&engine, "save the news").await;
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert!(run.output.as_ref().and_then(Value::as_str).is_some_and(|o| o.starts_with("done: ")), "{:?}", run.output);
    assert_eq!(std::fs::read_to_string(dir.path().join("work/out/news.md")).expect("saved in the working directory"), "# News");

    let seen = llm.seen();
    assert_eq!(seen.len(), 2);
    let first = &seen[0].body;
    assert_eq!(system(first), "You save news.");
    assert_eq!(first["model"], "scripted-model");
    assert_eq!(tools_offered(first), ["file-save__save"], "tool names follow provider rules");
    assert!(tools_offered(first).iter().all(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')));
    assert_eq!(seen[0].authorization.as_deref(), Some("Bearer sk-test-secret"));

    let d = detail(&engine, &id).await;
    let kinds: Vec<(CallKind, &str)> = d.calls.iter().map(|c| (c.kind, c.name.as_str())).collect();
    assert_eq!(kinds, [(CallKind::Model, "scripted-model"), (CallKind::Tool, "file-save.save"), (CallKind::Model, "scripted-model")]);
    assert_eq!(d.calls[1].request, Some(json!({"path": "out/news.md", "content": "# News"})));
    let usage = d.usage.clone().expect("usage");
    assert_eq!((usage.model_calls, usage.tool_calls, usage.input_tokens, usage.output_tokens), (2, 1, 20, 10));
    // 20 × 1.0 + 10 × 2.0 per million tokens.
    assert!((usage.cost.expect("priced") - 40.0 / 1e6).abs() < 1e-12);
    let everything = serde_json::to_string(&d).expect("json");
    assert!(!everything.contains("sk-test-secret"), "the key never reaches a record");
}

#[tokio::test]
async fn wrong_tool_calls_go_back_to_the_model_as_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| match tool_results(req) {
        0 => Reply::Tools(vec![
            ("no_such_tool".into(), "{}".into()),
            ("file-read__read".into(), "{not json".into()),
            ("file-read__read".into(), r#"{"path": "missing.txt"}"#.into()),
        ]),
        _ => {
            let results: Vec<String> = lamplighter_tests::llm::messages(req)
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_string())
                .collect();
            Reply::Text(results.join("\n---\n"))
        }
    })
    .await;
    let config = agents(dir.path(), &llm, "", "a:\n  plugins: [file-read]", "");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let id = trigger(&engine, "read").await;
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let out = run.output.and_then(|o| o.as_str().map(str::to_string)).unwrap_or_default();
    let parts: Vec<&str> = out.split("\n---\n").collect();
    assert_eq!(parts.len(), 3, "{out}");
    assert!(parts[0].contains("there is no tool named \"no_such_tool\"") && parts[0].contains("file-read__read"), "{}", parts[0]);
    assert!(parts[1].contains("not valid JSON"), "{}", parts[1]);
    assert!(parts[2].starts_with("error:") && parts[2].contains("missing.txt"), "{}", parts[2]);
    let d = detail(&engine, &id).await;
    assert_eq!(d.calls.iter().filter(|c| c.kind == CallKind::Tool && c.error.is_some()).count(), 3);
}

#[tokio::test]
async fn a_429_with_retry_after_a_500_and_a_reply_past_the_timeout_are_retried_within_the_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    let llm = ScriptedLlm::start((3, 4), move |_| match count.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::Status { code: 429, retry_after: Some("1".into()) },
        1 => Reply::Status { code: 500, retry_after: None },
        2 => Reply::Hang,
        _ => Reply::Text("made it".into()),
    })
    .await;
    let config = agents(dir.path(), &llm, "timeout: 1s\nmax_retries: 3", "a: {}", "");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let id = trigger(&engine, "go").await;
    let run = ended(&engine, &id).await;
    assert_eq!((run.status, run.output.clone()), (RunStatus::Succeeded, Some(json!("made it"))), "{run:#?}");
    let seen = llm.seen();
    assert_eq!(seen.len(), 4);
    assert!(seen[1].at - seen[0].at >= Duration::from_secs(1), "Retry-After: 1 was honoured");
    assert!(seen.windows(2).all(|w| w[0].body == w[1].body), "every retry resends the same turn");
    let d = detail(&engine, &id).await;
    assert_eq!(d.calls.len(), 1, "one model call recorded, whatever its attempts");
    assert_eq!(d.calls[0].response.as_ref().map(|r| r["attempts"].clone()), Some(json!(4)));
    assert_eq!((d.calls[0].input_tokens, d.calls[0].output_tokens), (3, 4), "the answer's usage");

    // Past max_retries the run fails, naming the provider.
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |_| Reply::Status { code: 503, retry_after: Some("0".into()) }).await;
    let config = agents(dir.path(), &llm, "max_retries: 2", "a: {}", "");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let run = ended(&engine, &trigger(&engine, "go").await).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap_or_default();
    assert!(error.contains("provider \"p\": HTTP 503") && error.contains("gave up after 3 attempts"), "{error}");
    assert_eq!(llm.seen().len(), 3);
}

#[tokio::test]
async fn a_budget_stops_the_run_or_asks_to_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A model that never stops calling tools.
    let llm =
        ScriptedLlm::start((10, 5), |_| Reply::Tools(vec![("shell-exec__run".into(), r#"{"command": "echo x >> calls.txt"}"#.into())]))
            .await;
    let config =
        agents(dir.path(), &llm, "", "a:\n  plugins: [shell-exec]\n  allowed_commands: ['echo*']", "budget: {max_tokens_total: 20}");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let run = ended(&engine, &trigger(&engine, "go").await).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_deref(), Some("budget exceeded: 30 tokens used, max_tokens_total is 20"));
    assert_eq!(llm.seen().len(), 2, "the call that would go over is not made");

    // max_cost, from the model's pricing (1.0 in / 2.0 out per million): 20e-6 a call.
    let dir = tempfile::tempdir().expect("tempdir");
    let config =
        agents(dir.path(), &llm, "", "a:\n  plugins: [shell-exec]\n  allowed_commands: ['echo*']\n  budget: {max_cost: 0.00003}", "");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let run = ended(&engine, &trigger(&engine, "go").await).await;
    assert_eq!(run.error.as_deref(), Some("budget exceeded: cost 0.000040 reached, max_cost is 0.000030"));

    // on_budget: ask — the run waits; an approval raises the budget by as much again.
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| match tool_results(req) {
        n if n < 2 => Reply::Tools(vec![("shell-exec__run".into(), r#"{"command": "echo x >> calls.txt"}"#.into())]),
        _ => Reply::Text("two calls made".into()),
    })
    .await;
    let config = agents(
        dir.path(),
        &llm,
        "",
        "a:\n  plugins: [shell-exec]\n  allowed_commands: ['echo*']\n  budget: {max_tool_calls: 1, on_budget: ask}",
        "",
    );
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let id = trigger(&engine, "go").await;
    waiting(&engine, &id).await;
    let approvals = engine.service().list_approvals().await.expect("approvals");
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].step, "agent:budget-1");
    let q = approvals[0].question.clone().unwrap_or_default();
    assert!(q.as_str().is_some_and(|q| q.contains("1 tool calls made, max_tool_calls is 1")), "{q}");
    engine.service().decide(decision(&id, true, None)).await.expect("approve");
    let run = ended(&engine, &id).await;
    assert_eq!((run.status, run.output), (RunStatus::Succeeded, Some(json!("two calls made"))));
    assert_eq!(llm.seen().len(), 3, "the model call made before the wait is not made again");
    assert_eq!(std::fs::read_to_string(dir.path().join("data/calls.txt")).expect("calls"), "x\nx\n", "each tool ran once");
}

#[tokio::test]
async fn max_iters_ends_a_run_whose_model_never_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm =
        ScriptedLlm::start((1, 1), |_| Reply::Tools(vec![("shell-exec__run".into(), r#"{"command": "echo x >> calls.txt"}"#.into())]))
            .await;
    let config = agents(dir.path(), &llm, "", "a:\n  plugins: [shell-exec]\n  allowed_commands: ['echo*']\n  max_iters: 3", "");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let run = ended(&engine, &trigger(&engine, "go").await).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    assert_eq!(run.error.as_deref(), Some("agent \"a\" gave no answer within max_iters (3) model calls"));
    assert_eq!(llm.seen().len(), 3, "exactly max_iters model calls");
    assert_eq!(std::fs::read_to_string(dir.path().join("data/calls.txt")).expect("calls"), "x\nx\nx\n", "each call's tool ran");
}

#[tokio::test]
async fn max_duration_counts_the_time_spent_in_calls_on_the_engine_clock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(t0()));
    // Each model call takes 40 s of the engine's time: the provider moves the clock as it answers.
    let moved = clock.clone();
    let llm = ScriptedLlm::start((1, 1), move |_| {
        moved.advance(chrono::Duration::seconds(40));
        Reply::Tools(vec![("shell-exec__run".into(), r#"{"command": "echo x >> calls.txt"}"#.into())])
    })
    .await;
    let config =
        agents(dir.path(), &llm, "", "a:\n  plugins: [shell-exec]\n  allowed_commands: ['echo*']\n  budget: {max_duration: 1m}", "");
    let engine = start(&config, &clock).await;
    let run = ended(&engine, &trigger(&engine, "go").await).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:#?}");
    assert_eq!(run.error.as_deref(), Some("budget exceeded: running for 1m 20s, max_duration is 1m"));
    assert_eq!(llm.seen().len(), 2, "40 s after the first call there is budget left; after the second there is none");
}

#[tokio::test]
async fn tool_approval_ask_waits_for_a_person_and_deny_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("file-save__save".into(), r#"{"path": "a.txt", "content": "A"}"#.into())]),
        _ => Reply::Text(format!("tool said: {}", last_text(req))),
    })
    .await;
    let config = agents(
        dir.path(),
        &llm,
        "",
        "a:\n  plugins: [file-save]\n  tool_approval: {mode: ask, tools: ['file-save.*']}\nd:\n  plugins: [file-save]\n  tool_approval: deny",
        "",
    );
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    // Approved: the call runs, once.
    let id = trigger(&engine, "save").await;
    waiting(&engine, &id).await;
    let approvals = engine.service().list_approvals().await.expect("approvals");
    assert_eq!(approvals[0].step, "agent:tool-1");
    let q = approvals[0].question.clone().unwrap_or_default();
    assert!(q.as_str().is_some_and(|q| q.contains("file-save.save") && q.contains("a.txt")), "shows the tool and its arguments: {q}");
    engine.service().decide(decision(&id, true, None)).await.expect("approve");
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("data/a.txt")).expect("saved"), "A");
    // Rejected: the model is told, with the comment, and the file is not written.
    std::fs::remove_file(dir.path().join("data/a.txt")).expect("rm");
    let id = trigger(&engine, "save").await;
    waiting(&engine, &id).await;
    engine.service().decide(decision(&id, false, Some("not today"))).await.expect("reject");
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.output, Some(json!("tool said: error: refused by ana: not today")));
    assert!(!dir.path().join("data/a.txt").exists());
    let d = detail(&engine, &id).await;
    assert_eq!(d.agent_waits.len(), 1, "the decision is kept with the run");

    // deny: refused at once, no wait.
    let config = agents(dir.path(), &llm, "", "a:\n  plugins: [file-save]\n  tool_approval: deny", "");
    engine.reload(&config).expect("reload");
    let run = ended(&engine, &trigger(&engine, "save").await).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    let out = run.output.and_then(|o| o.as_str().map(str::to_string)).unwrap_or_default();
    assert!(out.contains("refused: agent \"a\" may not call file-save.save (tool_approval: deny)"), "{out}");
}

#[tokio::test]
async fn delegation_runs_agents_concurrently_and_pipelines_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| {
        let who = system(req);
        let input = lamplighter_tests::llm::messages(req)
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        match (who.as_str(), tool_results(req)) {
            ("boss", 0) if input == "fan out" => Reply::Tools(vec![(
                "delegate_to_multiple_agents".into(),
                json!({"tasks": [{"agent": "x", "task": "one"}, {"agent": "broken", "task": "two"}]}).to_string(),
            )]),
            ("boss", 0) => Reply::Tools(vec![("run_pipeline".into(), json!({"pipeline": "chain", "input": "start"}).to_string())]),
            ("boss", _) => Reply::Text(last_text(req)),
            ("broken", _) => Reply::Status { code: 400, retry_after: None },
            (name, _) => Reply::Text(format!("{name}({input})")),
        }
    })
    .await;
    let agents_yaml = "a:\n  system_prompt: boss\n  delegates: [x, y, broken]\nx:\n  system_prompt: x\ny:\n  system_prompt: y\nbroken:\n  system_prompt: broken";
    let dirp = dir.path();
    let config = agents(dirp, &llm, "", agents_yaml, "");
    // Pipelines live at the top level: add one.
    let path = dirp.join("lamplighter.yaml");
    let text = std::fs::read_to_string(&path).expect("read").replace("agents:\n", "pipelines:\n  chain:\n    steps: [x, y]\nagents:\n");
    std::fs::write(&path, text).expect("write");
    let config = lamplighter_config::load(&lamplighter_config::LoadOptions {
        path: Some(path),
        cwd: Some(dirp.to_path_buf()),
        ..Default::default()
    })
    .map(|l| l.config)
    .unwrap_or(config);
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;

    let run = ended(&engine, &trigger(&engine, "fan out").await).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    let labelled: Value = serde_json::from_str(run.output.as_ref().and_then(Value::as_str).unwrap_or("null")).expect("labelled json");
    assert_eq!(labelled[0], json!({"agent": "x", "ok": true, "answer": "x(one)"}));
    assert_eq!(
        (labelled[1]["agent"].clone(), labelled[1]["ok"].clone()),
        (json!("broken"), json!(false)),
        "one failure does not stop the other"
    );

    let run = ended(&engine, &trigger(&engine, "chain it").await).await;
    assert_eq!(run.output, Some(json!("y(x(start))")), "each pipeline step gets the previous answer");
}

#[tokio::test]
async fn responses_api_models_and_agent_steps_in_a_workflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((2, 3), |req| {
        let input = req["input"].as_array().cloned().unwrap_or_default();
        match input.iter().any(|i| i["type"] == "function_call_output") {
            false => Reply::Tools(vec![("file-save__save".into(), r#"{"path": "r.txt", "content": "R"}"#.into())]),
            true => Reply::Text(format!("wrote; {}", req["instructions"].as_str().unwrap_or(""))),
        }
    })
    .await;
    let top = format!(
        "ai:\n  providers:\n    p:\n      base_url: {}\n      models:\n        code: {{id: codex, api_type: responses}}\nagents:\n  coder:\n    model: code\n    system_prompt: be brief\n    plugins: [file-save]\nworkflows:\n  w:\n    steps:\n      - id: write\n        type: agent\n        agent: coder\n        input: \"${{input.task}}\"\n      - id: after\n        type: agent\n        agent: coder\n        input: \"again: ${{steps.write.output}}\"\n",
        llm.base_url()
    );
    let config = config_with(dir.path(), &top, "type: workflow\nworkflow: w");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let req = TriggerRequest { input: Some(json!({"task": "write r"})), ..Default::default() };
    let id = engine.service().trigger_job("j", req).await.expect("trigger").run_id;
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{run:#?}");
    assert_eq!(run.output, Some(json!("wrote; be brief")));
    let seen = llm.seen();
    assert!(seen.iter().all(|s| s.path == "/v1/responses"), "api_type: responses uses the Responses API");
    assert_eq!(seen[0].body["input"][0]["content"], "write r", "the step's input template rendered");
    assert_eq!(seen[2].body["input"][0]["content"], "again: wrote; be brief", "the next step sees the previous output");
    let d = detail(&engine, &id).await;
    let convs: Vec<&str> = d.calls.iter().map(|c| c.conversation.as_str()).collect();
    assert_eq!(convs, ["after", "after", "after", "write", "write", "write"], "one conversation per step");
}

#[tokio::test]
async fn a_group_chat_step_passes_each_answer_to_the_next_participant_for_its_rounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| {
        let input = lamplighter_tests::llm::messages(req)
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        Reply::Text(format!("{}({input})", system(req)))
    })
    .await;
    let top = format!(
        "ai:\n  providers:\n    p:\n      base_url: {}\n      models:\n        m: {{id: m}}\nagents:\n  a: {{model: m, system_prompt: a}}\n  b: {{model: m, system_prompt: b}}\nworkflows:\n  w:\n    steps:\n      - {{id: chat, type: group_chat, agents: [a, b], input: \"${{input}}\", max_iterations: 2}}\n",
        llm.base_url()
    );
    let config = config_with(dir.path(), &top, "type: workflow\nworkflow: w");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let run = ended(&engine, &trigger(&engine, "x").await).await;
    assert_eq!((run.status, run.output), (RunStatus::Succeeded, Some(json!("b(a(b(a(x))))"))));
    let d = detail(&engine, &run.id).await;
    let convs: Vec<&str> = d.calls.iter().map(|c| c.conversation.as_str()).collect();
    assert_eq!(convs, ["chat#0.0", "chat#0.1", "chat#1.0", "chat#1.1"], "one conversation per turn");
}

#[tokio::test]
async fn an_agent_from_a_markdown_file_runs_with_its_body_as_the_system_prompt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| Reply::Text(format!("prompt was: {}", system(req).trim()))).await;
    std::fs::create_dir_all(dir.path().join("agents")).expect("agents dir");
    std::fs::write(dir.path().join("agents/scribe.md"), "---\nmodel: m\ndescription: writes things\n---\nYou are a scribe.\n").expect("md");
    let config = agents(dir.path(), &llm, "", "a: {}", "");
    assert!(config.agents.contains_key("scribe"), "loaded from agents/scribe.md");
    let path = dir.path().join("lamplighter.yaml");
    let text = std::fs::read_to_string(&path).expect("read").replace("agent: a\n", "agent: scribe\n");
    std::fs::write(&path, text).expect("write");
    let config = lamplighter_config::load(&lamplighter_config::LoadOptions {
        path: Some(path),
        cwd: Some(dir.path().to_path_buf()),
        ..Default::default()
    })
    .expect("config")
    .config;
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let run = ended(&engine, &trigger(&engine, "write").await).await;
    assert_eq!((run.status, run.output), (RunStatus::Succeeded, Some(json!("prompt was: You are a scribe."))));
}

#[tokio::test]
async fn azure_openai_is_addressed_by_deployment_with_its_api_key_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((4, 2), |_| Reply::Text("from azure".into())).await;
    let top = format!(
        "ai:\n  providers:\n    az:\n      endpoint: {}/\n      api_version: 2024-10-21\n      api_key: az-secret\n      models:\n        default: {{id: gpt-5-mini, deployment_name: prod-mini, max_tokens: 50}}\nagents:\n  a: {{model: default}}\n",
        llm.endpoint()
    );
    let config = config_with(dir.path(), &top, "type: agent\nagent: a");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let run = ended(&engine, &trigger(&engine, "hi").await).await;
    assert_eq!((run.status, run.output.clone()), (RunStatus::Succeeded, Some(json!("from azure"))), "{run:#?}");
    let seen = llm.seen();
    assert_eq!(seen[0].path, "/openai/deployments/prod-mini/chat/completions?api-version=2024-10-21");
    assert_eq!((seen[0].api_key.as_deref(), seen[0].authorization.as_deref()), (Some("az-secret"), None));
    assert_eq!(seen[0].body["max_completion_tokens"], 50, "Azure wants max_completion_tokens");
    assert!(seen[0].body.get("max_tokens").is_none());
}

#[tokio::test]
async fn cancelling_a_run_stops_a_model_call_in_flight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tx, mut in_flight) = tokio::sync::mpsc::unbounded_channel();
    let llm = ScriptedLlm::start((1, 1), move |_| {
        let _ = tx.send(());
        Reply::Hang
    })
    .await;
    let config = agents(dir.path(), &llm, "", "a: {}", "");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let id = trigger(&engine, "think long").await;
    tokio::time::timeout(Duration::from_secs(10), in_flight.recv()).await.expect("the model call to start");
    let started = std::time::Instant::now();
    engine.service().cancel_run(&id).await.expect("cancel");
    let run = ended(&engine, &id).await;
    assert_eq!(run.status, RunStatus::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(10), "the call was abandoned, not waited out");
    assert!(detail(&engine, &id).await.calls.is_empty(), "a call that did not return is not recorded");
}

#[tokio::test]
async fn delegation_stops_at_the_depth_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    // An agent that delegates to itself whenever it can.
    let llm = ScriptedLlm::start((1, 1), |req| {
        let can_delegate = req["tools"].as_array().is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "delegate_to_agent"));
        match (can_delegate, tool_results(req)) {
            (true, 0) => Reply::Tools(vec![("delegate_to_agent".into(), json!({"agent": "a", "task": "go deeper"}).to_string())]),
            (true, _) => Reply::Text(format!("up: {}", last_text(req))),
            (false, _) => Reply::Text("bottom".into()),
        }
    })
    .await;
    let config = agents(dir.path(), &llm, "", "a:\n  delegates: [a]", "");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;
    let run = ended(&engine, &trigger(&engine, "start").await).await;
    assert_eq!(run.output, Some(json!("up: up: up: bottom")), "{run:#?}");
    let depth = lamplighter_jobs::MAX_DELEGATION_DEPTH as usize;
    let without_tools = llm.seen().iter().filter(|s| s.body.get("tools").is_none()).count();
    assert_eq!(without_tools, 1, "only the agent {depth} levels down was offered no delegation");
    let d = detail(&engine, &run.id).await;
    let conversations: std::collections::BTreeSet<&str> = d.calls.iter().map(|c| c.conversation.as_str()).collect();
    assert_eq!(conversations.len(), depth + 1, "{conversations:?}");
}

#[tokio::test]
async fn agents_pipelines_and_group_chats_run_by_hand_as_durable_runs_under_their_own_job_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let llm = ScriptedLlm::start((1, 1), |req| {
        let input = lamplighter_tests::llm::user_input(req);
        match system(req).as_str() {
            "broken" => Reply::Status { code: 400, retry_after: None },
            who => Reply::Text(format!("{who}({input})")),
        }
    })
    .await;
    let top = format!(
        "ai:\n  providers:\n    p:\n      base_url: {}\n      models:\n        m: {{id: m}}\n  default_model: m\n\
         agents:\n  a: {{system_prompt: a}}\n  b: {{system_prompt: b}}\n  broken: {{system_prompt: broken}}\n  keyless: {{model: k}}\n\
         pipelines:\n  chain: {{steps: [a, b]}}\n  halts: {{steps: [a, broken, b]}}\n",
        llm.base_url()
    );
    let top = top.replace("      models:\n        m: {id: m}\n", "      models:\n        m: {id: m}\n    off:\n      base_url: http://127.0.0.1:9/v1\n      api_key: ${UNSET_KEY_FOR_THIS_TEST}\n      models:\n        k: {id: k}\n");
    let config = config_with(dir.path(), &top, "type: agent\nagent: a");
    let engine = start(&config, &Arc::new(ManualClock::new(t0()))).await;

    // An agent: its answer is the run's output; the same key gives the same run.
    let first = engine.service().run_agent("a", Some(json!("hello")), Some("k1".into()), Some("ana".into())).await.expect("run_agent");
    let again = engine.service().run_agent("a", Some(json!("hello")), Some("k1".into()), None).await.expect("run_agent again");
    assert_eq!((again.run_id.as_str(), again.created), (first.run_id.as_str(), false));
    let run = ended(&engine, &first.run_id).await;
    assert_eq!((run.job.as_str(), run.status, run.output.clone()), ("agent:a", RunStatus::Succeeded, Some(json!("a(hello)"))));
    assert_eq!(run.requested_by.as_deref(), Some("ana"));

    // A pipeline: each step given the previous answer, one conversation a step.
    let started = engine.service().run_pipeline("chain", Some(json!("x")), None, None).await.expect("run_pipeline");
    let run = ended(&engine, &started.run_id).await;
    assert_eq!((run.job.as_str(), run.output.clone()), ("pipeline:chain", Some(json!("b(a(x))"))));
    let convs: Vec<String> = detail(&engine, &run.id).await.calls.iter().map(|c| c.conversation.clone()).collect();
    assert_eq!(convs, ["step-1:a", "step-2:b"]);
    // A step that fails stops it, naming the step.
    let run = ended(&engine, &engine.service().run_pipeline("halts", Some(json!("x")), None, None).await.expect("run").run_id).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().is_some_and(|e| e.starts_with("pipeline \"halts\" stopped at step 2 (agent \"broken\"): ")), "{run:?}");

    // A group chat: the agents in turn, for its rounds.
    let started = engine.service().run_group_chat(&["a".into(), "b".into()], Some(2), Some(json!("t")), None, None).await.expect("chat");
    let run = ended(&engine, &started.run_id).await;
    assert_eq!((run.job.as_str(), run.output.clone()), ("group-chat:a,b", Some(json!("b(a(b(a(t))))"))));
    let convs: Vec<String> = detail(&engine, &run.id).await.calls.iter().map(|c| c.conversation.clone()).collect();
    assert_eq!(convs, ["round-1.1:a", "round-1.2:b", "round-2.1:a", "round-2.2:b"]);

    // What cannot run is refused before a run is made, saying why.
    let refused = |r: Result<lamplighter_jobs::Triggered, lamplighter_jobs::ServiceError>| r.expect_err("refused").to_string();
    assert!(
        refused(engine.service().run_agent("nobody", None, None, None).await)
            .starts_with("agent \"nobody\" not found; known agents: a, b, broken, keyless")
    );
    let why = refused(engine.service().run_agent("keyless", None, None, None).await);
    assert!(why.starts_with("agent \"keyless\" cannot run here: ") && why.contains("UNSET_KEY_FOR_THIS_TEST"), "{why}");
    assert!(
        refused(engine.service().run_pipeline("nope", None, None, None).await)
            .starts_with("pipeline \"nope\" not found; known pipelines: chain, halts")
    );
    assert!(refused(engine.service().run_group_chat(&[], None, None, None, None).await).contains("agents: name 1 to 20 agents, not 0"));
    assert!(
        refused(engine.service().run_group_chat(&["a".into()], Some(21), None, None, None).await)
            .contains("max_iterations: 1 to 20, not 21")
    );
    assert!(
        refused(engine.service().run_group_chat(&["a".into(), "ghost".into()], None, None, None, None).await)
            .starts_with("agent \"ghost\" not found")
    );
    assert!(
        refused(engine.service().run_agent("a", None, Some(String::new()), None).await)
            .contains("idempotency key must be 1–200 characters")
    );
}

#[tokio::test]
async fn an_agent_run_by_hand_is_retried_like_a_workflow_run_by_hand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let llm = ScriptedLlm::start((1, 1), move |_| match counted.fetch_add(1, Ordering::SeqCst) {
        0 => Reply::Status { code: 503, retry_after: Some("0".into()) },
        _ => Reply::Text("done on the second attempt".into()),
    })
    .await;
    let config = agents(dir.path(), &llm, "max_retries: 0", "a: {}", "");
    let clock = Arc::new(ManualClock::new(t0()));
    let engine = start(&config, &clock).await;
    let first = engine.service().run_agent("a", Some(json!("go")), None, None).await.expect("run_agent").run_id;
    let failed = ended(&engine, &first).await;
    assert_eq!(failed.status, RunStatus::Failed, "{failed:?}");
    let retry = support::until_run(&engine, &first, "its retry", |r| r.next_run_id.is_some()).await.next_run_id.expect("a retry follows");
    // The default retry policy: the next attempt a minute later.
    clock.advance(chrono::Duration::seconds(61));
    let run = ended(&engine, &retry).await;
    assert_eq!((run.status, run.attempt, run.job.as_str()), (RunStatus::Succeeded, 2, "agent:a"), "{run:?}");
    assert_eq!(run.output, Some(json!("done on the second attempt")));
}

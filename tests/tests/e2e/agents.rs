//! Agents on the real binaries against the scripted OpenAI-compatible server (real HTTP): a
//! worker killed with SIGKILL mid-conversation resumes it without repeating a returned model
//! call or a finished tool call; the seed's `content-review` workflow (its own files) with
//! approval and rejection through `lampctl`; a tool call approved through `lampctl` and the
//! transcript it prints; MCP server tools from a stdio fixture, one crashing mid-call and one
//! that never starts; `lampctl agents list`.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lamplighter_tests::llm::{Reply, ScriptedLlm, last_text, messages, system, tool_results, user_input};
use serde_json::{Value, json};

use crate::support::{Worker, repo_root};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

fn data(w: &Worker, file: &str) -> String {
    std::fs::read_to_string(w.dir.path().join("data").join(file)).unwrap_or_default()
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// A provider `scripted` at `llm` whose model alias `default` every agent resolves to.
fn ai(llm: &ScriptedLlm) -> String {
    llm.ai_section()
}

#[test]
fn a_worker_killed_mid_agent_resumes_the_conversation_without_repeating_calls() {
    let rt = runtime();
    let (in_flight, killed_during) = mpsc::channel::<()>();
    let in_flight = Mutex::new(Some(in_flight));
    let llm = rt.block_on(ScriptedLlm::start((10, 2), move |req| {
        let step = |c: &str| Reply::Tools(vec![("shell-exec__run".into(), json!({"command": format!("printf {c} >> side")}).to_string())]);
        match tool_results(req) {
            0 => step("a"),
            1 => step("b"),
            // The first time the third call comes in, the test kills the worker while it waits.
            2 => match in_flight.lock().unwrap().take() {
                Some(tx) => {
                    let _ = tx.send(());
                    Reply::Hang
                }
                None => step("c"),
            },
            _ => Reply::Text(format!("side effects done; last: {}", last_text(req))),
        }
    }));
    let top = format!("{}agents:\n  worker-bee:\n    plugins: [shell-exec]\n    allowed_commands: ['printf*']\n", ai(&llm));
    let mut w = Worker::new("");
    w.write_full(&top, "bee:\n  type: agent\n  agent: worker-bee\n  input: make three marks\n", "");
    w.start();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "bee"]);
    assert_eq!(code, 0, "{out}{err}");
    killed_during.recv_timeout(Duration::from_secs(30)).expect("the third model call to start");
    w.signal("KILL");
    w.wait_exit(Duration::from_secs(10));
    assert_eq!(data(&w, "side"), "ab", "two tool calls finished before the kill");

    w.start();
    let runs = w.wait_for("the resumed run to succeed", Duration::from_secs(30), |r| r.iter().any(|r| r.status == "succeeded"));
    assert_eq!(data(&w, "side"), "abc", "each tool's side effect happened once: {runs:#?}");
    let by_state: Vec<usize> = llm.seen().iter().map(|s| tool_results(&s.body)).collect();
    // The call cut off by the kill never returned and was made again; no call that returned was.
    assert_eq!(by_state, [0, 1, 2, 2, 3], "model calls by how many tool results they carried");

    let (code, out, _) = w.ctl(&["runs", "list", "--job", "bee", "-o", "json"]);
    assert_eq!(code, 0);
    let id = json_of(&out)["runs"][0]["id"].as_str().unwrap().to_owned();
    let (code, out, _) = w.ctl(&["runs", "show", &id, "-o", "json"]);
    assert_eq!(code, 0);
    let detail = json_of(&out);
    assert_eq!(detail["usage"]["model_calls"], 4);
    assert_eq!(detail["usage"]["tool_calls"], 3);
    assert_eq!(detail["usage"]["input_tokens"], 40);
    let attempts: Vec<u64> = detail["calls"].as_array().unwrap().iter().map(|c| c["attempt"].as_u64().unwrap()).collect();
    assert_eq!(attempts, [1, 1, 1, 1, 2, 2, 2], "the first attempt's calls are kept; the retry made the rest");
    drop(rt);
}

/// Writes a config importing the `article-review` workflow and its three agents from the
/// seed-shaped fixture's own files, with the scripted provider.
fn write_article_review(w: &Worker, llm: &ScriptedLlm) {
    let seed = repo_root().join("tests/fixtures/seed-shaped");
    let files = ["workflows/article-review.yaml", "agents/drafter.yaml", "agents/copy-editor.yaml", "agents/checker.yaml"];
    let imports: String = files.iter().map(|f| format!("    - {}\n", seed.join(f).display())).collect();
    w.write_full(&ai(llm), "", "");
    let text = std::fs::read_to_string(w.config_path()).unwrap().replacen("framework:\n", &format!("framework:\n  imports:\n{imports}"), 1);
    std::fs::write(w.config_path(), text).unwrap();
}

#[test]
fn a_seed_shaped_review_workflow_runs_and_lampctl_approves_or_rejects_it() {
    let rt = runtime();
    let llm = rt.block_on(ScriptedLlm::start((5, 5), |req| {
        let who = system(req);
        let input = user_input(req);
        if who.starts_with("You are a copy editor") {
            if input.starts_with("Apply") { Reply::Text("FINAL".into()) } else { Reply::Text(format!("copy ok: {input}")) }
        } else if who.starts_with("You are a checker") {
            Reply::Text(format!("claims ok: {input}"))
        } else {
            Reply::Text(format!("draft about {input}"))
        }
    }));
    let mut w = Worker::new("");
    write_article_review(&w, &llm);
    w.start();
    let (code, out, err) = w.ctl(&["workflows", "run", "article-review", "--input", "{\"topic\": \"tides\"}", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let run = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    w.wait_for("the run to wait for approval", Duration::from_secs(30), |r| r.iter().any(|r| r.status == "waiting_approval"));
    let (code, out, _) = w.ctl(&["runs", "show", &run, "-o", "json"]);
    assert_eq!(code, 0);
    let detail = json_of(&out);
    let step = |id: &str| -> Value {
        fn find(steps: &Value, id: &str) -> Option<Value> {
            steps.as_array()?.iter().find_map(|s| if s["id"] == id { Some(s.clone()) } else { find(&s["steps"], id) })
        }
        find(&detail["steps"], id).unwrap_or(Value::Null)
    };
    assert_eq!(step("draft")["output"], "draft about tides");
    assert_eq!(step("copy-check")["output"], "copy ok: draft about tides");
    assert_eq!(step("claim-check")["output"], "claims ok: draft about tides");
    assert_eq!(step("final-edit")["output"], "FINAL");
    let final_input = llm.seen().iter().map(|s| user_input(&s.body)).find(|i| i.starts_with("Apply")).unwrap();
    assert!(final_input.contains("Copy: copy ok: draft about tides") && final_input.contains("Claims: claims ok"), "{final_input}");

    let (code, out, err) = w.ctl(&["approvals", "approve", &run, "--by", "ana"]);
    assert_eq!(code, 0, "{out}{err}");
    w.wait_for("the run to succeed", Duration::from_secs(30), |r| r.iter().any(|r| r.status == "succeeded"));
    assert_eq!(llm.seen().len(), 4, "resuming after the approval calls no model again");

    // And rejected: the run fails naming the step.
    let (code, out, _) = w.ctl(&["workflows", "run", "article-review", "--input", "{\"topic\": \"moons\"}", "-o", "json"]);
    assert_eq!(code, 0);
    let second = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    w.wait_for("the second run to wait", Duration::from_secs(30), |r| r.iter().any(|r| r.id == second && r.status == "waiting_approval"));
    let (code, out, err) = w.ctl(&["approvals", "reject", &second, "--comment", "off topic", "--by", "ana"]);
    assert_eq!(code, 0, "{out}{err}");
    let runs = w.wait_for("the second run to fail", Duration::from_secs(30), |r| r.iter().any(|r| r.id == second && r.status == "failed"));
    let failed = runs.iter().find(|r| r.id == second).unwrap();
    assert_eq!(failed.error.as_deref(), Some("step \"approval\" was rejected by ana: off topic"));
    drop(rt);
}

#[test]
fn a_tool_call_waits_for_lampctl_and_the_transcript_shows_it() {
    let rt = runtime();
    let llm = rt.block_on(ScriptedLlm::start((7, 3), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("file-save__save".into(), r#"{"path": "report.md", "content": "all good"}"#.into())]),
        _ => Reply::Text(format!("saved: {}", last_text(req))),
    }));
    let top = format!("{}agents:\n  careful:\n    plugins: [file-save]\n    tool_approval: ask\n", ai(&llm));
    let mut w = Worker::new("");
    w.write_full(&top, "report:\n  type: agent\n  agent: careful\n", "");
    w.start();
    let (code, out, _) = w.ctl(&["agents", "list"]);
    assert_eq!(code, 0);
    let row = out.lines().find(|l| l.starts_with("careful")).unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("default (scripted-model)") && row.contains("scripted") && row.contains("file-save.save") && row.contains("yes"),
        "{out}"
    );

    let (code, _, _) = w.ctl(&["jobs", "trigger", "report"]);
    assert_eq!(code, 0);
    w.wait_for("the run to wait", Duration::from_secs(30), |r| r.iter().any(|r| r.status == "waiting_approval"));
    let (code, out, _) = w.ctl(&["approvals", "list", "-o", "json"]);
    assert_eq!(code, 0);
    let approval = &json_of(&out)["approvals"][0];
    assert_eq!(approval["step"], "agent:tool-1");
    let question = approval["question"].as_str().unwrap_or_default();
    assert!(question.contains("file-save.save") && question.contains("report.md"), "shows the tool and its arguments: {out}");
    assert_eq!(data(&w, "report.md"), "", "nothing written before the approval");
    let run = w.runs()[0].id.clone();
    let (code, out, err) = w.ctl(&["approvals", "approve", &run]);
    assert_eq!(code, 0, "{out}{err}");
    w.wait_for("the run to succeed", Duration::from_secs(30), |r| r.iter().any(|r| r.status == "succeeded"));
    assert_eq!(data(&w, "report.md"), "all good");

    let (code, out, _) = w.ctl(&["runs", "show", &run, "--transcript"]);
    assert_eq!(code, 0);
    assert!(out.contains("usage") && out.contains("2 model calls, 1 tool call, 14 tokens in / 6 out"), "{out}");
    assert!(out.contains("→ file-save.save {\"path\": \"report.md\""), "{out}");
    assert!(out.contains("tool file-save.save (call_"), "{out}");
    assert!(out.contains("agent approvals:") && out.contains("agent:tool-1"), "{out}");
    drop(rt);
}

/// The names of the tools a chat request offers.
fn offered(req: &Value) -> Vec<String> {
    req["tools"].as_array().into_iter().flatten().filter_map(|t| t["function"]["name"].as_str()).map(str::to_owned).collect()
}

#[test]
fn an_agent_gets_the_global_plugins_and_loads_a_skill_when_it_needs_it() {
    let rt = runtime();
    let llm = rt.block_on(ScriptedLlm::start((7, 3), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("load_skill".into(), r#"{"skill": "release-notes"}"#.into())]),
        1 => Reply::Tools(vec![("load_skill".into(), r#"{"skill": "release-notes", "file": "templates/notes.md"}"#.into())]),
        _ => Reply::Text(format!("notes written with: {}", last_text(req))),
    }));
    let mut w = Worker::new("");
    let skills = w.dir.path().join("skills");
    std::fs::create_dir_all(skills.join("release-notes/templates")).unwrap();
    std::fs::write(
        skills.join("release-notes/SKILL.md"),
        "---\nname: release-notes\ndescription: Write release notes from a range of commits.\n---\n\nGroup the commits by area; use templates/notes.md.\n",
    )
    .unwrap();
    std::fs::write(skills.join("release-notes/templates/notes.md"), "## Changes\n").unwrap();
    let top = format!(
        "{}skills:\n  dirs: [{}]\nplugins:\n  global: [file-read]\n  per_agent:\n    writer: [-file-read, file-glob]\n\
         agents:\n  notes:\n    system_prompt: You write release notes.\n    plugins: [file-save]\n    skills: [release-notes]\n  writer: {{}}\n",
        ai(&llm),
        skills.display()
    );
    w.write_full(&top, "notes:\n  type: agent\n  agent: notes\n", "");
    w.start();
    let (code, out, _) = w.ctl(&["agents", "list", "-o", "json"]);
    assert_eq!(code, 0);
    let agents = json_of(&out);
    let tools_of = |name: &str| agents["agents"].as_array().unwrap().iter().find(|a| a["name"] == name).unwrap()["tools"].clone();
    assert_eq!(tools_of("notes"), json!(["file-read.read", "file-save.save"]), "its own plugin and plugins.global's");
    assert_eq!(tools_of("writer"), json!(["file-glob.search"]), "plugins.per_agent adds one and removes the global one");

    let (code, out, err) = w.ctl(&["jobs", "trigger", "notes", "--wait", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let seen = llm.seen();
    assert_eq!(seen.len(), 3, "two skill loads, then the answer");
    assert_eq!(
        offered(&seen[0].body),
        ["file-save__save", "file-read__read", "load_skill"],
        "the model sees the global plugin and the skill tool"
    );
    let prompt = system(&seen[0].body);
    assert!(
        prompt.starts_with("You write release notes.") && prompt.contains("- release-notes: Write release notes from a range of commits."),
        "the system prompt lists the skill: {prompt}"
    );
    let instructions = last_text(&seen[1].body);
    assert!(
        instructions.contains("Group the commits by area")
            && instructions.contains("- templates/notes.md")
            && !instructions.contains("description:"),
        "{instructions}"
    );
    assert_eq!(last_text(&seen[2].body), "## Changes\n");

    // Loading a skill is a tool call like any other: recorded, in the transcript.
    let run = w.runs()[0].id.clone();
    let (code, out, _) = w.ctl(&["runs", "show", &run, "--transcript"]);
    assert_eq!(code, 0);
    assert!(out.contains("→ load_skill {\"skill\": \"release-notes\"}"), "{out}");
    assert_eq!(out.matches("→ load_skill {").count(), 2, "{out}");
    assert!(out.contains("\"file\": \"templates/notes.md\""), "{out}");
    assert!(out.contains("2 tool calls"), "{out}");
    drop(rt);
}

#[test]
fn lampctl_runs_an_agent_a_pipeline_and_a_group_chat_by_hand() {
    let rt = runtime();
    let llm = rt.block_on(ScriptedLlm::start((3, 2), |req| match system(req).as_str() {
        "broken" => Reply::Status { code: 400, retry_after: None },
        who => Reply::Text(format!("{who}({})", user_input(req))),
    }));
    let top = format!(
        "{}pipelines:\n  review: {{steps: [checker, editor]}}\nagents:\n  writer: {{system_prompt: writer}}\n  checker: {{system_prompt: checker}}\n  \
         editor: {{system_prompt: editor}}\n  broken: {{system_prompt: broken}}\n",
        ai(&llm)
    );
    let mut w = Worker::new("");
    w.write_full(&top, "", "");
    w.start();

    // An agent on a task, waited for: its answer, listed under agent:NAME.
    let (code, out, err) = w.ctl(&["-o", "json", "agents", "run", "writer", "--input", "tides", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    let run = &json_of(&out)["run"];
    assert_eq!(
        (run["job"].as_str(), run["status"].as_str(), run["output"].as_str()),
        (Some("agent:writer"), Some("succeeded"), Some("writer(tides)"))
    );
    // Started again with the same key: the same run.
    let key = |input: &str| w.ctl(&["-o", "json", "agents", "run", "writer", "--input", input, "--idempotency-key", "nightly-1"]);
    let (first, again) = (json_of(&key("a").1), json_of(&key("b").1));
    assert_eq!(first["run_id"], again["run_id"]);
    assert_eq!((first["created"].as_bool(), again["created"].as_bool()), (Some(true), Some(false)));

    // A pipeline and a group chat, each given the previous answer.
    let (code, out, err) = w.ctl(&["-o", "json", "agents", "pipeline", "review", "--input", "draft", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json_of(&out)["run"]["output"], "editor(checker(draft))");
    let (code, out, err) = w.ctl(&["agents", "chat", "writer,checker,editor", "--input", "AI agents", "--max-iterations", "2", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("succeeded"), "{out}");
    let chat = w.runs().into_iter().find(|r| r.job == "group-chat:writer,checker,editor").expect("the chat's run");
    let (code, out, _) = w.ctl(&["runs", "show", &chat.id, "-o", "json"]);
    assert_eq!(code, 0);
    let detail = json_of(&out);
    assert_eq!(detail["output"], "editor(checker(writer(editor(checker(writer(AI agents))))))");
    let convs: Vec<&str> = detail["calls"].as_array().unwrap().iter().filter_map(|c| c["conversation"].as_str()).collect();
    assert_eq!(
        convs,
        ["round-1.1:writer", "round-1.2:checker", "round-1.3:editor", "round-2.1:writer", "round-2.2:checker", "round-2.3:editor"]
    );
    let (code, out, _) = w.ctl(&["runs", "show", &chat.id, "--transcript"]);
    assert_eq!(code, 0);
    assert!(out.contains("round-2.3:editor"), "the transcript names each turn: {out}");

    // A failing agent ends the wait with the failed code; unknown names are refused up front.
    let (code, _, err) = w.ctl(&["agents", "run", "broken", "--wait"]);
    assert_eq!(code, 4, "{err}");
    let (code, _, err) = w.ctl(&["agents", "chat", "writer,ghost"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("agent \"ghost\" not found; known agents: broken, checker, editor, writer"), "{err}");
    let (code, _, err) = w.ctl(&["agents", "chat", "writer", "--max-iterations", "50"]);
    assert_eq!(code, 2, "a usage error: {err}");
    drop(rt);
}

#[test]
fn a_wasm_plugin_calls_a_model_and_an_mcp_tool_as_the_runs_own_calls() {
    let rt = runtime();
    let llm = rt.block_on(ScriptedLlm::start((3, 2), |req| Reply::Text(format!("model says: {}", user_input(req)))));
    let mut w = Worker::new("");
    // The fixture plugin (plugins/tests/fixtures/wasm/outbound) passes its parameters to
    // ai_complete or mcp_call and returns the answer, or {"code": N}.
    let plugin = w.dir.path().join("plugins/outbound");
    std::fs::create_dir_all(&plugin).unwrap();
    for f in ["manifest.json", "plugin.wat"] {
        std::fs::copy(repo_root().join("plugins/tests/fixtures/wasm/outbound").join(f), plugin.join(f)).unwrap();
    }
    let fixture = env!("CARGO_BIN_EXE_mcp-fixture");
    let ai_section = ai(&llm).replace(
        "  providers:\n",
        "  providers:\n    keyless:\n      base_url: http://127.0.0.1:9/v1\n      api_key: ${UNSET_KEY_FOR_THIS_TEST}\n      models:\n        k: {id: k}\n",
    );
    let top = format!(
        "{ai_section}mcp:\n  servers:\n    fx: {{command: {fixture}}}\nplugins:\n  dirs: [{}]\n  wasm:\n    timeout: 30s\n    capabilities: [ai, mcp]\n    \
         ai: {{models: [k]}}\n    mcp: {{tools: [fx.echo]}}\nworkflows:\n  twice:\n    steps:\n      \
         - {{id: first, type: plugin, plugin: outbound, action: ai, parameters: {{prompt: one}}}}\n      \
         - {{id: second, type: plugin, plugin: outbound, action: ai, parameters: {{prompt: two}}}}\n",
        w.dir.path().join("plugins").display()
    );
    let jobs = "keyless:\n  type: plugin\n  plugin: outbound\n  action: ai\n  parameters: {model: k, prompt: x}\n\
                ask:\n  type: plugin\n  plugin: outbound\n  action: ai\n  parameters: {prompt: summarize, system: be brief}\n\
                tool:\n  type: plugin\n  plugin: outbound\n  action: mcp\n  parameters: {server: fx, tool: echo, arguments: {text: hi}}\n\
                other-tool:\n  type: plugin\n  plugin: outbound\n  action: mcp\n  parameters: {server: fx, tool: note, arguments: {text: x}}\n\
                tight:\n  type: workflow\n  workflow: twice\n  budget: {max_tokens_total: 1}\n";
    w.write_full(&top, jobs, "");
    w.start();

    let waited = |job: &str| {
        let (code, out, err) = w.ctl(&["-o", "json", "jobs", "trigger", job, "--wait"]);
        assert_eq!(code, 0, "{job}: {out}{err}\n{}", w.log());
        json_of(&out)["run"].clone()
    };
    // A completion through the run's provider, counted as the run's own model call.
    let run = waited("ask");
    assert_eq!(
        (run["output"]["content"].as_str(), run["output"]["input_tokens"].as_u64()),
        (Some("model says: summarize"), Some(3)),
        "{run}"
    );
    assert_eq!(system(&llm.seen()[0].body), "be brief");
    let (code, out, _) = w.ctl(&["runs", "show", run["id"].as_str().unwrap(), "-o", "json"]);
    assert_eq!(code, 0);
    let detail = json_of(&out);
    assert_eq!((detail["usage"]["model_calls"].as_u64(), detail["usage"]["input_tokens"].as_u64()), (Some(1), Some(3)), "{detail}");
    assert!(detail["calls"][0]["conversation"].as_str().is_some_and(|c| c.starts_with("plugin:outbound/")), "{detail}");
    // A model whose provider is disabled (its key unset) is refused, not called without a key.
    assert_eq!(waited("keyless")["output"], json!({"code": -2}));
    // An MCP tool the operator allows; one it does not is refused (-2) and never called.
    assert_eq!(waited("tool")["output"], json!({"text": "echo: hi", "is_error": false}));
    assert_eq!(waited("other-tool")["output"], json!({"code": -2}));
    // The job's budget counts its plugins' completions: the second one is refused.
    let run = waited("tight");
    let (code, out, _) = w.ctl(&["runs", "show", run["id"].as_str().unwrap(), "-o", "json"]);
    assert_eq!(code, 0);
    let steps = json_of(&out)["steps"].clone();
    assert_eq!(steps[0]["output"]["content"], "model says: one", "{steps}");
    assert_eq!(steps[1]["output"], json!({"code": -2}), "{steps}");
    assert_eq!(llm.seen().len(), 2, "the refused completion reached no model");
    // Each call out of the sandbox is counted like a tool call.
    let (_, page) = crate::support::http_get(w.port, "/metrics").expect("metrics");
    for line in [
        "lamplighter_plugin_host_calls_total{function=\"ai_complete\",outcome=\"succeeded\",plugin=\"outbound\"} 2",
        "lamplighter_plugin_host_calls_total{function=\"mcp_call\",outcome=\"succeeded\",plugin=\"outbound\"} 1",
        // The refused ones: the disabled provider's, and the one over the budget.
        "lamplighter_plugin_host_calls_total{function=\"ai_complete\",outcome=\"failed\",plugin=\"outbound\"} 2",
    ] {
        assert!(page.contains(line), "{line} not in:\n{page}");
    }
    drop(rt);
}

#[test]
fn mcp_server_tools_work_a_crash_mid_call_is_told_to_the_model_and_a_server_that_never_starts_fails_only_its_runs() {
    let rt = runtime();
    let calls = Arc::new(Mutex::new(0usize));
    let llm = rt.block_on(ScriptedLlm::start((1, 1), move |req| {
        let input = user_input(req);
        let results: Vec<String> =
            messages(req).iter().filter(|m| m["role"] == "tool").map(|m| m["content"].as_str().unwrap_or_default().to_owned()).collect();
        *calls.lock().unwrap() += 1;
        match (input.as_str(), results.len()) {
            ("first", 0) => Reply::Tools(vec![
                ("fx__echo".into(), r#"{"text": "hi"}"#.into()),
                ("fx__note".into(), r#"{"text": "once"}"#.into()),
                ("fx__fail".into(), "{}".into()),
            ]),
            ("first", 3) => Reply::Tools(vec![("fx__crash".into(), "{}".into())]),
            ("again", 0) => Reply::Tools(vec![("fx__echo".into(), r#"{"text": "back"}"#.into())]),
            ("never", 0) => Reply::Text("unreachable".into()),
            _ => Reply::Text(results.join("\n---\n")),
        }
    }));
    let fixture = env!("CARGO_BIN_EXE_mcp-fixture");
    let mut w = Worker::new("");
    let notes = w.dir.path().join("notes.txt");
    let top = format!(
        "{}mcp:\n  servers:\n    fx:\n      command: {fixture}\n      env: {{FIXTURE_NOTES: {}}}\n    broken:\n      command: {fixture}\n      args: [--refuse]\nagents:\n  user:\n    mcp_servers: [fx]\n  doomed:\n    mcp_servers: [broken]\n",
        ai(&llm),
        notes.display()
    );
    // `fail` is not retried: `--wait` would follow its retries to the last one.
    w.write_full(&top, "use:\n  type: agent\n  agent: user\nfail:\n  type: agent\n  agent: doomed\n  retries: {max: 0}\n", "");
    w.start();

    let (code, out, err) = w.ctl(&["jobs", "trigger", "use", "--input", "first", "--wait", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let answer = json_of(&out)["run"]["output"].as_str().unwrap_or_default().to_owned();
    let parts: Vec<&str> = answer.split("\n---\n").collect();
    assert_eq!(parts.len(), 4, "{out}\n{}", w.log());
    assert_eq!(parts[..3], ["echo: hi", "noted", "error: the fixture failed on purpose"], "{answer}");
    assert!(parts[3].contains("MCP server \"fx\" stopped during crash") && parts[3].contains("fixture: crashing on purpose"), "{answer}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "once\n");

    // The crashed server is started again on its next use.
    let (code, out, err) = w.ctl(&["jobs", "trigger", "use", "--input", "again", "--wait", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(json_of(&out)["run"]["output"], "echo: back");

    // A server that never starts fails the run that needs it, with what it printed; the worker goes on.
    let (code, out, err) = w.ctl(&["jobs", "trigger", "fail", "--input", "never", "--wait", "-o", "json"]);
    assert_ne!(code, 0, "{out}{err}");
    let runs = w.runs();
    let failed = runs.iter().find(|r| r.job == "fail").unwrap();
    let error = failed.error.clone().unwrap_or_default();
    assert!(error.contains("MCP server \"broken\" did not start") && error.contains("refusing to start: FIXTURE_KEY is wrong"), "{error}");
    let (code, _, _) = w.ctl(&["status"]);
    assert_eq!(code, 0, "the worker is still up");

    // The server runs in a process group of its own, the worker's child; a stop takes it down.
    let marker = format!("FIXTURE_NOTES={}", notes.display());
    let servers = processes_with_env(&marker);
    assert_eq!(servers.len(), 1, "one live \"fx\" server while the worker runs: {servers:?}");
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0), "{}", w.log());
    // The worker killed it (SIGKILL, on dropping it) before it exited: at most a zombie is left.
    assert_eq!(processes_with_env(&marker), Vec::<u32>::new(), "the MCP server outlived the worker");
    drop(rt);
}

/// The live processes (not zombies) whose environment holds `entry` (`NAME=value`).
fn processes_with_env(entry: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("read /proc") {
        let Some(pid) = e.expect("entry").file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // A process that ended between the listing and the read is not there.
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let zombie = stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && env.split(|b| *b == 0).any(|v| v == entry.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn an_agent_uses_a_streamable_http_mcp_server_limited_by_allowed_actions() {
    // The MCP server is the worker's own control surface, over streamable HTTP.
    let rt = runtime();
    let llm = rt.block_on(ScriptedLlm::start((1, 1), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("self__list_jobs".into(), "{}".into())]),
        _ => Reply::Text(last_text(req)),
    }));
    let mut w = Worker::new("");
    let top = format!(
        "{}mcp:\n  servers:\n    self:\n      url: {}\n      headers: {{X-Trace: e2e}}\nagents:\n  operator:\n    mcp_servers: [self]\n    allowed_actions: [self.list_jobs]\n",
        ai(&llm),
        w.url()
    );
    w.write_full(&top, "look:\n  type: agent\n  agent: operator\n  input: which jobs are there?\n", "");
    w.start();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "look", "--wait", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let answer = json_of(&out)["run"]["output"].as_str().unwrap_or_default().to_owned();
    assert!(answer.contains("\"look\""), "the tool's result reached the model: {answer}");
    let offered: Vec<String> =
        llm.seen()[0].body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(offered, ["self__list_jobs"], "only what allowed_actions lets through of the server's tools");
    drop(rt);
}

/// A workflow whose agent cannot run here (its provider's key is unset) is refused when asked
/// to run, naming why, as `agents run` refuses the agent itself; nothing is started.
#[test]
fn a_workflow_whose_agent_is_disabled_is_refused_up_front() {
    let mut w = Worker::new("");
    let top = "ai:\n  providers:\n    keyless:\n      base_url: http://127.0.0.1:9/v1\n      api_key: ${UNSET_KEY_FOR_THIS_TEST}\n      models:\n        k: {id: k}\n\
               agents:\n  lost:\n    model: k\n    system_prompt: Say hi.\n\
               workflows:\n  needs-lost:\n    steps:\n      - {id: a, type: agent, agent: lost, input: hi}\n";
    w.write_full(top, "", "");
    w.start();
    let (code, _, err) = w.ctl(&["agents", "run", "lost"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("agent \"lost\" cannot run here"), "{err}");
    let (code, _, err) = w.ctl(&["workflows", "run", "needs-lost", "--wait"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("workflow \"needs-lost\" cannot run here: ") && err.contains("UNSET_KEY_FOR_THIS_TEST"), "{err}");
    assert!(w.runs().is_empty(), "nothing was started: {:?}", w.runs());
}

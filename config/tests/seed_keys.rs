//! Every key of the seed's "Full Configuration Reference" (gantri-architecture.md, copied to
//! `tests/fixtures/seed-full-reference.yaml`; the `seed` test target checks the copy against
//! the document) has a fate here: it works as the seed describes, or a warning says what it
//! would have done and what to write instead. No key is accepted and silently dropped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lamplighter_config::{Config, Exporter, LoadOptions, ProviderApi, StepKind, Target, Templated, load_with_env};

/// What becomes of one key.
enum Fate {
    /// It works: the compiled config holds what the reference wrote.
    Works(fn(&Config) -> bool),
    /// It is accepted with a warning holding this text (what it would do, what to use).
    Warned(&'static str),
}
use Fate::{Warned, Works};

fn reference() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/seed-full-reference.yaml")
}

/// The paths of the leaves of a YAML value: `a.b`, list items of maps as `a[].b`.
fn leaves(v: &serde_yaml::Value, path: String, out: &mut Vec<String>) {
    let join = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    match v {
        serde_yaml::Value::Mapping(m) if !m.is_empty() => {
            for (k, v) in m {
                leaves(v, join(k.as_str().expect("string keys")), out);
            }
        }
        serde_yaml::Value::Sequence(s) if s.iter().any(|i| i.is_mapping()) => {
            for i in s {
                leaves(i, format!("{path}[]"), out);
            }
        }
        _ => {
            if !out.contains(&path) {
                out.push(path);
            }
        }
    }
}

fn agent(c: &Config) -> &lamplighter_config::Agent {
    &c.agents["my-agent"]
}

fn model(c: &Config) -> &lamplighter_config::Model {
    &c.providers["azure-openai"].models["gpt-5-mini"]
}

fn steps(c: &Config) -> &[lamplighter_config::Step] {
    &c.workflows["review-and-triage"].steps
}

fn text(t: &Option<Templated>) -> String {
    match t {
        Some(Templated::Text(t)) => t.as_str().to_string(),
        other => format!("{other:?}"),
    }
}

/// Each key of the reference and its fate.
fn fates() -> Vec<(&'static str, Fate)> {
    vec![
        ("framework.name", Works(|c| c.name == "Gantri")),
        ("framework.version", Works(|c| c.version.as_deref() == Some("0.1.0"))),
        ("framework.log_level", Works(|c| c.log_level.as_deref() == Some("info"))),
        ("framework.data_dir", Works(|c| c.data_dir.ends_with("data"))),
        ("framework.imports", Works(|c| c.agents.len() == 3)),
        ("ai.default_model", Works(|c| c.default_model.as_deref() == Some("gpt-5-mini"))),
        (
            "ai.providers.azure-openai.endpoint",
            Works(
                |c| matches!(&c.providers["azure-openai"].api, ProviderApi::AzureOpenAi { endpoint, .. } if endpoint == "https://your-resource.openai.azure.com/"),
            ),
        ),
        ("ai.providers.azure-openai.api_key", Works(|c| c.providers["azure-openai"].api_key.is_some())),
        ("ai.providers.azure-openai.models.gpt-5-mini.id", Works(|c| model(c).id == "gpt-5-mini")),
        (
            "ai.providers.azure-openai.models.gpt-5-mini.description",
            Works(|c| model(c).description.as_deref() == Some("Azure OpenAI GPT-5 Mini")),
        ),
        ("ai.providers.azure-openai.models.gpt-5-mini.max_tokens", Works(|c| model(c).max_tokens == Some(8192))),
        ("ai.providers.azure-openai.models.gpt-5-mini.default_temperature", Works(|c| model(c).default_temperature == Some(0.3))),
        (
            "ai.rate_limits.azure-openai.requests_per_minute",
            Works(|c| c.providers["azure-openai"].rate_limit.requests_per_minute == Some(60)),
        ),
        (
            "ai.rate_limits.azure-openai.tokens_per_minute",
            Works(|c| c.providers["azure-openai"].rate_limit.tokens_per_minute == Some(100000)),
        ),
        // The key names an agent; the seed repeats it as `name:` (the same here).
        ("agents.my-agent.name", Works(|c| agent(c).name == "my-agent")),
        ("agents.my-agent.model", Works(|c| agent(c).resolved.as_ref().is_some_and(|r| r.model.id == "gpt-5-mini"))),
        ("agents.my-agent.provider", Works(|c| agent(c).resolved.as_ref().is_some_and(|r| r.provider == "azure-openai"))),
        ("agents.my-agent.temperature", Works(|c| agent(c).temperature == Some(0.3))),
        ("agents.my-agent.max_tokens", Works(|c| agent(c).max_tokens == Some(4096))),
        ("agents.my-agent.system_prompt", Works(|c| format!("{:?}", agent(c).system_prompt).contains("You are a helpful assistant."))),
        ("agents.my-agent.skills", Works(|c| agent(c).skills.is_empty())),
        ("agents.my-agent.plugins", Works(|c| agent(c).plugins.is_empty())),
        ("agents.my-agent.mcp_servers", Works(|c| agent(c).mcp_servers.is_empty())),
        ("agents.my-agent.allowed_actions", Works(|c| agent(c).allowed_actions.is_empty())),
        ("agents.my-agent.allowed_commands", Works(|c| agent(c).allowed_commands.is_empty())),
        ("agents.my-agent.working_directory", Works(|c| agent(c).working_directory.as_ref().is_some_and(|w| w.ends_with("data/news")))),
        ("workflows.review-and-triage.name", Works(|c| c.workflows["review-and-triage"].name == "review-and-triage")),
        (
            "workflows.review-and-triage.description",
            Works(|c| c.workflows["review-and-triage"].description.as_deref() == Some("Review code and triage issues")),
        ),
        (
            "workflows.review-and-triage.steps[].id",
            Works(|c| steps(c).iter().map(|s| s.id.as_str()).eq(["review", "triage", "check-severity", "parallel-notify"])),
        ),
        ("workflows.review-and-triage.steps[].type", Works(|c| matches!(steps(c)[3].kind, StepKind::Parallel { .. }))),
        (
            "workflows.review-and-triage.steps[].agent",
            Works(|c| matches!(&steps(c)[0].kind, StepKind::Agent { agent, .. } if agent == "code-reviewer")),
        ),
        (
            "workflows.review-and-triage.steps[].input",
            Works(
                |c| matches!(&steps(c)[1].kind, StepKind::Agent { input, .. } if text(input) == "Triage based on: ${steps.review.output}"),
            ),
        ),
        (
            "workflows.review-and-triage.steps[].condition",
            Works(|c| matches!(&steps(c)[2].kind, StepKind::Condition { condition, .. } if condition.as_str() == "${steps.triage.output}")),
        ),
        (
            "workflows.review-and-triage.steps[].steps[].id",
            Works(|c| parallel(c).iter().map(|s| s.id.as_str()).eq(["notify-slack", "notify-email"])),
        ),
        (
            "workflows.review-and-triage.steps[].steps[].type",
            Works(|c| parallel(c).iter().all(|s| matches!(s.kind, StepKind::Plugin { .. }))),
        ),
        (
            "workflows.review-and-triage.steps[].steps[].plugin",
            Works(|c| matches!(&parallel(c)[0].kind, StepKind::Plugin { plugin, .. } if plugin == "notifications")),
        ),
        (
            "workflows.review-and-triage.steps[].steps[].action",
            Works(|c| matches!(&parallel(c)[1].kind, StepKind::Plugin { action, .. } if action == "send-email")),
        ),
        (
            "workflows.review-and-triage.steps[].steps[].input",
            Works(|c| matches!(&parallel(c)[0].kind, StepKind::Plugin { input, .. } if text(input) == "${steps.triage.output}")),
        ),
        (
            "scheduling.jobs.nightly-review.type",
            Works(|c| matches!(&c.jobs["nightly-review"].target, Target::Workflow(w) if w == "review-and-triage")),
        ),
        ("scheduling.jobs.nightly-review.workflow", Works(|c| c.jobs["nightly-review"].target.kind() == "workflow")),
        (
            "scheduling.jobs.nightly-review.cron",
            Works(|c| c.jobs["nightly-review"].schedule.as_ref().is_some_and(|s| format!("{:?}", s.spec()).contains("0 2 * * *"))),
        ),
        ("scheduling.jobs.nightly-review.enabled", Works(|c| c.jobs["nightly-review"].enabled)),
        (
            "scheduling.jobs.nightly-review.input",
            Works(|c| c.jobs["nightly-review"].input.as_deref() == Some(&serde_json::json!("Nightly code review"))),
        ),
        ("scheduling.jobs.hourly-triage.type", Works(|c| c.jobs["hourly-triage"].target.kind() == "agent")),
        (
            "scheduling.jobs.hourly-triage.agent",
            Works(|c| matches!(&c.jobs["hourly-triage"].target, Target::Agent(a) if a == "ticket-triager")),
        ),
        (
            "scheduling.jobs.hourly-triage.cron",
            Works(|c| c.jobs["hourly-triage"].schedule.as_ref().is_some_and(|s| format!("{:?}", s.spec()).contains("0 * * * *"))),
        ),
        ("scheduling.jobs.hourly-triage.enabled", Works(|c| !c.jobs["hourly-triage"].enabled)),
        (
            "plugins.dirs",
            Works(|c| c.plugin_dirs.iter().map(|d| d.ends_with("plugins/built-in") || d.ends_with("plugins/custom")).eq([true, true])),
        ),
        // Empty in the reference: nothing to warn about. Set, it warns (`native_plugins_are_said_to_be_refused`).
        ("plugins.native_trust_dirs", Works(|_| true)),
        // Empty in the reference; `plugins_global_and_per_agent_shape_every_agents_plugins` sets them.
        ("plugins.global", Works(|c| c.agents.values().all(|a| a.plugins.is_empty()))),
        ("plugins.per_agent", Works(|c| c.agents.values().all(|a| a.plugins.is_empty()))),
        ("hooks.bindings[].event", Works(|c| c.hooks[0].event.to_string() == "agent:*:model-call:before")),
        ("hooks.bindings[].plugin", Works(|c| c.hooks[0].plugin == "my-logging-plugin")),
        ("hooks.bindings[].hook", Works(|c| c.hooks[0].hook == "log-model-call")),
        ("hooks.bindings[].priority", Works(|c| c.hooks[0].priority == 100)),
        ("telemetry.enabled", Works(|c| c.telemetry.enabled)),
        ("telemetry.service_name", Works(|c| c.telemetry.service_name.as_deref() == Some("gantri"))),
        ("telemetry.service_version", Works(|c| c.telemetry.service_version.as_deref() == Some("1.0.0"))),
        ("telemetry.resource_attributes", Works(|c| c.telemetry.resource_attributes.is_empty())),
        ("telemetry.traces.exporter", Works(|c| c.telemetry.traces.exporter == Some(Exporter::Console))),
        ("telemetry.traces.sampling.strategy", Works(|c| c.telemetry.sample_ratio == Some(1.0))),
        ("telemetry.traces.sampling.ratio", Works(|c| c.telemetry.sample_ratio == Some(1.0))),
        (
            "telemetry.metrics.exporter",
            Warned("telemetry.metrics.exporter \"console\" would print metrics on the console, which is not built in"),
        ),
        ("telemetry.metrics.export_interval_ms", Works(|c| c.telemetry.metrics_interval == Some(Duration::from_secs(30)))),
        ("telemetry.logs.exporter", Works(|c| c.telemetry.logs.exporter == Some(Exporter::Console))),
        ("telemetry.logs.min_level", Works(|c| c.telemetry.logs_min_level.as_deref() == Some("info"))),
    ]
}

fn parallel(c: &Config) -> &[lamplighter_config::Step] {
    match &steps(c)[3].kind {
        StepKind::Parallel { steps } => steps,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_key_of_the_seeds_full_reference_has_its_fate() {
    let text = std::fs::read_to_string(reference()).unwrap();
    let mut paths = Vec::new();
    leaves(&serde_yaml::from_str(&text).unwrap(), String::new(), &mut paths);
    let fates = fates();
    let named: Vec<&str> = fates.iter().map(|(p, _)| *p).collect();
    for p in &paths {
        assert!(named.contains(&p.as_str()), "the reference's key {p} has no fate here");
    }
    for p in &named {
        assert!(paths.iter().any(|q| q == p), "{p} is not a key of the reference");
    }

    // The reference's workflow and job name two agents it does not define; defined here, as a
    // user of the reference would, so that the rest loads.
    let text = text.replacen("agents:\n", "agents:\n  code-reviewer: {model: gpt-5-mini}\n  ticket-triager: {model: gpt-5-mini}\n", 1);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("gantri.yaml"), text).unwrap();
    let opts = LoadOptions { path: Some(tmp.path().join("gantri.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let env = |k: &str| (k == "AZURE_OPENAI_API_KEY").then(|| "k".to_string());
    let loaded = load_with_env(&opts, env).unwrap_or_else(|e| panic!("the seed's reference does not load: {e}"));
    let warnings: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    let mut expected_warnings = 0;
    for (path, fate) in &fates {
        match fate {
            Works(check) => assert!(check(&loaded.config), "{path} does not work as the reference wrote it"),
            Warned(text) => {
                expected_warnings += 1;
                assert!(warnings.iter().any(|w| w.contains(text)), "{path}: no warning saying {text:?} in {warnings:#?}");
            }
        }
    }
    assert_eq!(warnings.len(), expected_warnings, "a warning no key's fate accounts for: {warnings:#?}");
}

/// The config and its warnings, or the errors; each diagnostic as printed, the file's folder left out.
fn load(yaml: &str) -> Result<(Config, Vec<String>), Vec<String>> {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("lamplighter.yaml"), yaml).unwrap();
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let shown = |d: &lamplighter_config::Diagnostic| d.to_string().replace(&format!("{}/", tmp.path().display()), "");
    match load_with_env(&opts, |_| None) {
        Ok(l) => Ok((l.config, l.warnings.iter().map(shown).collect())),
        Err(e) => Err(e.0.iter().map(shown).collect()),
    }
}

const TWO_AGENTS: &str = "ai:\n  providers:\n    local: {base_url: \"http://127.0.0.1:9/v1\", models: {m: {id: m}}}\n  default_model: m\n\
     agents:\n  writer: {plugins: [file-save]}\n  reader: {}\n";

#[test]
fn plugins_global_and_per_agent_shape_every_agents_plugins() {
    let yaml = format!(
        "{TWO_AGENTS}plugins:\n  global: [file-read, web-fetch]\n  per_agent:\n    writer: [shell-exec, -web-fetch]\n    reader: [-web-fetch, -git-operations]\n"
    );
    let (c, warnings) = load(&yaml).unwrap_or_else(|e| panic!("{e:#?}"));
    assert_eq!(c.agents["writer"].plugins, ["file-save", "shell-exec", "file-read"], "own, added, global, less the removed");
    assert_eq!(c.agents["reader"].plugins, ["file-read"]);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].starts_with("lamplighter.yaml:12:26: warning: ")
            && warnings[0].contains("plugins.per_agent.reader removes plugin \"git-operations\", which the agent does not have"),
        "{warnings:#?}"
    );

    let errors = load(&format!("{TWO_AGENTS}plugins:\n  per_agent:\n    wrtier: [shell-exec]\n    reader: [\"-\"]\n")).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("lamplighter.yaml:10:5: error: plugins.per_agent names agent \"wrtier\", which is not defined")
                && e.contains("did you mean \"writer\"")),
        "{errors:#?}"
    );
    assert!(errors.iter().any(|e| e.contains("plugins.per_agent.reader has an empty plugin name")), "{errors:#?}");
    assert_eq!(errors.len(), 2, "{errors:#?}");
}

#[test]
fn native_plugins_are_said_to_be_refused() {
    let (_, w) = load("plugins:\n  native_trust_dirs: [./plugins/trusted]\n").unwrap_or_else(|e| panic!("{e:#?}"));
    assert!(
        w.len() == 1
            && w[0].contains("plugins.native_trust_dirs would load native (.NET) plugins")
            && w[0].contains("build the plugin for WASM"),
        "{w:#?}"
    );
}

#[test]
fn telemetry_keys_in_the_wrong_signal_and_log_levels_are_said() {
    let (c, w) = load(
        "framework: {log_level: Warning}\ntelemetry:\n  traces: {exporter: otlp, export_interval_ms: 500, min_level: Debug}\n  \
         metrics: {exporter: otlp, sampling: {strategy: always_on}}\n  logs: {exporter: otlp, min_level: Information}\n",
    )
    .unwrap_or_else(|e| panic!("{e:#?}"));
    for want in [
        "lamplighter.yaml:3:28: warning: telemetry.traces.export_interval_ms has no effect; it belongs under telemetry.metrics",
        "lamplighter.yaml:3:53: warning: telemetry.traces.min_level has no effect; it belongs under telemetry.logs",
        "lamplighter.yaml:4:29: warning: telemetry.metrics.sampling has no effect; it belongs under telemetry.traces",
        "lamplighter.yaml:5:26: warning: telemetry.logs.min_level \"info\" is below the log level \"warn\" (framework.log_level)",
    ] {
        assert!(w.iter().any(|x| x.starts_with(want)), "missing {want} in {w:#?}");
    }
    assert_eq!(w.len(), 4, "{w:#?}");
    assert_eq!(c.telemetry.logs_min_level.as_deref(), Some("info"));
    assert_eq!(c.log_level.as_deref(), Some("warn"));

    // With the console exporter (the log output itself), the seed's min_level is the output's.
    let (c, _) = load("telemetry:\n  logs: {exporter: console, min_level: Debug}\n").unwrap_or_else(|e| panic!("{e:#?}"));
    assert_eq!(c.log_level.as_deref(), Some("debug"));
    let errors = load("telemetry:\n  logs: {min_level: Loud}\n").unwrap_err();
    assert!(errors.iter().any(|e| e.starts_with("lamplighter.yaml:2:10: error: log level \"Loud\" is not one of")), "{errors:#?}");
}

#[test]
fn a_name_that_differs_from_its_key_is_said() {
    let (_, w) = load(&format!("{TWO_AGENTS}  other: {{name: another}}\n")).unwrap_or_else(|e| panic!("{e:#?}"));
    assert!(w.len() == 1 && w[0].contains("agents.other has name: \"another\"; the key is its name"), "{w:#?}");
}

#[test]
fn job_names_cannot_take_the_names_runs_without_a_job_are_listed_under() {
    let jobs: String = ["workflow:w", "agent:a", "pipeline:p", "group-chat:a,b", "plugin:x"]
        .iter()
        .map(|n| format!("    \"{n}\": {{type: plugin, plugin: file-save, action: save, cron: \"0 * * * *\"}}\n"))
        .collect();
    let errors = load(&format!("scheduling:\n  jobs:\n{jobs}")).unwrap_err();
    for (line, name, whose) in [
        (3, "workflow:w", "runs of workflows started by hand"),
        (4, "agent:a", "runs of agents started by hand or by notifications"),
        (5, "pipeline:p", "runs of pipelines started by hand"),
        (6, "group-chat:a,b", "group chats started by hand"),
        (7, "plugin:x", "runs of plugin actions started by notifications"),
    ] {
        let prefix = name.split_inclusive(':').next().unwrap_or_default();
        let want = format!(
            "lamplighter.yaml:{line}:5: error: job \"{name}\": job names cannot start with \"{prefix}\" ({whose} are listed under it)"
        );
        assert!(errors.iter().any(|e| e.starts_with(&want)), "missing {want} in {errors:#?}");
    }
}

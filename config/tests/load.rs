//! Loading real config trees: the seed's reference directory, and broken fixtures whose whole
//! error list is checked at once.

use std::path::{Path, PathBuf};

use lamplighter_config::{Disabled, KeepMerged, LoadOptions, ModelApi, StepKind, SystemPrompt, Templated, Var, load_with_env};

/// A config directory in the seed's shape, of the project's own making (the seed's own is
/// checked by `cargo test -p lamplighter-tests --test seed`).
fn seed_shaped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/seed-shaped/gantri.yaml")
}

fn write(dir: &Path, name: &str, text: &str) {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn errors_of(dir: &Path) -> Vec<String> {
    let opts = LoadOptions { path: Some(dir.join("lamplighter.yaml")), cwd: Some(dir.to_path_buf()), ..Default::default() };
    match load_with_env(&opts, |_| None) {
        Ok(l) => panic!("expected errors, got a config with warnings {:?}", l.warnings),
        Err(e) => e.0.iter().map(|d| d.to_string().replace(&format!("{}/", dir.display()), "")).collect(),
    }
}

/// A worker's load frees each job's YAML as it reads it: the same jobs, the same errors, and
/// a merged YAML without the jobs (everything else, which the checks after loading still read,
/// stays).
#[test]
fn a_load_without_the_jobs_yaml_reads_the_same_config() {
    let tmp = tempfile::tempdir().unwrap();
    let load = |merged| {
        let opts = LoadOptions { path: Some(seed_shaped()), cwd: Some(tmp.path().to_path_buf()), merged };
        load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}"))
    };
    let (whole, lean) = (load(KeepMerged::Whole), load(KeepMerged::WithoutJobs));
    assert!(!whole.config.jobs.is_empty());
    assert_eq!(whole.config.jobs, lean.config.jobs);
    assert_eq!(whole.warnings.len(), lean.warnings.len());
    let jobs_yaml = |c: &lamplighter_config::Config| c.merged.get("scheduling").and_then(|s| s.get("jobs")).cloned();
    assert!(jobs_yaml(&whole.config).is_some_and(|j| j.as_mapping().is_some_and(|m| m.len() == whole.config.jobs.len())));
    assert!(jobs_yaml(&lean.config).is_some_and(|j| j.as_mapping().is_some_and(|m| m.is_empty())), "the jobs' YAML is consumed");
    assert_eq!(whole.config.merged.get("agents"), lean.config.merged.get("agents"));
    assert!(lamplighter_config::show(&whole.config).contains("morning-digest-7am"));

    // A job that does not read reports the same error either way.
    std::fs::write(tmp.path().join("lamplighter.yaml"), "scheduling:\n  jobs:\n    bad:\n      cron: [1]\n      type: plugin\n").unwrap();
    let errors = |merged| {
        let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), merged };
        load_with_env(&opts, |_| None).expect_err("a bad job").0.iter().map(ToString::to_string).collect::<Vec<_>>()
    };
    let whole_errors = errors(KeepMerged::Whole);
    assert!(whole_errors.iter().any(|e| e.contains("lamplighter.yaml:4:") && e.contains("cron")), "{whole_errors:?}");
    assert_eq!(whole_errors, errors(KeepMerged::WithoutJobs));
}

/// Where each job is defined, for many jobs at once (what a worker keeps after dropping the
/// source map): the right file, line and column, across an import, and nothing for a name that
/// is no job of the files.
#[test]
fn each_job_is_located_in_its_own_file() {
    let tmp = tempfile::tempdir().unwrap();
    let job =
        "\n      every: 1h\n      type: plugin\n      plugin: file-save\n      action: save\n      parameters: {path: a, content: b}\n";
    write(
        tmp.path(),
        "lamplighter.yaml",
        &format!("framework:\n  imports: [more.yaml]\nscheduling:\n  jobs:\n    first:{job}    second:{job}"),
    );
    write(tmp.path(), "more.yaml", &format!("# imported\nscheduling:\n  jobs:\n    third:{job}"));
    let opts = LoadOptions {
        path: Some(tmp.path().join("lamplighter.yaml")),
        cwd: Some(tmp.path().to_path_buf()),
        merged: KeepMerged::WithoutJobs,
    };
    let config = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
    let locations = config.sources.item_locations(&["scheduling", "jobs"], config.jobs.keys());
    let at = |name: &str| locations.get(name).flatten().map(|l| l.to_string().replace(&format!("{}/", tmp.path().display()), ""));
    assert_eq!(at("first").as_deref(), Some("lamplighter.yaml:5:5"));
    assert_eq!(at("second").as_deref(), Some("lamplighter.yaml:11:5"));
    assert_eq!(at("third").as_deref(), Some("more.yaml:4:5"));
    assert!(locations.contains("third") && !locations.contains("fourth"));
    assert_eq!(locations.get("fourth"), None);
}

/// Jobs are read (their keys checked, then their values) on a thread of their own while the
/// ones read are compiled: with many jobs, every bad one is still reported, the good ones are
/// all there, either way of loading.
#[test]
fn many_jobs_load_whole_and_every_bad_one_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let mut text = String::from("scheduling:\n  jobs:\n");
    for i in 0..3000 {
        let cron = if i % 1000 == 999 { "[1]".to_string() } else { format!("\"0 {} * * * *\"", i % 60) };
        // A misspelt key in the place of `type`: the line count stays the same.
        let kind = if i % 1000 == 500 { "typ: plugin" } else { "type: plugin" };
        text.push_str(&format!("    job-{i:04}:\n      cron: {cron}\n      {kind}\n      plugin: file-save\n      action: save\n      parameters: {{path: a, content: b}}\n"));
    }
    write(tmp.path(), "lamplighter.yaml", &text);
    for merged in [KeepMerged::Whole, KeepMerged::WithoutJobs] {
        let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), merged };
        let (config, diags) = lamplighter_config::load_partial(&opts, |_| None);
        let errors: Vec<String> = diags.iter().filter(|d| d.is_error()).map(ToString::to_string).collect();
        assert_eq!(errors.len(), 6, "{errors:?}");
        // Job i starts on line 3 + 6i; its `cron` is the line after, its kind two after.
        let expected = [(3005, "unknown key \"typ\" in \"scheduling.jobs.job-0500\" (did you mean \"type\"?)"), (5998, "cron")]
            .into_iter()
            .chain([(9005, "job-1500"), (11998, "cron"), (15005, "job-2500"), (17998, "cron")]);
        for (line, words) in expected {
            assert!(errors.iter().any(|e| e.contains(&format!("lamplighter.yaml:{line}:")) && e.contains(words)), "{line}: {errors:?}");
        }
        let jobs = config.expect("a config despite the errors").jobs;
        assert_eq!(jobs.len(), 2994);
        assert!(!jobs.contains_key("job-0500") && jobs.contains_key("job-0501"));
        // One schedule for each cron written (sixty of them), shared by the jobs that write it.
        let schedule = |name: &str| jobs[name].schedule.clone().expect("scheduled");
        assert!(std::sync::Arc::ptr_eq(&schedule("job-0001"), &schedule("job-0061")));
        assert!(!std::sync::Arc::ptr_eq(&schedule("job-0001"), &schedule("job-0002")));
        let mut distinct: Vec<_> = jobs.values().filter_map(|j| j.schedule.as_ref().map(std::sync::Arc::as_ptr)).collect();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 60);
    }
}

/// A worker's load (which frees each job's YAML as it reads it) gives the same jobs and the
/// same errors, at the same places, as a load that keeps the YAML, for every kind of job: good
/// ones, variables to substitute, unknown keys, values that do not read, a null job, a bad
/// cron, anchors and aliases between jobs, and an import that defines a job twice.
#[test]
fn a_lean_load_gives_the_jobs_and_errors_of_a_whole_load() {
    let tmp = tempfile::tempdir().unwrap();
    let act = "      type: plugin\n      plugin: file-save\n      action: save\n";
    write(
        tmp.path(),
        "lamplighter.yaml",
        &format!(
            "framework:\n  imports: [more.yaml]\nscheduling:\n  jobs:\n\
             \x20   good:\n      cron: \"0 0 * * * *\"\n{act}      parameters: {{path: a, content: b}}\n\
             \x20   with-var:\n      every: 1h\n{act}      parameters: {{path: \"${{HOME_DIR}}/a\", content: \"${{UNSET_ONE}}\"}}\n\
             \x20   unknown-key:\n      every: 1h\n{act}      paramters: {{}}\n\
             \x20   bad-read:\n      cron: [1]\n{act}\
             \x20   null-job:\n\
             \x20   bad-cron:\n      cron: \"not a cron\"\n{act}\
             \x20   anchored: &a\n      every: 1h\n{act}\
             \x20   aliased: *a\n\
             \x20   twice:\n      every: 2h\n{act}"
        ),
    );
    write(
        tmp.path(),
        "more.yaml",
        &format!("scheduling:\n  jobs:\n    twice:\n      every: 3h\n{act}    from-more:\n      every: 4h\n{act}"),
    );
    let load = |merged| {
        let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), merged };
        let (config, diags) = lamplighter_config::load_partial(&opts, |n| (n == "HOME_DIR").then(|| "/home/x".to_string()));
        let mut diags: Vec<String> = diags.iter().map(|d| d.to_string().replace(&format!("{}/", tmp.path().display()), "")).collect();
        diags.sort();
        (config.expect("a config despite the errors").jobs, diags)
    };
    let (whole, lean) = (load(KeepMerged::Whole), load(KeepMerged::WithoutJobs));
    assert_eq!(whole.1, lean.1);
    assert_eq!(whole.0, lean.0);
    let names: Vec<&str> = lean.0.keys().map(String::as_str).collect();
    assert_eq!(names, ["aliased", "anchored", "bad-cron", "from-more", "good", "twice", "with-var"]);
    for expected in [
        "lamplighter.yaml:16:43: error: \"scheduling.jobs.with-var.parameters.content\" uses ${UNSET_ONE}",
        "lamplighter.yaml:22:7: error: unknown key \"paramters\"",
        "lamplighter.yaml:24:7: error: \"scheduling.jobs.bad-read.cron\": invalid type",
        "lamplighter.yaml:28:5: error: job \"null-job\" needs \"type\"",
        "lamplighter.yaml:30:7: error: job \"bad-cron\": cron \"not a cron\"",
        "more.yaml:3:5: error: job \"twice\" is defined twice: in lamplighter.yaml:40:5",
    ] {
        assert!(lean.1.iter().any(|d| d.starts_with(expected)), "{expected}\n{:#?}", lean.1);
    }
}

/// A large file keeps only the positions down to its jobs while it loads: an error deeper in
/// it is still reported on its own line (the file is parsed again for it), a path asked for
/// after the load too; and once the file has changed, a deep path is placed at its job's line
/// rather than at a line of a text that is no longer the one loaded.
#[test]
fn a_large_files_deep_errors_are_located_on_their_own_line() {
    let tmp = tempfile::tempdir().unwrap();
    let text = |bad: &dyn Fn(usize) -> bool| {
        let mut text = String::from("scheduling:\n  jobs:\n");
        for i in 0..6000 {
            let cron = if bad(i) { "[1]".to_string() } else { format!("\"0 {} * * * *\"", i % 60) };
            text.push_str(&format!("    job-{i:04}:\n      cron: {cron}\n      type: plugin\n      plugin: file-save\n      action: save\n      parameters: {{path: a, content: b}}\n"));
        }
        assert!(text.len() > 600 * 1024, "large enough to keep only the shallow positions: {}", text.len());
        text
    };
    let path = tmp.path().join("lamplighter.yaml");
    let opts = LoadOptions { path: Some(path.clone()), cwd: Some(tmp.path().to_path_buf()), merged: KeepMerged::WithoutJobs };
    let at = |config: &lamplighter_config::Config, job: &str, field: &str| {
        let loc = config.sources.locate(&lamplighter_config::keys(&["scheduling", "jobs", job, field])).expect("located");
        loc.to_string().replace(&format!("{}/", tmp.path().display()), "")
    };

    std::fs::write(&path, text(&|i| i % 2000 == 1999)).unwrap();
    let (config, diags) = lamplighter_config::load_partial(&opts, |_| None);
    let errors: Vec<String> = diags.iter().filter(|d| d.is_error()).map(ToString::to_string).collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    // Job i starts on line 3 + 6i; its `cron` is the line after, its `action` four after.
    for (e, line) in errors.iter().zip([11998, 23998, 35998]) {
        assert!(e.contains(&format!("lamplighter.yaml:{line}:7:")) && e.contains("cron"), "{e}");
    }
    let config = config.expect("a config despite the errors");
    assert_eq!(config.jobs.len(), 5997);
    assert_eq!(at(&config, "job-0005", "action"), "lamplighter.yaml:37:7");
    assert_eq!(at(&config, "job-0005", "nothing-here"), "lamplighter.yaml:33:5", "an absent key: its job's line");

    std::fs::write(&path, text(&|_| false)).unwrap();
    let config = lamplighter_config::load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
    std::fs::write(&path, format!("# changed since it was loaded\n{}", text(&|_| false))).unwrap();
    assert_eq!(at(&config, "job-0005", "action"), "lamplighter.yaml:33:5", "the job's line as loaded, not a guess into the new text");
    assert_eq!(at(&config, "job-0100", ""), "lamplighter.yaml:603:5");

    // A change of the same length is told by the modification time.
    std::fs::write(&path, text(&|_| false)).unwrap();
    let config = lamplighter_config::load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
    let loaded_at = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::fs::write(&path, text(&|_| false).replacen("action: save", "action: sav2", 1)).unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(loaded_at + std::time::Duration::from_secs(5)).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, text(&|_| false).len());
    assert_eq!(at(&config, "job-0005", "action"), "lamplighter.yaml:33:5", "same length, a later time: not the file loaded");
}

#[test]
fn a_seed_shaped_config_loads_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = LoadOptions { path: Some(seed_shaped()), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let loaded = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}"));
    let c = &loaded.config;
    assert!(c.jobs.contains_key("morning-digest-7am"));
    let morning = c.jobs["morning-digest-7am"].schedule.as_ref().expect("a parsed schedule");
    assert_eq!(morning.spec(), &lamplighter_config::ScheduleSpec::Cron("0 7 * * *".into()));
    assert_eq!(c.agents.len(), 7, "{:?}", c.agents.keys());
    assert_eq!(c.workflows.len(), 3);
    // The unset key disables the provider and its agents, it does not stop the load.
    assert!(c.disabled[&Disabled::Provider("azure-openai".into())].contains("AZURE_OPENAI_API_KEY"));
    assert!(c.disabled.contains_key(&Disabled::Agent("digest-writer".into())));
    assert!(loaded.warnings.iter().any(|w| w.message.contains("\"dataverse\"")));
    // `${input}` is a workflow template, not an environment variable.
    let plan = &c.workflows["plan-change"].steps[0];
    let StepKind::Agent { input: Some(Templated::Text(input)), .. } = &plan.kind else { panic!("{plan:?}") };
    assert_eq!(input.as_single_var(), Some(&Var::Input(vec![])));
    // Aliases resolve through the provider registry, once, where validation checks them.
    let coder = c.agents.values().find(|a| a.model.as_deref() == Some("default-coding")).expect("a coding agent");
    let resolved = coder.resolved.as_ref().expect("resolved model");
    assert_eq!((resolved.provider.as_str(), resolved.model.id.as_str()), ("azure-openai", "gpt-5.1-codex-mini"));
    assert_eq!(resolved.model.api, ModelApi::Responses);
    let providers = format!("{:?}", c.providers);
    assert!(providers.contains("<redacted>") && !providers.contains("AZURE_OPENAI_API_KEY"), "keys are redacted in Debug: {providers}");
    // The seed's telemetry section: on, everything over OTLP, no prompts on spans.
    let t = &c.telemetry;
    assert!(t.enabled && !t.sensitive_data);
    assert_eq!(t.service_name.as_deref(), Some("newsroom"));
    let otlp = Some(lamplighter_config::Exporter::Otlp);
    assert_eq!((t.traces.exporter, t.metrics.exporter, t.logs.exporter), (otlp, otlp, otlp));
    let shown = lamplighter_config::show(c);
    assert!(shown.contains("morning-digest-7am"));
    assert!(!shown.contains("${AZURE_OPENAI_API_KEY}"), "secrets must be redacted:\n{shown}");
}

#[test]
fn secrets_are_redacted_in_show() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "lamplighter.yaml", "ai:\n  providers:\n    p:\n      base_url: http://x/v1\n      api_key: ${KEY}\n");
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let l = load_with_env(&opts, |n| (n == "KEY").then(|| "sk-very-secret".to_string())).unwrap();
    let shown = lamplighter_config::show(&l.config);
    assert!(!shown.contains("sk-very-secret"), "{shown}");
    assert!(shown.contains("<redacted>"));
}

#[test]
fn every_error_is_reported_with_its_location() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(
        d,
        "lamplighter.yaml",
        r#"framework:
  imports: [more.yaml, "extra/*.yaml"]
scheduling:
  jobs:
    a:
      type: workflow
      workflow: nope
      cron: "0 2 * * *"
      catch_up: sometimes
    b:
      type: plugin
      plugin: shell-exec
      action: run
      every: 90s
      timezon: Europe/Berlin
    c:
      type: agent
      agent: ghost
      timeout: soon
    d:
      type: plugin
      plugin: file-save
      action: save
      cron: "61 * * * *"
      timezone: Europe/Berln
agents:
  dup:
    model: m
"#,
    );
    write(
        d,
        "more.yaml",
        "agents:\n  dup:\n    model: m\nscheduling:\n  jobs:\n    e:\n      type: plugin\n      plugin: file-save\n      action: save\n      tags:\n        - finance\n        - has space\n",
    );
    let errs = errors_of(d);
    assert!(
        errs.iter().any(|x| x.starts_with("more.yaml:10:7: ")
            && x.contains("error: job \"e\": tag \"has space\" has ' '; a tag has letters, digits, -, _, . and / only")),
        "a bad tag, located: {errs:#?}"
    );
    let expected = [
        "lamplighter.yaml:7:7: error: job \"a\" runs workflow \"nope\", which is not defined (defined workflows: none)",
        "lamplighter.yaml:9:7: error: job \"a\": catch_up \"sometimes\" is not one of skip, latest, all",
        "lamplighter.yaml:15:7: error: unknown key \"timezon\" in \"scheduling.jobs.b\" (did you mean \"timezone\"?)",
        "lamplighter.yaml:18:7: error: job \"c\" runs agent \"ghost\", which is not defined (defined agents: \"dup\")",
        "lamplighter.yaml:19:7: error: job \"c\": timeout \"soon\" is not a duration",
        "more.yaml:2:3: error: agent \"dup\" is defined twice: in",
        // A bad zone does not hide a bad cron: both, each on one line, naming the field.
        "lamplighter.yaml:24:7: error: job \"d\": cron \"61 * * * *\": minute 61 is out of range 0–59",
        "lamplighter.yaml:25:7: error: job \"d\": time zone \"Europe/Berln\" is not an IANA zone name (did you mean \"Europe/Berlin\"?)",
    ];
    for e in expected {
        assert!(errs.iter().any(|x| x.starts_with(e)), "missing {e:?} in:\n{}", errs.join("\n"));
    }
    let dup = errs.iter().find(|e| e.contains("defined twice")).unwrap();
    assert!(dup.contains("lamplighter.yaml:27:3") && dup.contains("more.yaml:2:3"), "{dup}");
}

#[test]
fn unset_variable_where_needed_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "lamplighter.yaml", "framework:\n  data_dir: ${DATA}\n");
    let errs = errors_of(tmp.path());
    assert_eq!(
        errs,
        [
            "lamplighter.yaml:2:3: error: \"framework.data_dir\" uses ${DATA}, which is not set; set it or give a default with ${DATA:-value}"
        ]
    );
}

#[test]
fn markdown_and_folder_agents() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(
        d,
        "lamplighter.yaml",
        "ai:\n  default_model: m\n  providers:\n    local:\n      base_url: http://127.0.0.1:1/v1\n      models:\n        m: {id: m}\n",
    );
    write(d, "agents/writer.md", "---\ndescription: writes\nplugins: [file-save]\n---\nYou write.\n");
    write(d, "agents/reviewer/agent.yaml", "description: reviews\n");
    write(d, "agents/reviewer/prompt.md", "You review.\n");
    let opts = LoadOptions { path: Some(d.join("lamplighter.yaml")), cwd: Some(d.to_path_buf()), ..Default::default() };
    let l = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}"));
    let agents = &l.config.agents;
    assert_eq!(agents["writer"].system_prompt, Some(SystemPrompt::Inline("You write.".into())));
    assert_eq!(agents["reviewer"].system_prompt, Some(SystemPrompt::Inline("You review.".into())));
    // An error in front matter points into the Markdown file, past the opening `---`.
    write(d, "agents/writer.md", "---\ndescription: writes\nplugin: [file-save]\n---\nYou write.\n");
    let errs = errors_of(d);
    assert!(errs.iter().any(|e| e.starts_with("agents/writer.md:3:1: error: unknown key \"plugin\"")), "{errs:?}");
}

#[test]
fn garbage_never_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        "[1, 2",
        "- just\n- a list\n",
        "scheduling: 5\n",
        "scheduling:\n  jobs: [1]\n",
        "\t\tbad: indent",
        "a: &x [*x]\n",
        "framework:\n  imports: 7\n",
    ];
    for c in cases {
        write(tmp.path(), "lamplighter.yaml", c);
        let errs = errors_of(tmp.path());
        assert!(!errs.is_empty(), "{c:?}");
    }
}

/// Pins every workflow, agent and pipeline message with its location, so that compiling these
/// sections into resolved types cannot change what users read.
#[test]
fn workflow_agent_and_pipeline_errors_are_located() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(
        d,
        "lamplighter.yaml",
        r#"ai:
  default_model: small
  providers:
    local:
      base_url: http://127.0.0.1:1/v1
      models:
        small: {id: s}
mcp:
  servers:
    search: {command: echo}
agents:
  a:
    model: small
  b:
    provider: nowhere
  c:
    provider: local
    model: large
  d:
    model: unknown-model
    mcp_servers: [search, serch]
    delegates: [a, zz]
    temperature: 3.5
    system_prompt: hi
    system_prompt_file: p.md
pipelines:
  p:
    steps: [a, ghost]
workflows:
  empty:
    steps: []
  w:
    steps:
      - {id: s1, type: agent}
      - {id: s1, type: agent, agent: nobody}
      - {id: s3, type: plugin}
      - {id: s4, type: condition, then: [s9]}
      - {id: s5, type: parallel}
      - id: s6
        type: parallel
        steps:
          - {id: s7, type: group_chat, agents: [a, x]}
      - {id: s8, type: approval, timeout: soon}
      - {id: s10, type: aproval}
"#,
    );
    let errors = errors_of(d);
    let expected = r#"lamplighter.yaml:15:5: error: agent "b" uses provider "nowhere", which is not defined (defined providers: "local")
lamplighter.yaml:18:5: error: agent "c" uses model "large", which provider "local" does not define (its models: "small")
lamplighter.yaml:20:5: error: agent "d" uses model "unknown-model", which no provider defines; add it under ai.providers.<provider>.models or set agents.d.provider
lamplighter.yaml:21:27: error: agent "d" uses MCP server "serch", which is not defined under mcp.servers (did you mean "search"?)
lamplighter.yaml:22:20: error: agent "d" delegates to agent "zz", which is not defined
lamplighter.yaml:23:5: error: agent "d": temperature 3.5 is outside 0.0–2.0
lamplighter.yaml:25:5: error: agent "d" sets both system_prompt and system_prompt_file; keep one
lamplighter.yaml:28:5: error: pipeline "p" uses agent "ghost", which is not defined
lamplighter.yaml:31:5: error: workflow "empty" has no steps
lamplighter.yaml:32:3: error: workflow "w": step "s4" names step "s9", which does not exist
lamplighter.yaml:34:9: error: workflow "w": step "s1" of type agent needs "agent"
lamplighter.yaml:35:10: error: workflow "w": step id "s1" is used twice; step ids must be unique
lamplighter.yaml:35:31: error: workflow "w": step "s1" uses agent "nobody", which is not defined (defined agents: "a", "b", "c", "d")
lamplighter.yaml:36:9: error: workflow "w": step "s3" of type plugin needs "action"
lamplighter.yaml:36:9: error: workflow "w": step "s3" of type plugin needs "plugin"
lamplighter.yaml:37:9: error: workflow "w": step "s4" of type condition needs "condition"
lamplighter.yaml:38:9: error: workflow "w": parallel step "s5" needs "steps"
lamplighter.yaml:42:40: error: workflow "w": group chat step "s7" uses agent "x", which is not defined
lamplighter.yaml:43:34: error: workflow "w": step "s8": timeout "soon" is not a duration (expected number at 0); write e.g. "90s", "15m", "24h"
lamplighter.yaml:44:19: error: workflow "w": step "s10" has unknown type "aproval" (did you mean "approval"?); use one of agent, plugin, condition, approval, parallel, group_chat"#;
    assert_eq!(errors.join("\n"), expected);
}

/// Steps compile into their kinds, with templates parsed once and branches kept by id.
#[test]
fn workflows_compile_into_typed_steps() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "lamplighter.yaml",
        r#"workflows:
  publish:
    steps:
      - id: fetch
        type: plugin
        plugin: web-fetch
        action: fetch
        parameters: {url: "${input.url}", retries: 2}
      - id: check
        type: condition
        condition: "${steps.fetch.output.status}"
        then: [both]
        else: [ask]
      - id: both
        type: parallel
        steps:
          - {id: a, type: plugin, plugin: file-save, action: save, input: "run ${run.id}"}
      - id: ask
        type: approval
        input: "Publish ${steps.a.output}?"
        timeout: 24h
        when: "${env.PUBLISH}"
"#,
    );
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let c = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
    let steps = &c.workflows["publish"].steps;
    let types: Vec<&str> = steps.iter().map(|s| s.kind.step_type().as_str()).collect();
    assert_eq!(types, ["plugin", "condition", "parallel", "approval"]);
    let StepKind::Plugin { parameters: Some(p), .. } = &steps[0].kind else { panic!("{:?}", steps[0]) };
    assert_eq!(p.vars(), [&Var::Input(vec!["url".into()])]);
    assert_eq!(p.as_written(), serde_json::json!({"url": "${input.url}", "retries": 2}));
    let StepKind::Condition { condition, then, otherwise } = &steps[1].kind else { panic!("{:?}", steps[1]) };
    assert_eq!(condition.as_single_var(), Some(&Var::StepOutput { step: "fetch".into(), path: vec!["status".into()] }));
    assert_eq!((then.as_slice(), otherwise.as_slice()), (&["both".to_string()][..], &["ask".to_string()][..]));
    let StepKind::Parallel { steps: children } = &steps[2].kind else { panic!("{:?}", steps[2]) };
    assert_eq!(children[0].id, "a");
    let StepKind::Approval { timeout, .. } = &steps[3].kind else { panic!("{:?}", steps[3]) };
    assert_eq!(*timeout, Some(std::time::Duration::from_secs(24 * 3600)));
    assert_eq!(steps[3].when.as_ref().and_then(|w| w.as_single_var()), Some(&Var::Env("PUBLISH".into())));
}

/// An MCP server needs exactly one way to reach it; a model's API type is one we can call.
#[test]
fn mcp_servers_and_model_api_types_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "lamplighter.yaml",
        r#"ai:
  providers:
    local:
      base_url: http://127.0.0.1:1/v1
      models:
        m: {id: m, api_type: completions}
mcp:
  servers:
    nothing: {args: [x]}
    both: {command: srv, url: "http://127.0.0.1:1/mcp"}
    fine: {url: "http://127.0.0.1:1/mcp"}
"#,
    );
    let expected = r#"lamplighter.yaml:6:20: error: model "m" of provider "local": api_type "completions" is not one of chat, responses
lamplighter.yaml:9:5: error: MCP server "nothing" needs "command" (a stdio server) or "url" (a streamable-HTTP server)
lamplighter.yaml:10:26: error: MCP server "both" sets both command and url; keep one"#;
    assert_eq!(errors_of(tmp.path()).join("\n"), expected);
}

/// PostgreSQL storage: a URL (from `${DATABASE_URL}`), pool size and statement timeout with
/// defaults, the URL's password kept out of `Debug` and `config show`; the seed's SQLite form
/// is refused for postgres with a clear message.
#[test]
fn postgres_storage_reads_its_url_pool_and_timeout_and_hides_the_password() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "lamplighter.yaml",
        "scheduling:\n  storage:\n    provider: postgres\n    connection_string: ${DATABASE_URL}\n    statement_timeout: 5s\n  jobs: {}\n",
    );
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let env = |n: &str| (n == "DATABASE_URL").then(|| "postgres://ll:hunter2@db.internal:5432/lamplighter".to_string());
    let config = load_with_env(&opts, env).unwrap_or_else(|e| panic!("{e}")).config;
    match &config.storage {
        lamplighter_config::StorageConfig::Postgres { url, pool_size, statement_timeout } => {
            assert_eq!(url.expose(), "postgres://ll:hunter2@db.internal:5432/lamplighter");
            assert_eq!((*pool_size, *statement_timeout), (10, std::time::Duration::from_secs(5)));
        }
        other => panic!("{other:?}"),
    }
    assert!(!format!("{:?}", config.storage).contains("hunter2"));
    let shown = lamplighter_config::show(&config);
    assert!(shown.contains("postgres://ll:<redacted>@db.internal:5432/lamplighter") && !shown.contains("hunter2"), "{shown}");

    write(
        tmp.path(),
        "lamplighter.yaml",
        "scheduling:\n  storage:\n    provider: postgres\n    connection_string: \"Data Source=data/x.db\"\n    pool_size: 0\n  jobs: {}\n",
    );
    let expected = r#"lamplighter.yaml:4:5: error: storage provider "postgres" needs a postgres:// URL in connection_string; this is a SQLite "Data Source=…"
lamplighter.yaml:5:5: error: pool_size 0 is outside 1–1000"#;
    assert_eq!(errors_of(tmp.path()).join("\n"), expected);
}

/// A blank connection string (`${DATABASE_URL:-}` with nothing set, as the container's config
/// has it) is no connection string: SQLite's file in the data directory, or for PostgreSQL the
/// error that asks for one.
#[test]
fn a_blank_connection_string_means_the_default() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "framework:\n  data_dir: d\nscheduling:\n  storage:\n    provider: ${STORE:-sqlite}\n    connection_string: ${DATABASE_URL:-}\n  jobs: {}\n";
    write(tmp.path(), "lamplighter.yaml", text);
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let config = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
    match &config.storage {
        lamplighter_config::StorageConfig::Sqlite { path } => assert_eq!(path, &tmp.path().join("d/lamplighter.db")),
        other => panic!("{other:?}"),
    }
    let env = |n: &str| (n == "STORE").then(|| "postgres".to_string());
    let errors = load_with_env(&opts, env).err().map(|e| e.to_string());
    assert!(errors.as_deref().unwrap_or_default().contains("needs scheduling.storage.connection_string"), "{errors:?}");
}

/// `worker.lease`: 30 s by default, a duration of at least a second.
#[test]
fn the_worker_lease_has_a_default_and_refuses_nonsense() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "lamplighter.yaml", "worker:\n  lease: 5s\nscheduling:\n  jobs: {}\n");
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let config = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
    assert_eq!(config.worker.lease, std::time::Duration::from_secs(5));
    write(tmp.path(), "lamplighter.yaml", "scheduling:\n  jobs: {}\n");
    let config = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config;
    assert_eq!(config.worker.lease, lamplighter_config::DEFAULT_LEASE);
    write(tmp.path(), "lamplighter.yaml", "worker:\n  lease: 0s\nscheduling:\n  jobs: {}\n");
    assert_eq!(errors_of(tmp.path()), ["lamplighter.yaml:2:3: error: worker.lease must be at least 1s"]);
    write(tmp.path(), "lamplighter.yaml", "worker:\n  lease: soon\nscheduling:\n  jobs: {}\n");
    let errors = errors_of(tmp.path());
    assert!(errors.len() == 1 && errors[0].contains("worker.lease"), "{errors:?}");
}

#[test]
fn hook_and_telemetry_mistakes_are_located_errors() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "lamplighter.yaml",
        "hooks:\n  bindings:\n    - {event: \"agent:*:model-call:later\", plugin: p, hook: h}\n    - {event: \"agent\", plugin: p, hook: h}\n    - {event: \"agent:*:model-call:before\", plugin: \"\", hook: h}\n\
         telemetry:\n  enabled: true\n  traces: {exporter: zipkin}\n  metrics: {exporter: console, export_interval_ms: 5}\n  logs: {endpoint: \"collector:4318\"}\n",
    );
    let errors = errors_of(tmp.path());
    let want = [
        "lamplighter.yaml:3:8: error: hook event \"agent:*:model-call:later\": timing \"later\" is not one of before, after, onerror, around, *",
        "lamplighter.yaml:4:8: error: hook event \"agent\" is not domain:component:action:timing",
        "lamplighter.yaml:5:7: error: hook binding for \"agent:*:model-call:before\" needs a plugin and a hook",
        "lamplighter.yaml:8:12: error: telemetry.traces.exporter \"zipkin\" is not built in: Jaeger and Zipkin both take OTLP",
        // The seed's reference writes it: a warning, so that the seed's files load.
        "lamplighter.yaml:9:13: warning: telemetry.metrics.exporter \"console\" would print metrics on the console, which is not built in",
        "lamplighter.yaml:9:32: error: telemetry.metrics.export_interval_ms must be at least 100, not 5",
        "lamplighter.yaml:10:10: error: telemetry.logs.endpoint \"collector:4318\" is not an http(s) URL",
    ];
    for w in want {
        assert!(errors.iter().any(|e| e.starts_with(w)), "missing {w}\nin {errors:#?}");
    }
    assert_eq!(errors.len(), want.len(), "{errors:#?}");
}

#[test]
fn what_wasm_plugins_may_reach_is_checked() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "lamplighter.yaml",
        "plugins:\n  wasm:\n    capabilities: [http-request, mcp]\n    http:\n      allowed_hosts: [api.example.com, \"https://x.example\", \"*.\"]\n      \
         timeout: soon\n      max_response_kb: 0\n    ai: {max_tokens: 0}\n    mcp: {tools: [github, \"docs.*\"]}\n",
    );
    let errors = errors_of(tmp.path());
    let want = [
        "lamplighter.yaml:5:40: error: plugins.wasm.http.allowed_hosts: \"https://x.example\" is not a host (write",
        "lamplighter.yaml:5:61: error: plugins.wasm.http.allowed_hosts: \"*.\" is not a host (write",
        "lamplighter.yaml:6:7: error: \"soon\" is not a duration",
        "lamplighter.yaml:7:7: error: plugins.wasm.http.max_response_kb must be between 1 and 1048576, not 0",
        "lamplighter.yaml:8:10: error: plugins.wasm.ai.max_tokens must be more than zero",
        "lamplighter.yaml:9:19: error: plugins.wasm.mcp.tools: \"github\" is not server.tool or server.*",
    ];
    for w in want {
        assert!(errors.iter().any(|e| e.starts_with(w)), "missing {w}\nin {errors:#?}");
    }
    assert_eq!(errors.iter().filter(|e| e.contains(": error: ")).count(), want.len(), "{errors:#?}");

    // Granted with nothing listed: loads, saying every call will be refused.
    write(tmp.path(), "lamplighter.yaml", "plugins:\n  wasm:\n    capabilities: [http-request, mcp, ai]\n");
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let loaded = load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}"));
    let warnings: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert!(
        warnings.iter().any(|w| w.contains("plugins.wasm.http.allowed_hosts is empty: every request will be refused")),
        "{warnings:#?}"
    );
    assert!(warnings.iter().any(|w| w.contains("plugins.wasm.mcp.tools is empty: every MCP call will be refused")), "{warnings:#?}");
    let w = &loaded.config.wasm;
    assert_eq!((w.http_timeout.as_secs(), w.http_max_response_bytes, w.ai_max_tokens), (5, 1024 * 1024, 1024), "the defaults");
}

/// `after` names jobs that exist, never itself, in no cycle (each job on one is told, with the
/// way round); each mistake is one located line. A diamond is no cycle.
#[test]
fn after_mistakes_are_located_and_cycles_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let save = "      type: plugin\n      plugin: file-save\n      action: save\n";
    let jobs = [
        ("extract", "      cron: \"0 1 * * *\"\n"),
        ("load", "      after: [extrct]\n"),
        ("a", "      after: [b]\n"),
        ("b", "      after: {jobs: [c]}\n"),
        ("c", "      after: {jobs: [a], on: success}\n"),
        ("me", "      after: [me]\n"),
        ("on", "      after: {jobs: [extract], on: sucess}\n"),
        ("win", "      after: {jobs: [extract], within: soon}\n"),
        ("key", "      after: {job: [extract]}\n"),
        ("shape", "      after: extract\n"),
        ("fine", "      after: {jobs: [extract, load], on: finished, within: 12h}\n"),
        ("d1", "      after: [extract]\n"),
        ("d2", "      after: [d1]\n"),
        ("d3", "      after: [d1]\n"),
        ("d4", "      after: [d2, d3]\n"),
    ];
    let mut text = String::from("scheduling:\n  jobs:\n");
    for (name, after) in jobs {
        text.push_str(&format!("    {name}:\n{save}{after}"));
    }
    write(d, "lamplighter.yaml", &text);
    let errs = errors_of(d);
    let expected = [
        "job \"load\": after names job \"extrct\", which is not defined (did you mean \"extract\"?)",
        "job \"a\": after makes a cycle: a → b → c → a",
        "job \"b\": after makes a cycle: b → c → a → b",
        "job \"c\": after makes a cycle: c → a → b → c",
        "job \"me\": after names the job itself",
        "job \"on\": after on \"sucess\" is not one of success, failure, finished (did you mean \"success\"?)",
        "job \"win\": after within \"soon\" is not a duration",
        "job \"key\": after has an unknown key \"job\" (did you mean \"jobs\"?); it takes jobs, on and within",
        "job \"shape\": after \"extract\" must be a list of job names ([extract]) or {jobs: [a, b], on: success, within: 12h}",
    ];
    for e in expected {
        assert!(errs.iter().any(|x| x.contains(": error: ") && x.contains(e)), "missing {e:?} in:\n{}", errs.join("\n"));
    }
    assert_eq!(errs.iter().filter(|e| e.contains("makes a cycle")).count(), 3, "each job on it: {errs:#?}");
    assert!(!errs.iter().any(|e| e.contains("\"fine\"") || e.contains("\"d")), "{errs:#?}");
    let located = errs.iter().find(|e| e.contains("extrct")).unwrap();
    assert!(located.starts_with("lamplighter.yaml:12:7: "), "at the job's after: {located}");
}

/// `scheduling.limits` and a job's `limits`: names and keys read as written, and each mistake
/// is an error located at its field (an unknown limit with a did-you-mean).
#[test]
fn limits_are_read_and_their_mistakes_located() {
    let tmp = tempfile::tempdir().unwrap();
    let job = |name: &str, limits: &str| {
        format!("    {name}:\n      type: plugin\n      plugin: file-save\n      action: save\n      limits: {limits}\n")
    };
    let good = format!(
        "scheduling:\n  limits:\n    warehouse: 2\n    tenant: 1\n  jobs:\n{}{}",
        job("load", "[warehouse]"),
        job("sync", "[warehouse, {name: tenant, key: \"${input.tenant}\"}]")
    );
    write(tmp.path(), "lamplighter.yaml", &good);
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let config = load_with_env(&opts, |_| None).expect("loads").config;
    assert_eq!(config.limits, [("tenant".to_string(), 1), ("warehouse".to_string(), 2)].into());
    let sync = config.jobs["sync"].limits();
    assert_eq!(
        sync.iter().map(|l| (l.name.as_str(), l.key.as_deref())).collect::<Vec<_>>(),
        [("warehouse", None), ("tenant", Some("${input.tenant}"))]
    );

    let bad = format!(
        "scheduling:\n  limits:\n    warehouse: 2\n    none: 0\n  jobs:\n{}{}{}{}",
        job("a", "[warehose]"),
        job("b", "[{name: warehouse, key: \"${env.HOME}\"}]"),
        job("c", "[warehouse, warehouse]"),
        job("d", "warehouse")
    );
    write(tmp.path(), "lamplighter.yaml", &bad);
    let errs = errors_of(tmp.path());
    let expected = [
        "lamplighter.yaml:4:5: error: limit \"none\" has 0 slots",
        "lamplighter.yaml:10:7: error: job \"a\": limits names limit \"warehose\", which scheduling.limits does not define (did you mean \"warehouse\"?) (defined limits: \"warehouse\")",
        "lamplighter.yaml:15:7: error: job \"b\": limits key \"${env.HOME}\" uses ${env.HOME}; a limit's key may only use the run's input",
        "lamplighter.yaml:20:7: error: job \"c\": limits names limit \"warehouse\" twice",
        "lamplighter.yaml:25:7: error: job \"d\": limits must be a list of limit names",
    ];
    for e in expected {
        assert!(errs.iter().any(|x| x.starts_with(e)), "missing {e:?} in:\n{}", errs.join("\n"));
    }

    // A workflow step takes limits as a job does; a parallel holds its children's; a step
    // that does no work of its own takes none.
    let steps = |gpu_step: &str| {
        format!(
            "scheduling:\n  limits:\n    gpu: 1\n    tenant: 2\n  jobs:\n    render:\n      workflow: render\n\
             workflows:\n  render:\n    steps:\n\
             \x20     - {{id: prep, type: plugin, plugin: file-save, action: save}}\n\
             {gpu_step}\
             \x20     - id: both\n        type: parallel\n        limits: [tenant]\n        steps:\n\
             \x20         - {{id: left, type: plugin, plugin: file-save, action: save, limits: [{{name: tenant, key: \"${{input.t}}\"}}]}}\n"
        )
    };
    write(tmp.path(), "lamplighter.yaml", &steps("      - {id: paint, type: plugin, plugin: file-save, action: save, limits: [gpu]}\n"));
    let config = load_with_env(&opts, |_| None).expect("loads").config;
    let render = &config.workflows["render"];
    let held = |i: usize| render.steps[i].held_limits().iter().map(|l| (l.name.clone(), l.key.clone())).collect::<Vec<_>>();
    assert_eq!(held(0), []);
    assert_eq!(held(1), [("gpu".to_string(), None)]);
    assert_eq!(
        held(2),
        [("tenant".to_string(), None), ("tenant".to_string(), Some("${input.t}".to_string()))],
        "the parallel's and its child's"
    );
    for (step, error) in [
        (
            "      - {id: paint, type: plugin, plugin: file-save, action: save, limits: [gpuu]}\n",
            "lamplighter.yaml:12:68: error: workflow \"render\": step \"paint\": limits names limit \"gpuu\", which scheduling.limits does not define (did you mean \"gpu\"?)",
        ),
        (
            "      - {id: ok, type: approval, limits: [gpu]}\n",
            "lamplighter.yaml:12:34: error: workflow \"render\": step \"ok\": an approval step waits for a person and holds no limit",
        ),
        (
            "      - {id: paint, type: plugin, plugin: file-save, action: save, limits: [gpu, gpu]}\n",
            "lamplighter.yaml:12:68: error: workflow \"render\": step \"paint\": limits names limit \"gpu\" twice; step \"paint\" holds one slot of each limit",
        ),
    ] {
        write(tmp.path(), "lamplighter.yaml", &steps(step));
        let errs = errors_of(tmp.path());
        assert!(errs.iter().any(|x| x.starts_with(error)), "missing {error:?} in:\n{}", errs.join("\n"));
    }
}

/// `scheduling.calendars` and a job's `calendar`: the job fires only on the calendar's days,
/// in its zone, and its preview says which days it passed over and why; each mistake is an
/// error located at its field.
#[test]
fn calendars_keep_a_jobs_fires_to_their_days_and_their_mistakes_are_located() {
    let tmp = tempfile::tempdir().unwrap();
    let good = "scheduling:\n  calendars:\n    business:\n      weekdays: [mon..fri]\n      except: [holidays]\n    holidays:\n      dates: [\"2026-12-24..2026-12-26\", \"2027-01-01\"]\n  jobs:\n    payroll:\n      type: plugin\n      plugin: file-save\n      action: save\n      cron: \"30 6 * * *\"\n      timezone: Europe/Berlin\n      calendar: business\n";
    write(tmp.path(), "lamplighter.yaml", good);
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let config = load_with_env(&opts, |_| None).expect("loads").config;
    assert_eq!(config.calendars.keys().collect::<Vec<_>>(), ["business", "holidays"]);
    let schedule = config.jobs["payroll"].schedule.clone().expect("a schedule");
    assert_eq!(schedule.calendar().map(|c| c.name()), Some("business"));
    let t = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&chrono::Utc);
    // Wednesday 23 December 2026, after 06:30 Berlin: Thursday and Friday are holidays, the
    // weekend no weekdays (a day off the calendar's own days is told as that first), so Monday 28th; then 29th, 30th, 31st, and Monday 4 January (1 January a
    // holiday, 2–3 a weekend).
    let fires = schedule.upcoming(t("2026-12-23T06:00:00Z"), 5);
    assert_eq!(
        fires,
        ["2026-12-28T05:30:00Z", "2026-12-29T05:30:00Z", "2026-12-30T05:30:00Z", "2026-12-31T05:30:00Z", "2027-01-04T05:30:00Z"].map(t)
    );
    let preview = schedule.preview(t("2026-12-23T06:00:00Z"), 5);
    assert_eq!(
        preview.skipped,
        [
            "2026-12-24 skipped: in calendar \"holidays\"",
            "2026-12-25 skipped: in calendar \"holidays\"",
            "2026-12-26 skipped: not a day of calendar \"business\" (Saturday)",
            "2026-12-27 skipped: not a day of calendar \"business\" (Sunday)",
            "2027-01-01 skipped: in calendar \"holidays\"",
            "2027-01-02 skipped: not a day of calendar \"business\" (Saturday)",
            "2027-01-03 skipped: not a day of calendar \"business\" (Sunday)",
        ]
    );
    // With shift: previous, the 25th's payroll fires on the business day before when the 25th
    // is not one (Christmas 2026: the 23rd), and the preview says so.
    let shifted = good
        .replace("cron: \"30 6 * * *\"", "cron: \"0 9 25 * *\"")
        .replace("calendar: business", "calendar: {name: business, shift: previous}");
    write(tmp.path(), "lamplighter.yaml", &shifted);
    let payday = load_with_env(&opts, |_| None).expect("loads").config.jobs["payroll"].schedule.clone().unwrap();
    assert_eq!(payday.upcoming(t("2026-12-01T00:00:00Z"), 2), ["2026-12-23T08:00:00Z", "2027-01-25T08:00:00Z"].map(t));
    assert_eq!(payday.preview(t("2026-12-01T00:00:00Z"), 1).skipped, ["2026-12-25 shifted to 2026-12-23: in calendar \"holidays\""]);
    assert!(config.jobs["payroll"].schedule.as_ref() != Some(&payday), "a shift is part of the schedule");
    // The same job on another calendar is another schedule (a reload replaces it).
    let other = good.replace("calendar: business", "calendar: holidays");
    write(tmp.path(), "lamplighter.yaml", &other);
    let reloaded = load_with_env(&opts, |_| None).expect("loads").config;
    assert_ne!(reloaded.jobs["payroll"].schedule, config.jobs["payroll"].schedule);
    assert_eq!(reloaded.jobs["payroll"].schedule.as_ref().unwrap().next_after(t("2026-12-23T06:00:00Z")), Some(t("2026-12-24T05:30:00Z")));

    let bad = "scheduling:\n  calendars:\n    business:\n      weekdays: [mon..fri, someday]\n      except: [holiday]\n    holidays:\n      dates: [\"2026-13-01\"]\n    loop-a:\n      except: [loop-b]\n    loop-b:\n      except: [loop-a]\n    from-file:\n      ics: holidays.ics\n    always: {}\n  jobs:\n    a:\n      type: plugin\n      plugin: file-save\n      action: save\n      cron: \"0 6 * * *\"\n      calendar: bussiness\n    b:\n      type: plugin\n      plugin: file-save\n      action: save\n      calendar: always\n    c:\n      type: plugin\n      plugin: file-save\n      action: save\n      every: 1h\n      calendar: holidays\n    d:\n      type: plugin\n      plugin: file-save\n      action: save\n      every: 1h\n      calendar: {name: always, shift: sideways}\n";
    write(tmp.path(), "lamplighter.yaml", bad);
    let errs = errors_of(tmp.path());
    let expected = [
        "lamplighter.yaml:4:7: error: calendar \"business\": weekday \"someday\" is not a day of the week",
        "lamplighter.yaml:5:7: error: calendar \"business\": excepts calendar \"holiday\", which scheduling.calendars does not define (did you mean \"holidays\"?)",
        "lamplighter.yaml:7:7: error: calendar \"holidays\": date \"2026-13-01\" is not a day",
        "lamplighter.yaml:9:7: error: calendar \"loop-a\": its except makes a cycle (loop-a → loop-b → loop-a)",
        "lamplighter.yaml:13:7: error: calendar \"from-file\": ics file ",
        "lamplighter.yaml:21:7: error: job \"a\": calendar \"bussiness\" is not one of scheduling.calendars (did you mean \"business\"?)",
        "lamplighter.yaml:26:7: error: job \"b\": a calendar keeps the days a schedule fires on, and this job has none",
        "lamplighter.yaml:32:7: error: job \"c\": calendar \"holidays\" cannot be used: it has errors of its own",
        "lamplighter.yaml:38:",
    ];
    for e in expected {
        assert!(errs.iter().any(|x| x.starts_with(e)), "missing {e:?} in:\n{}", errs.join("\n"));
    }
    assert!(
        errs.iter().any(|x| x.contains("job \"d\": calendar shift \"sideways\" is not previous or next; write shift: previous")),
        "{}",
        errs.join("\n")
    );
    assert!(errs.iter().any(|x| x.contains("holidays.ics cannot be read")), "{}", errs.join("\n"));
}

#[test]
fn an_ics_calendars_days_are_its_events_read_again_on_reload_and_its_mistakes_on_their_line() {
    let tmp = tempfile::tempdir().unwrap();
    let ics = |events: &str| format!("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//t//EN\r\n{events}END:VCALENDAR\r\n");
    let christmas = "BEGIN:VEVENT\r\nUID:x\r\nDTSTAMP:20260101T000000Z\r\nDTSTART;VALUE=DATE:20261225\r\nRRULE:FREQ=YEARLY;COUNT=5\r\nSUMMARY:Christmas Day\r\nEND:VEVENT\r\n";
    write(tmp.path(), "holidays.ics", &ics(christmas));
    let yaml = "scheduling:\n  calendars:\n    business:\n      weekdays: [mon..fri]\n      except: [holidays]\n    holidays:\n      ics: holidays.ics\n  jobs:\n    payroll:\n      type: plugin\n      plugin: file-save\n      action: save\n      cron: \"30 6 * * *\"\n      timezone: Europe/Berlin\n      calendar: business\n";
    write(tmp.path(), "lamplighter.yaml", yaml);
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let t = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&chrono::Utc);
    let first = load_with_env(&opts, |_| None).expect("loads").config.jobs["payroll"].schedule.clone().unwrap();
    assert_eq!(first.upcoming(t("2026-12-24T06:00:00Z"), 1), [t("2026-12-28T05:30:00Z")], "Christmas Friday, then a weekend");
    assert_eq!(first.preview(t("2026-12-24T06:00:00Z"), 1).skipped[0], "2026-12-25 skipped: in calendar \"holidays\" (Christmas Day)");
    assert_eq!(first.upcoming(t("2029-12-24T06:00:00Z"), 1), [t("2029-12-26T05:30:00Z")], "the rule's fourth year");
    // The file changes on disk: a reload reads it again, and the schedule is another one.
    let boxing = "BEGIN:VEVENT\r\nUID:y\r\nDTSTAMP:20260101T000000Z\r\nDTSTART;VALUE=DATE:20261228\r\nSUMMARY:Boxing Day (observed)\r\nEND:VEVENT\r\n";
    write(tmp.path(), "holidays.ics", &ics(&format!("{christmas}{boxing}")));
    let second = load_with_env(&opts, |_| None).expect("loads").config.jobs["payroll"].schedule.clone().unwrap();
    assert_ne!(first, second);
    assert_eq!(second.upcoming(t("2026-12-24T06:00:00Z"), 1), [t("2026-12-29T05:30:00Z")]);
    // A mistake in the file is told on its line, and where the config names the file.
    write(tmp.path(), "holidays.ics", &ics("BEGIN:VEVENT\r\nUID:z\r\nDTSTART;VALUE=DATE:20261232\r\nEND:VEVENT\r\n"));
    let errs = errors_of(tmp.path());
    assert!(
        errs.iter().any(|e| e.contains("holidays.ics:6:1: error: calendar \"holidays\": ics file")
            && e.contains("\"20261232\" is not an iCalendar date")),
        "{}",
        errs.join("\n")
    );
    assert!(
        errs.iter()
            .any(|e| e.starts_with("lamplighter.yaml:7:7: error: calendar \"holidays\": ics file") && e.contains("mistake on line 6")),
        "{}",
        errs.join("\n")
    );
    assert!(errs.iter().any(|e| e.contains("job \"payroll\": calendar \"business\" cannot be used")), "{}", errs.join("\n"));
}

#[test]
fn deadlines_default_from_scheduling_a_job_replaces_or_drops_them_and_mistakes_are_located() {
    let tmp = tempfile::tempdir().unwrap();
    let job = |name: &str, extra: &str| {
        format!("    {name}:\n      type: plugin\n      plugin: file-save\n      action: save\n      cron: \"0 2 * * *\"\n{extra}")
    };
    let good = format!(
        "scheduling:\n  deadline: {{start_within: 5m, finish_by: \"06:00\"}}\n  jobs:\n{}{}{}",
        job("etl", ""),
        job("report", "      deadline: {finish_within: 2h, on_miss: cancel}\n"),
        job("adhoc", "      deadline: {}\n")
    );
    write(tmp.path(), "lamplighter.yaml", &good);
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let config = load_with_env(&opts, |_| None).expect("loads").config;
    let etl = *config.jobs["etl"].deadline().expect("the default");
    assert_eq!(
        (etl.start_within, etl.finish_within, etl.finish_by, etl.on_miss),
        (Some(std::time::Duration::from_secs(300)), None, chrono::NaiveTime::from_hms_opt(6, 0, 0), lamplighter_config::OnMiss::Notify)
    );
    let report = *config.jobs["report"].deadline().expect("its own");
    assert_eq!(
        (report.start_within, report.finish_within, report.on_miss),
        (None, Some(std::time::Duration::from_secs(7200)), lamplighter_config::OnMiss::Cancel)
    );
    assert!(config.jobs["adhoc"].deadline().is_none(), "deadline: {{}} opts out of the default");

    let bad = format!(
        "scheduling:\n  deadline: {{start_within: soon}}\n  jobs:\n{}{}{}",
        job("a", "      deadline: {finish_by: \"6am\", on_miss: stop}\n"),
        job("b", "      deadline: {start_within: 1m, on_miss: cancel}\n"),
        job("c", "      deadline: {finish_within: 0s, start_in: 1m}\n")
    );
    write(tmp.path(), "lamplighter.yaml", &bad);
    let errs = errors_of(tmp.path());
    for e in [
        "scheduling.deadline: deadline start_within \"soon\" is not a duration",
        "job \"a\": deadline finish_by \"6am\" is not a local time of day; write it as \"HH:MM\"",
        "job \"a\": deadline on_miss \"stop\" is not notify or cancel",
        "job \"b\": deadline on_miss cancel stops a run past finish_within or finish_by, and this deadline has neither",
        "start_in",
    ] {
        assert!(errs.iter().any(|x| x.contains(e)), "missing {e:?} in:\n{}", errs.join("\n"));
    }
    assert!(errs.iter().all(|x| x.starts_with("lamplighter.yaml:")), "located: {}", errs.join("\n"));
}

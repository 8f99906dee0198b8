//! A job defined at runtime (as JSON, the same object as a job entry in YAML) goes through the
//! files' compiler against the config in force: errors all at once, each naming its field.

use std::path::Path;

use lamplighter_config::{Config, JobScope, LoadOptions, Target, compile_job, load_with_env};
use serde_json::json;

const CONFIG: &str = r#"
scheduling:
  timezone: Europe/Berlin
  jobs:
    from-a-file: {cron: "0 3 * * *", type: plugin, plugin: file-save, action: save}
workflows:
  news-digest:
    steps:
      - {id: fetch, type: plugin, plugin: file-read, action: read, parameters: {path: x}}
"#;

fn config(dir: &Path) -> Config {
    std::fs::write(dir.join("lamplighter.yaml"), CONFIG).unwrap();
    let opts = LoadOptions { path: Some(dir.join("lamplighter.yaml")), cwd: Some(dir.to_path_buf()), ..Default::default() };
    load_with_env(&opts, |_| None).unwrap_or_else(|e| panic!("{e}")).config
}

#[test]
fn a_good_definition_compiles_against_the_config_in_force() {
    let tmp = tempfile::tempdir().unwrap();
    let c = config(tmp.path());
    let compiled =
        compile_job(&JobScope::of(&c), "digest", &json!({"cron": "30 7 * * 1-5", "type": "workflow", "workflow": "news-digest"})).unwrap();
    assert_eq!(compiled.job.target, Target::Workflow("news-digest".into()));
    assert_eq!(compiled.job.timezone, "Europe/Berlin", "the zone defaults to scheduling.timezone");
    assert!(compiled.job.schedule.is_some());
    assert!(compiled.warnings.is_empty(), "{:?}", compiled.warnings);
    // The type is inferred from the one target given, as in YAML.
    let plugin = compile_job(&JobScope::of(&c), "save", &json!({"every": "15m", "plugin": "file-save", "action": "save"})).unwrap();
    assert_eq!(plugin.job.target, Target::Plugin { plugin: "file-save".into(), action: "save".into() });
}

#[test]
fn every_error_is_returned_at_once_naming_its_field() {
    let tmp = tempfile::tempdir().unwrap();
    let c = config(tmp.path());
    let cases: Vec<(serde_json::Value, Vec<&str>)> = vec![
        (json!({"cron": "30 7 * *", "workflow": "news-digest"}), vec!["cron: "]),
        (json!({"cron": "30 7 * * *", "timezone": "Berlin", "workflow": "news-digest"}), vec!["timezone: "]),
        (json!({"cron": "30 7 * * *", "workflow": "news-digst"}), vec!["workflow: "]),
        (json!({"cron": "30 7 * * *", "agent": "ghost"}), vec!["agent: "]),
        (json!({"cron": "nope", "workflow": "nope", "overlap": "sometimes"}), vec!["workflow: ", "cron: ", "overlap: "]),
        (json!({"crn": "30 7 * * *", "workflow": "news-digest"}), vec!["definition: unknown key \"crn\" (did you mean \"cron\"?)"]),
        // A value of the wrong type does not hide the other fields' errors.
        (
            json!({"cron": "61 * * * *", "timezone": "Europe/Berln", "workflow": "news-digst", "retries": {"max": -1, "backof": "fixed"}}),
            vec![
                "retries: unknown key \"backof\" (did you mean \"backoff\"?)",
                "retries.max: invalid value: integer `-1`, expected u32",
                "timezone: job \"j\": time zone \"Europe/Berln\" is not an IANA zone name (did you mean \"Europe/Berlin\"?)",
                "workflow: ",
                "cron: job \"j\": cron \"61 * * * *\": minute 61 is out of range 0–59",
            ],
        ),
        (json!("30 7 * * *"), vec!["definition: must be a job's entry"]),
        (json!(42), vec!["definition: must be a job's entry"]),
        (json!({"cron": "30 7 * * *"}), vec!["definition: job \"j\" needs \"type\""]),
        (json!({"every": "1m", "retries": {"max": 3, "backoff": "sometimes"}, "workflow": "news-digest"}), vec!["retries.backoff: "]),
    ];
    for (definition, fields) in cases {
        let errors = compile_job(&JobScope::of(&c), "j", &definition).err().unwrap_or_else(|| panic!("{definition} compiled"));
        assert_eq!(errors.len(), fields.len(), "{definition}: {errors:#?}");
        for field in fields {
            assert!(errors.iter().any(|e| e.starts_with(field)), "{definition}: no error starts with {field:?}: {errors:#?}");
        }
    }
    let named = compile_job(&JobScope::of(&c), "workflow:x", &json!({"every": "1m", "workflow": "news-digest"})).unwrap_err();
    assert!(named[0].starts_with("name: "), "{named:?}");
    let unknown = compile_job(&JobScope::of(&c), "j", &json!({"cron": "30 7 * * *", "workflow": "news-digst"})).unwrap_err();
    assert!(unknown[0].contains("did you mean \"news-digest\""), "{unknown:?}");
}

#[test]
fn a_definition_may_be_yaml_text_and_must_be_an_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let scope = JobScope::of(&config(tmp.path()));
    let yaml = "cron: \"30 7 * * 1-5\"\nworkflow: news-digest\n";
    let compiled = compile_job(&scope, "digest", &json!(yaml)).unwrap();
    assert_eq!(compiled.definition, json!({"cron": "30 7 * * 1-5", "workflow": "news-digest"}));
    assert_eq!(compiled.job.timezone, "Europe/Berlin");
    let list = compile_job(&scope, "digest", &json!([1, 2])).unwrap_err();
    assert_eq!(list.len(), 1);
    assert!(list[0].starts_with("definition: must be a job's entry (an object"), "{list:?}");
    assert!(list[0].ends_with("not an array"), "{list:?}");
}

#[test]
fn manage_jobs_is_off_by_default_and_checked_when_given() {
    let tmp = tempfile::tempdir().unwrap();
    let c = config(tmp.path());
    let m = &c.worker.manage_jobs;
    assert!(!m.enabled);
    assert_eq!((m.max_jobs, m.max_backfill, m.max_definition_bytes), (1000, 100, 65536));
    assert_eq!(m.working_directories, vec![c.data_dir.clone()]);
    let text = format!(
        "{CONFIG}worker:\n  mcp:\n    manage_jobs:\n      enabled: true\n      targets: [\"workflow:*\", \"shell:x\"]\n      max_jobs: 0\n      working_directories: [jobs]\n"
    );
    std::fs::write(tmp.path().join("lamplighter.yaml"), text).unwrap();
    let opts = LoadOptions { path: Some(tmp.path().join("lamplighter.yaml")), cwd: Some(tmp.path().to_path_buf()), ..Default::default() };
    let Err(err) = load_with_env(&opts, |_| None) else { panic!("a bad manage_jobs is refused") };
    let err = err.to_string();
    assert!(err.contains("worker.mcp.manage_jobs.targets: \"shell:x\" does not start with workflow:, agent: or plugin:"), "{err}");
    assert!(err.contains("worker.mcp.manage_jobs.max_jobs must be at least 1"), "{err}");
}

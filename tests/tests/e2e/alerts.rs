//! Alerts that outlive the worker: the shipped Prometheus rules pass their own unit tests
//! (`promtool test rules`), and fire on series scraped from a real worker's `/metrics` (a job
//! failing twice in a row; a job whose next fire time passes while the worker's scheduler is
//! taken to have stopped); every metric the shipped Grafana dashboard queries is one the worker
//! really exports.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lamplighter_tests::webhook::Receiver;

use crate::support::{Worker, http_get, now_ms, poll, repo_root};

fn promtool() -> &'static str {
    lamplighter_tests::setup::debian_packages(&["prometheus"], "the alert rule tests (promtool)", || {
        Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success())
    });
    "promtool"
}

/// `promtool ARGS` in `dir`: fails the test with what promtool said unless it succeeds.
fn run_promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool()).args(args).current_dir(dir).output().expect("promtool runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Prometheus's `humanizeDuration` for whole seconds of a minute or more.
fn humanize(secs: i64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h) {
        (0, 0) => format!("{m}m {s}s"),
        (0, _) => format!("{h}h {m}m {s}s"),
        _ => format!("{d}d {h}h {m}m {s}s"),
    }
}

/// The value of the series `name{job="…"}` in a scrape.
fn sample(scrape: &str, name: &str, job: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    scrape
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&format!("job=\"{job}\"")))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn the_rules_pass_their_tests_and_fire_on_a_real_workers_series_and_the_dashboard_queries_what_is_exported() {
    let rules_dir = repo_root().join("deploy/prometheus");
    run_promtool(&rules_dir, &["check", "rules", "lamplighter-rules.yml"]);
    let tested = run_promtool(&rules_dir, &["test", "rules", "tests.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // A worker with a job failing twice in a row, one due later, one running, one waiting for
    // a decision, a tick every few seconds, and a notification sent.
    let hook = Receiver::start();
    let jobs = format!(
        "failing:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  retries: {{max: 0}}\n  parameters: {{command: \"exit 1\"}}\n  notify: [{{on: failure, to: {{webhook: \"{}\"}}}}]\n\
         nightly:\n  cron: \"0 3 * * *\"\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {{command: \"true\"}}\n\
         tick:\n  every: 2s\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {{command: \"true\"}}\n\
         hold:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {{command: \"while [ ! -f go ]; do sleep 0.05; done\", timeout_seconds: 120}}\n\
         approve-me:\n  workflow: gated\n",
        hook.url("/hook")
    );
    let top = "workflows:\n  gated:\n    steps:\n      - id: gate\n        type: approval\n";
    let mut w = Worker::new("");
    w.write_full(top, &jobs, "");
    w.start();
    for args in [
        &["jobs", "trigger", "failing", "--wait"][..],
        &["jobs", "trigger", "failing", "--wait"],
        &["jobs", "trigger", "approve-me", "--wait"],
    ] {
        w.ctl(args);
    }
    let (code, _, err) = w.ctl(&["jobs", "trigger", "hold"]);
    assert_eq!(code, 0, "{err}");
    let metrics = |w: &Worker| http_get(w.port, "/metrics").map(|(_, body)| body).unwrap_or_default();
    let (scrape, scraped_at) = poll(
        "the per-job gauges in /metrics",
        Duration::from_secs(30),
        || {
            let body = metrics(&w);
            let ready = sample(&body, "lamplighter_job_consecutive_failures", "failing") == Some(2.0)
                && sample(&body, "lamplighter_job_oldest_running_age_seconds", "hold").is_some()
                && sample(&body, "lamplighter_job_oldest_approval_age_seconds", "approve-me").is_some()
                && sample(&body, "lamplighter_job_next_fire_timestamp_seconds", "nightly").is_some()
                && body.contains("lamplighter_notifications_total{event=\"failure\",outcome=\"delivered\"}")
                && body.contains("lamplighter_schedule_lateness_seconds_bucket");
            ready.then(|| (body, now_ms()))
        },
        || format!("{}\nlog:\n{}", metrics(&w), w.log()),
    );
    std::fs::write(w.dir.path().join("data/go"), "").unwrap();

    // The scraped series, fed to promtool. Its clock starts at 0: the scrape's instant is put
    // at 600 s and the next fire time moved by the same amount, so "overdue" keeps its meaning.
    let failures = sample(&scrape, "lamplighter_job_consecutive_failures", "failing").unwrap();
    let next_fire = sample(&scrape, "lamplighter_job_next_fire_timestamp_seconds", "nightly").unwrap();
    let ahead = (next_fire - scraped_at as f64 / 1000.0).round() as i64;
    assert!(ahead > 0 && ahead <= 86_400, "the next fire of a daily job is within a day: {ahead} s");
    let shifted = 600 + ahead;
    let minutes = (shifted + 300) / 60 + 3;
    let overdue_at = minutes * 60;
    let test = format!(
        r#"rule_files:
  - {rules}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'lamplighter_job_consecutive_failures{{job="failing", instance="w:1"}}'
        values: '{failures}x{n}'
      - series: 'lamplighter_job_next_fire_timestamp_seconds{{job="nightly", instance="w:1"}}'
        values: '{shifted}x{n}'
    alert_rule_test:
      - eval_time: 10m
        alertname: LamplighterJobOverdue
        exp_alerts: []
      - eval_time: {overdue_at}s
        alertname: LamplighterJobOverdue
        exp_alerts:
          - exp_labels: {{severity: critical, job: nightly}}
            exp_annotations:
              summary: "Job nightly has not fired: its tick is {late} overdue"
              description: "The worker answers but its scheduler did not process the tick (see lampctl status and the worker's log)."
      - eval_time: 10m
        alertname: LamplighterJobFailing
        exp_alerts:
          - exp_labels: {{severity: warning, job: failing}}
            exp_annotations:
              summary: "Job failing failed 2 times in a row"
              description: "See lampctl runs list --job failing --status failed"
"#,
        rules = rules_dir.join("lamplighter-rules.yml").display(),
        n = minutes + 5,
        late = humanize(overdue_at - shifted),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("scraped.yml"), test).unwrap();
    let tested = run_promtool(dir.path(), &["test", "rules", "scraped.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every metric the dashboard queries is exported (`# TYPE` names a histogram's base name).
    let exported: BTreeSet<&str> = scrape.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join("deploy/grafana/lamplighter.json")).unwrap()).unwrap();
    let mut queried = BTreeSet::new();
    let mut stack = vec![&dashboard];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v.as_str()) {
                        ("expr" | "query", Some(text)) => queried.extend(metric_names(text)),
                        _ => stack.push(v),
                    }
                }
            }
            serde_json::Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    assert!(queried.len() >= 10, "the dashboard queries the worker's metrics: {queried:?}");
    let missing: Vec<&String> = queried.iter().filter(|n| !exported.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "the dashboard queries metrics the worker does not export: {missing:?}\nexported: {exported:?}");
}

/// The `lamplighter_*` metric names a PromQL text uses (a histogram's series by its base name).
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("lamplighter_") {
        let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
        out.push(base.to_owned());
    }
    out
}

#[test]
fn metric_names_are_read_from_queries() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(lamplighter_run_duration_seconds_bucket{job=~\"$job\"}[5m]))) + lamplighter_queue_depth"
        ),
        ["lamplighter_run_duration_seconds", "lamplighter_queue_depth"]
    );
    assert_eq!(humanize(420), "7m 0s");
    assert_eq!(humanize(22_200), "6h 10m 0s");
}

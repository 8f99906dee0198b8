//! The contract between the worker and its clients, pinned on the real binaries: every tool's
//! input and output schema as `tools/list` serves it, and what `lampctl` prints (tables and
//! `-o json`) for answers the real worker gives, as snapshot files under `tests/snapshots/`.
//! Times, ids, the host and the worker's pid are replaced by placeholders; everything else
//! must match to the character (column alignment aside, which the table unit tests pin).

use std::collections::HashMap;
use std::time::Duration;

use lamplighter_tests::llm::{Reply, ScriptedLlm, tool_results};
use lamplighter_tests::snapshot::Snapshots;
use regex::Regex;
use serde_json::{Value, json};

use crate::support::{Worker, ctl_bin};

const JOBS: &str = "report:
  description: writes a report
  cron: \"0 3 * * *\"
  timezone: Europe/Berlin
  type: plugin
  plugin: file-save
  action: save
  parameters: { path: report.txt, content: hello }
adhoc:
  type: plugin
  plugin: shell-exec
  action: run
  parameters: { command: \"printf hi\" }
publish:
  type: workflow
  workflow: publish
bee:
  type: agent
  agent: writer
  input: write the note
";

fn top(llm: &ScriptedLlm) -> String {
    format!(
        "ai:
  default_model: default
  providers:
    scripted:
      base_url: {}
      models:
        default: {{id: scripted-model}}
agents:
  writer:
    description: writes notes
    plugins: [file-save]
workflows:
  publish:
    description: drafts, fans out, asks, publishes
    steps:
      - {{id: draft, type: plugin, plugin: shell-exec, action: run, parameters: {{command: \"printf draft\"}}}}
      - id: fan
        type: parallel
        steps:
          - {{id: left, type: plugin, plugin: file-save, action: save, parameters: {{path: left.txt, content: l}}}}
          - {{id: right, type: plugin, plugin: file-save, action: save, parameters: {{path: right.txt, content: r}}}}
      - id: gate
        type: approval
        input: \"Publish ${{steps.draft.output.stdout}}?\"
      - {{id: done, type: plugin, plugin: file-save, action: save, parameters: {{path: published.txt, content: done}}}}
",
        llm.base_url()
    )
}

/// Replaces what differs between runs (times, ids, host, pid, paths) with placeholders; the
/// same run id gets the same placeholder in every snapshot of the test.
struct Normalizer {
    literals: Vec<(String, &'static str)>,
    ids: HashMap<String, String>,
    rules: Vec<(Regex, &'static str)>,
    id: Regex,
}

impl Normalizer {
    fn new(w: &Worker) -> Self {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim().to_owned();
        let mut literals =
            vec![(w.dir.path().display().to_string(), "<dir>"), (w.port.to_string(), "<port>"), (w.pid().to_string(), "<pid>")];
        if !host.is_empty() {
            literals.push((host, "<host>"));
        }
        let rule = |re: &str, to: &'static str| (Regex::new(re).expect("a valid pattern"), to);
        let rules = vec![
            rule(r"<host>-<pid>-[0-9a-z]{6}", "<worker>"),
            rule(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", "<time>"),
            // An instant cut short inside a table cell.
            rule(r"\d{4}-\d{2}-\d{2}T[0-9:.]*…", "<time>…"),
            rule(
                r"((Mon|Tue|Wed|Thu|Fri|Sat|Sun) )?(\d{4}-\d{2}-\d{2} |[A-Z][a-z]{2} \d{2} )?\d{2}:\d{2}(:\d{2})?( [+-]\d{2}:\d{2})?",
                "<time>",
            ),
            rule(r"(?m)\b(in \d+[smhd]|\d+[smhd] ago)\b|\bnow$", "<rel>"),
            rule(r"\(now\)", "(<rel>)"),
            rule(r"\b\d+[smhd](\d+[smh])?( so far)?\b", "<dur>"),
            rule(r"\b\d+ ms\b", "<n> ms"),
        ];
        let id = Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").expect("a valid pattern");
        Self { literals, ids: HashMap::new(), rules, id }
    }

    fn text(&mut self, text: &str) -> String {
        let mut out = text.to_owned();
        for (literal, to) in &self.literals {
            out = out.replace(literal.as_str(), to);
        }
        let found: Vec<String> = self.id.find_iter(&out).map(|m| m.as_str().to_owned()).collect();
        for id in found {
            let n = self.ids.len() + 1;
            let label = self.ids.entry(id.clone()).or_insert_with(|| format!("<id-{n}>")).clone();
            out = out.replace(&id, &label);
        }
        for (re, to) in &self.rules {
            out = re.replace_all(&out, *to).into_owned();
        }
        out
    }

    /// A table: normalized, and runs of spaces made two (placeholders change the widths).
    fn table(&mut self, text: &str) -> String {
        let spaces = Regex::new(r"(\S) {2,}").expect("a valid pattern");
        self.text(text).lines().map(|l| format!("{}\n", spaces.replace_all(l, "$1  "))).collect()
    }

    /// JSON: each string normalized; numbers that are a pid, an uptime or a length in ms too.
    fn json(&mut self, text: &str) -> String {
        let mut value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"));
        self.walk(&mut value, "");
        format!("{}\n", serde_json::to_string_pretty(&value).expect("JSON"))
    }

    fn walk(&mut self, value: &mut Value, key: &str) {
        match value {
            Value::String(s) => *s = self.text(s),
            Value::Number(_) if key == "pid" || key == "uptime_seconds" || key.ends_with("_ms") => *value = Value::from("<n>"),
            Value::Array(items) => items.iter_mut().for_each(|v| self.walk(v, key)),
            Value::Object(map) => map.iter_mut().for_each(|(k, v)| self.walk(v, k)),
            _ => {}
        }
    }
}

/// `lampctl ARGS…` in UTC; asserts the exit code and returns stdout (or stderr when it failed).
fn lampctl(w: &Worker, args: &[&str], code: i32) -> String {
    let out = std::process::Command::new(ctl_bin())
        .arg("--url")
        .arg(w.url())
        .args(args)
        .env_remove("LAMPLIGHTER_URL")
        .env_remove("LAMPLIGHTER_TOKEN")
        .env("TZ", "UTC")
        .env("USER", "ana")
        .output()
        .expect("lampctl runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert_eq!(out.status.code(), Some(code), "lampctl {args:?}\nstdout: {stdout}\nstderr: {stderr}");
    if code == 0 { stdout } else { stderr }
}

/// One worker, the normalizer and the snapshots compared so far.
struct Session {
    w: Worker,
    n: Normalizer,
    snaps: Snapshots,
}

impl Session {
    /// `lampctl ARGS` as a table and with `-o json`, each against its snapshot.
    fn both(&mut self, name: &str, args: &[&str]) {
        self.table(name, args);
        let json_args: Vec<&str> = ["-o", "json"].iter().chain(args).copied().collect();
        let json = self.n.json(&lampctl(&self.w, &json_args, 0));
        self.snaps.check(&format!("{name}.json"), &json);
    }

    fn table(&mut self, name: &str, args: &[&str]) {
        let table = self.n.table(&lampctl(&self.w, args, 0));
        self.snaps.check(&format!("{name}.txt"), &table);
    }

    /// A command the worker refuses: exit 1, and the message on stderr.
    fn refused(&mut self, name: &str, args: &[&str]) {
        let message = self.n.text(&lampctl(&self.w, args, 1));
        self.snaps.check(&format!("{name}.txt"), &message);
    }

    /// `-o json` of `args`, as sent.
    fn json(&self, args: &[&str]) -> Value {
        let args: Vec<&str> = ["-o", "json"].iter().chain(args).copied().collect();
        serde_json::from_str(&lampctl(&self.w, &args, 0)).expect("JSON")
    }

    fn wait_for_run(&self, id: &str, status: &str) {
        self.w
            .wait_for(&format!("run {id} to be {status}"), Duration::from_secs(20), |r| r.iter().any(|r| r.id == id && r.status == status));
    }
}

/// Every command's table and JSON, in one session whose state each step builds on.
#[test]
fn lampctl_prints_what_the_snapshots_say_for_the_real_workers_answers() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let llm = rt.block_on(ScriptedLlm::start((7, 3), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("file-save__save".into(), json!({"path": "note.txt", "content": "a note"}).to_string())]),
        _ => Reply::Text("wrote the note".into()),
    }));
    let mut w = Worker::new("");
    w.write_full(&top(&llm), JOBS, "");
    w.start();
    let n = Normalizer::new(&w);
    let mut s = Session { w, n, snaps: Snapshots::in_dir("lampctl") };

    s.both("status", &["status"]);
    s.both("jobs-list", &["jobs", "list"]);
    s.both("jobs-show", &["jobs", "show", "report"]);
    s.both("jobs-next", &["jobs", "next", "report", "-n", "3"]);
    s.both("jobs-pause", &["jobs", "pause", "report", "--reason", "disk full"]);
    s.both("jobs-resume", &["jobs", "resume", "report"]);
    // A trigger is not repeated for the JSON: the table's and the JSON's each start a run.
    s.table("jobs-trigger", &["jobs", "trigger", "adhoc", "--idempotency-key", "k1"]);
    let json = s.n.json(&lampctl(&s.w, &["-o", "json", "jobs", "trigger", "adhoc", "--idempotency-key", "k0"], 0));
    s.snaps.check("jobs-trigger.json", &json);
    s.both("jobs-trigger-again", &["jobs", "trigger", "adhoc", "--idempotency-key", "k1"]);
    s.both("jobs-trigger-wait", &["jobs", "trigger", "report", "--param", "content=waited", "--wait", "--idempotency-key", "k2"]);
    let report_run = s.json(&["runs", "list", "--job", "report"])["runs"][0]["id"].as_str().expect("a run").to_owned();
    s.both("runs-show", &["runs", "show", &report_run]);

    // A workflow up to its approval, the approval, and the finished run with its step tree.
    let wf = s.json(&["workflows", "run", "publish"])["run_id"].as_str().expect("run_id").to_owned();
    s.wait_for_run(&wf, "waiting_approval");
    s.both("approvals-list", &["approvals", "list"]);
    s.table("approvals-approve", &["approvals", "approve", &wf, "--comment", "fine"]);
    s.wait_for_run(&wf, "succeeded");
    s.both("runs-show-workflow", &["runs", "show", &wf]);
    s.table("runs-follow-finished", &["runs", "follow", &wf]);

    // An agent run and its transcript.
    s.both("agent-trigger-wait", &["jobs", "trigger", "bee", "--wait", "--idempotency-key", "kb"]);
    let bee = s.json(&["runs", "list", "--job", "bee"])["runs"][0]["id"].as_str().expect("a run").to_owned();
    s.both("runs-show-transcript", &["runs", "show", &bee, "--transcript"]);

    s.both("runs-list", &["runs", "list"]);
    s.both("workflows-list", &["workflows", "list"]);
    s.both("agents-list", &["agents", "list"]);
    s.both("plugins-list", &["plugins", "list"]);
    s.both("config-reload", &["config", "reload"]);
    s.table("tools-list", &["tools", "list"]);
    s.refused("jobs-show-unknown", &["jobs", "show", "nope"]);
    s.refused("runs-cancel-finished", &["runs", "cancel", &report_run]);
    s.snaps.assert_all();
}

/// Every tool's name, description, annotations, input schema and output schema, as served by a
/// worker that lets clients manage jobs (so the job-changing tools are listed too).
#[test]
fn every_tool_schema_is_the_one_in_the_snapshot() {
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;

    let mut w = Worker::new("");
    w.write_config("", "manage_jobs: {enabled: true}");
    w.start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let tools = rt.block_on(async {
        let client = ().serve(StreamableHttpClientTransport::from_uri(w.url())).await.expect("connect");
        let tools = client.list_all_tools().await.expect("tools/list");
        let _ = client.cancel().await;
        tools
    });
    let mut snaps = Snapshots::in_dir("tools");
    for tool in &tools {
        let text = serde_json::to_string_pretty(&json!({
            "name": tool.name,
            "description": tool.description,
            "annotations": tool.annotations,
            "inputSchema": tool.input_schema,
            "outputSchema": tool.output_schema,
        }))
        .expect("JSON");
        snaps.check(&format!("{}.json", tool.name), &format!("{text}\n"));
    }
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    snaps.check("list.txt", &format!("{}\n", names.join("\n")));
    snaps.assert_all();
}

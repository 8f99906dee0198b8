//! Telemetry on the real binaries: a workflow run with a plugin step and an agent step
//! (scripted provider) reaches a real OTLP/HTTP receiver as one trace with the expected tree,
//! GenAI attributes and token counts; its metrics and logs arrive too; `GET /metrics` parses as
//! Prometheus text and changes with the run; `lampctl runs show` prints the trace id. With no
//! collector listening, runs are unaffected and the worker says so once per signal.

use std::collections::HashMap;
use std::time::Duration;

use lamplighter_tests::llm::{Reply, ScriptedLlm, tool_results};
use lamplighter_tests::otlp::{Receiver, Span};

use crate::support::{Worker, free_port, http_get, poll};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

/// A workflow `report` (a shell step, then an agent that saves a file) run by job `nightly`,
/// with telemetry sent to `collector`.
fn write_config(w: &Worker, llm: &ScriptedLlm, collector: &str) {
    let top = format!(
        "ai:\n  default_model: default\n  providers:\n    scripted:\n      base_url: {llm}\n      models:\n        default: {{id: scripted-model}}\n\
         agents:\n  writer:\n    plugins: [file-save]\n\
         workflows:\n  report:\n    steps:\n\
         \x20     - {{id: gather, type: plugin, plugin: shell-exec, action: run, parameters: {{command: \"echo data\"}}}}\n\
         \x20     - {{id: write, type: agent, agent: writer, input: \"${{steps.gather.output}}\"}}\n\
         telemetry:\n  enabled: true\n  service_name: lamplighter-e2e\n\
         \x20 traces: {{exporter: otlp, endpoint: \"{collector}\"}}\n\
         \x20 metrics: {{exporter: otlp, endpoint: \"{collector}\", export_interval_ms: 300}}\n\
         \x20 logs: {{exporter: otlp, endpoint: \"{collector}\"}}\n",
        llm = llm.base_url()
    );
    w.write_full(&top, "nightly:\n  type: workflow\n  workflow: report\n", "");
}

fn scripted(rt: &tokio::runtime::Runtime) -> ScriptedLlm {
    rt.block_on(ScriptedLlm::start((7, 3), |req| match tool_results(req) {
        0 => Reply::Tools(vec![("file-save__save".into(), r#"{"path": "report.md", "content": "all good"}"#.into())]),
        _ => Reply::Text("saved".into()),
    }))
}

/// Samples of `name` in a Prometheus text page, by their labels.
fn samples(page: &str, name: &str) -> Vec<(HashMap<String, String>, f64)> {
    let lines = page.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap_or_else(|e| panic!("not Prometheus text ({e}):\n{page}"));
    scrape
        .samples
        .into_iter()
        .filter(|s| s.metric == name)
        .map(|s| {
            let v = match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
                other => panic!("{name}: unexpected {other:?}"),
            };
            (s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(), v)
        })
        .collect()
}

fn metrics_page(w: &Worker) -> String {
    let (code, body) = http_get(w.port, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{body}");
    body
}

fn runs_total(page: &str, status: &str) -> Option<f64> {
    samples(page, "lamplighter_runs_total").into_iter().find(|(l, _)| l["job"] == "nightly" && l["status"] == status).map(|(_, v)| v)
}

#[test]
fn a_workflow_run_is_one_trace_with_genai_attributes_and_its_metrics_and_logs_arrive() {
    let rt = runtime();
    let otlp = rt.block_on(Receiver::start());
    let llm = scripted(&rt);
    let mut w = Worker::new("");
    write_config(&w, &llm, &otlp.base_url());
    // Spans and logs leave in batches; a short delay keeps the test quick.
    w.env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
    w.env.push(("OTEL_BLRP_SCHEDULE_DELAY".into(), "100".into()));
    w.start();

    let before = metrics_page(&w);
    assert_eq!(runs_total(&before, "succeeded"), None, "no run yet:\n{before}");

    let (code, out, err) = w.ctl(&["jobs", "trigger", "nightly", "--wait"]);
    assert_eq!(code, 0, "{out}{err}\n{}", w.log());
    let run = w.runs()[0].clone();
    assert_eq!(run.status, "succeeded", "{:?}", run.error);

    // The trace: every span of the run, parented as run → step → model call → tool call →
    // plugin action.
    let spans = poll(
        "the run's spans",
        Duration::from_secs(20),
        || {
            let spans = otlp.spans();
            (spans.iter().any(|s| s.name == "run nightly") && spans.len() >= 8).then_some(spans)
        },
        || format!("spans: {:#?}\nlog:\n{}", otlp.spans(), w.log()),
    );
    let one = |name: &str| -> Span {
        let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one span {name}: {spans:#?}");
        found[0].clone()
    };
    let root = one("run nightly");
    assert_eq!(root.parent_span_id, "", "the run is the root");
    assert_eq!(root.status, 1, "ok status: {root:?}");
    assert_eq!(root.service_name, "lamplighter-e2e");
    assert_eq!(root.attributes["lamplighter.run.id"], run.id);
    assert_eq!(root.attributes["lamplighter.run.status"], "succeeded");
    assert!(spans.iter().all(|s| s.trace_id == root.trace_id), "one trace: {spans:#?}");
    let gather = one("step gather");
    let write = one("step write");
    assert_eq!((gather.parent_span_id.as_str(), write.parent_span_id.as_str()), (root.span_id.as_str(), root.span_id.as_str()));
    assert_eq!(one("plugin shell-exec.run").parent_span_id, gather.span_id);
    let chats: Vec<&Span> = spans.iter().filter(|s| s.name == "chat scripted-model").collect();
    assert_eq!(chats.len(), 2, "two model calls: {spans:#?}");
    for chat in &chats {
        assert_eq!(chat.parent_span_id, write.span_id);
        let a = &chat.attributes;
        assert_eq!(
            (a["gen_ai.operation.name"].as_str(), a["gen_ai.request.model"].as_str(), a["gen_ai.provider.name"].as_str()),
            ("chat", "scripted-model", "scripted")
        );
        assert_eq!((a["gen_ai.usage.input_tokens"].as_str(), a["gen_ai.usage.output_tokens"].as_str()), ("7", "3"));
        assert_eq!(a["gen_ai.agent.name"], "writer");
        assert!(!a.contains_key("gen_ai.input.messages"), "no prompts without enable_sensitive_data: {a:?}");
    }
    let tool = one("execute_tool file-save.save");
    assert!(chats.iter().any(|c| c.span_id == tool.parent_span_id), "the tool call is a child of the model call that asked for it");
    assert_eq!(tool.attributes["gen_ai.tool.name"], "file-save.save");
    assert_eq!(one("plugin file-save.save").parent_span_id, tool.span_id);

    // The trace id is recorded on the run.
    let (code, out, _) = w.ctl(&["runs", "show", &run.id]);
    assert_eq!(code, 0);
    let trace_line = out.lines().find(|l| l.trim_start().starts_with("trace")).unwrap_or_else(|| panic!("no trace line:\n{out}"));
    assert!(trace_line.ends_with(&root.trace_id), "{trace_line} vs {}", root.trace_id);

    // Metrics, pushed.
    let point = |name: &str, want: &[(&str, &str)]| {
        otlp.points(name).into_iter().find(|p| want.iter().all(|(k, v)| p.attributes.get(*k).map(String::as_str) == Some(*v)))
    };
    // The run is counted as its work ends, and leaves the running gauge once its end is
    // written: an export between the two has the run counted and still running.
    poll(
        "the run's metrics, the run counted and no longer running",
        Duration::from_secs(20),
        || {
            point("lamplighter.runs", &[("job", "nightly"), ("status", "succeeded")])
                .filter(|p| p.value == 1.0)
                .filter(|_| point("lamplighter.runs.running", &[]).is_some_and(|p| p.value == 0.0))
        },
        || format!("metrics: {:?}, running: {:?}", otlp.metric_names(), point("lamplighter.runs.running", &[]).map(|p| p.value)),
    );
    assert_eq!(point("lamplighter.agent.tokens", &[("agent", "writer"), ("type", "input")]).map(|p| p.value), Some(14.0));
    assert_eq!(point("lamplighter.agent.tokens", &[("agent", "writer"), ("type", "output")]).map(|p| p.value), Some(6.0));
    let usage = point("gen_ai.client.token.usage", &[("gen_ai.token.type", "input"), ("gen_ai.request.model", "scripted-model")]);
    assert_eq!(usage.map(|p| (p.kind, p.value, p.sum)), Some(("histogram", 2.0, 14.0)), "two calls of 7 input tokens");
    for (plugin, action) in [("shell-exec", "run"), ("file-save", "save")] {
        let p = point("lamplighter.plugin.actions", &[("plugin", plugin), ("action", action), ("outcome", "succeeded")]);
        assert_eq!(p.map(|p| p.value), Some(1.0), "{plugin}.{action}");
    }
    assert_eq!(point("lamplighter.agent.tool_calls", &[("tool", "file-save.save"), ("outcome", "succeeded")]).map(|p| p.value), Some(1.0));
    for kind in ["plugin", "agent"] {
        let steps = point("lamplighter.workflow.steps", &[("workflow", "report"), ("step_type", kind), ("outcome", "succeeded")]);
        assert_eq!(steps.map(|p| p.value), Some(1.0), "{kind} step");
    }
    let duration = point("lamplighter.run.duration", &[("job", "nightly"), ("status", "succeeded")]).expect("run duration");
    assert_eq!(duration.kind, "histogram");
    assert!(duration.value == 1.0 && duration.sum > 0.0, "{duration:?}");
    assert!(point("lamplighter.mcp.requests", &[("tool", "trigger_job"), ("outcome", "ok")]).is_some_and(|p| p.value >= 1.0));
    assert!(point("lamplighter.queue.depth", &[]).is_some(), "queue depth sampled: {:?}", otlp.metric_names());

    // Logs, through the same pipeline.
    poll(
        "the run's log records",
        Duration::from_secs(20),
        || otlp.logs().iter().any(|l| l == "run finished").then_some(()),
        || format!("logs: {:?}", otlp.logs()),
    );

    // `/metrics` has the same numbers, in Prometheus text.
    let after = metrics_page(&w);
    assert_eq!(runs_total(&after, "succeeded"), Some(1.0), "{after}");
    let tokens = samples(&after, "lamplighter_agent_tokens_total");
    assert!(tokens.iter().any(|(l, v)| l["type"] == "input" && *v == 14.0), "{tokens:?}");
    assert!(after.contains("# TYPE lamplighter_run_duration_seconds histogram"), "{after}");
    assert!(after.contains("lamplighter_run_duration_seconds_bucket{job=\"nightly\",status=\"succeeded\",le=\"+Inf\"} 1"), "{after}");
    drop(rt);
}

#[test]
fn with_no_collector_runs_are_unaffected_and_the_worker_says_so_once_per_signal() {
    let rt = runtime();
    let llm = scripted(&rt);
    let mut w = Worker::new("");
    // Nothing listens there.
    write_config(&w, &llm, &format!("http://127.0.0.1:{}", free_port()));
    w.env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "50".into()));
    w.env.push(("OTEL_BLRP_SCHEDULE_DELAY".into(), "50".into()));
    w.start();
    for _ in 0..3 {
        let (code, out, err) = w.ctl(&["jobs", "trigger", "nightly", "--wait"]);
        assert_eq!(code, 0, "{out}{err}");
    }
    assert!(w.runs().iter().all(|r| r.status == "succeeded"), "{:#?}", w.runs());
    let warned = |log: &str, signal: &str| {
        log.lines().filter(|l| l.contains("cannot export telemetry") && l.contains(&format!("signal=\"{signal}\""))).count()
    };
    poll("a warning about traces", Duration::from_secs(10), || (warned(&w.log(), "traces") >= 1).then_some(()), || w.log());
    let log = w.log();
    let warned = |signal: &str| warned(&log, signal);
    assert_eq!(warned("traces"), 1, "rate-limited:\n{log}");
    assert!(warned("logs") <= 1 && warned("metrics") <= 1, "{log}");
    // A clean stop does not hang on the missing collector.
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0), "{}", w.log());
    drop(rt);
}

#[test]
fn validate_refuses_unknown_hook_plugins_and_an_otlp_protocol_it_cannot_speak_and_run_goes_on_without_export() {
    let mut w = Worker::new("");
    let job = "j:\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: {path: a.txt, content: b}\n";
    let telemetry = "telemetry:\n  enabled: true\n  traces: {exporter: otlp, endpoint: \"http://127.0.0.1:9\"}\n";
    w.write_full(
        &format!("hooks:\n  bindings:\n    - {{event: \"agent:*:model-call:before\", plugin: nope, hook: log}}\n{telemetry}"),
        job,
        "",
    );
    let validate = |w: &Worker| {
        let out = std::process::Command::new(crate::support::bin())
            .args(["config", "validate", "--config"])
            .arg(w.config_path())
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = validate(&w);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("hook binding \"agent:*:model-call:before\" names plugin \"nope\", which does not exist"), "{err}");
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_PROTOCOL: \"http/json\" is not built in: use http/protobuf (port 4318) or grpc (port 4317)"),
        "{err}"
    );

    // Without the bad binding, validate still refuses the protocol; a worker started with it
    // exports nothing, says why, and runs its jobs.
    w.write_full(telemetry, job, "");
    let (code, err) = validate(&w);
    assert_eq!(code, Some(2), "{err}");
    w.env.push(("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/json".into()));
    w.start();
    assert!(w.log().contains("telemetry export is disabled: OTEL_EXPORTER_OTLP_PROTOCOL: \"http/json\" is not built in"), "{}", w.log());
    let (code, out, err) = w.ctl(&["jobs", "trigger", "j", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read_to_string(w.dir.path().join("data/a.txt")).ok().as_deref(), Some("b"));
}

#[test]
fn traces_metrics_and_logs_go_over_grpc_to_a_real_receiver_and_logs_keep_their_minimum_level() {
    let rt = runtime();
    let otlp = rt.block_on(Receiver::start_grpc());
    let mut w = Worker::new("");
    let url = otlp.base_url();
    // Traces choose gRPC in the config; metrics and logs by the standard variable. The
    // misplaced `min_level` is a warning, logged at start: the one record at `warn` or above.
    let telemetry = format!(
        "telemetry:\n  enabled: true\n  service_name: over-grpc\n\
         \x20 traces: {{exporter: otlp, protocol: grpc, endpoint: \"{url}\", min_level: Debug}}\n\
         \x20 metrics: {{exporter: otlp, endpoint: \"{url}\", export_interval_ms: 600000}}\n\
         \x20 logs: {{exporter: otlp, endpoint: \"{url}\", min_level: Warning}}\n"
    );
    w.write_full(&telemetry, "j:\n  type: plugin\n  plugin: file-save\n  action: save\n  parameters: {path: a.txt, content: b}\n", "");
    w.env.push(("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "grpc".into()));
    w.env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
    w.env.push(("OTEL_BLRP_SCHEDULE_DELAY".into(), "100".into()));
    w.start();
    let (code, out, err) = w.ctl(&["jobs", "trigger", "j", "--wait"]);
    assert_eq!(code, 0, "{out}{err}");

    let spans = poll(
        "the run's span over gRPC",
        Duration::from_secs(20),
        || Some(otlp.spans()).filter(|s| s.iter().any(|s| s.name == "run j")),
        || format!("spans: {:#?}\nlog:\n{}", otlp.spans(), w.log()),
    );
    assert!(spans.iter().all(|s| s.service_name == "over-grpc"), "{spans:#?}");
    poll(
        "the start-up warning over gRPC",
        Duration::from_secs(20),
        || otlp.log_records().into_iter().find(|(_, body)| body.contains("telemetry.traces.min_level has no effect")),
        || format!("logs: {:?}\nlog:\n{}", otlp.log_records(), w.log()),
    );
    // Metrics are pushed every ten minutes here: none came yet. The worker flushes them at
    // exit, over gRPC, before its runtime stops.
    assert!(otlp.points("lamplighter.runs").is_empty(), "{:?}", otlp.metric_names());
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(15)), Some(0), "{}", w.log());
    let runs = otlp.points("lamplighter.runs");
    assert!(runs.iter().any(|p| p.attributes.get("status").map(String::as_str) == Some("succeeded")), "flushed at exit: {runs:?}");
    assert!(w.log().contains("run finished"), "the info record is in the worker's own log: {}", w.log());
    let records = otlp.log_records();
    assert!(records.iter().all(|(severity, _)| *severity >= 13), "only warn and above are exported: {records:?}");
    drop(rt);
}

/// Past OpenTelemetry's default of 2,000 series an instrument, every job still has its
/// per-job gauges: at `/metrics` (served from the worker's own table) and over OTLP (a
/// provider of their own, with room for many more).
#[test]
fn every_job_has_its_gauges_past_two_thousand_jobs_at_metrics_and_over_otlp() {
    const JOBS: usize = 2_500;
    let rt = runtime();
    let otlp = rt.block_on(Receiver::start());
    let mut w = Worker::new("");
    let url = otlp.base_url();
    let telemetry = format!(
        "telemetry:\n  enabled: true\n\
         \x20 traces: {{exporter: none}}\n\
         \x20 metrics: {{exporter: otlp, endpoint: \"{url}\", export_interval_ms: 300}}\n\
         \x20 logs: {{exporter: none}}\n"
    );
    let jobs: String = (0..JOBS)
        .map(|i| format!("j{i:04}:\n  cron: \"0 0 1 1 *\"\n  type: plugin\n  plugin: shell-exec\n  action: run\n  parameters: {{command: \"true\"}}\n"))
        .collect();
    w.write_full(&telemetry, &jobs, "");
    w.start();
    let now = crate::support::now_ms() as f64 / 1000.0;
    let all: std::collections::BTreeSet<String> = (0..JOBS).map(|i| format!("j{i:04}")).collect();
    // Each job once, and no other series.
    let every_job = |seen: &[(String, f64)]| {
        seen.len() == JOBS && seen.iter().map(|(j, _)| j.clone()).collect::<std::collections::BTreeSet<_>>() == all
    };

    let next_fires = poll(
        "a next fire time for every job at /metrics",
        Duration::from_secs(30),
        || {
            let page = metrics_page(&w);
            let seen: Vec<(String, f64)> = samples(&page, "lamplighter_job_next_fire_timestamp_seconds")
                .into_iter()
                .map(|(l, v)| (l.get("job").cloned().unwrap_or_default(), v))
                .collect();
            every_job(&seen).then_some((page, seen))
        },
        || {
            format!(
                "{} next fire series\nlog:\n{}",
                samples(&metrics_page(&w), "lamplighter_job_next_fire_timestamp_seconds").len(),
                w.log()
            )
        },
    );
    let (page, seen) = next_fires;
    let overflow = page.lines().filter(|l| l.starts_with("lamplighter_job_") && l.contains("otel_metric_overflow")).count();
    assert_eq!(overflow, 0, "no job's gauges summed into an overflow series");
    // Midnight of the next 1 January: no job runs while the test looks.
    assert!(seen.iter().all(|(_, v)| *v > now && *v <= now + 366.0 * 86_400.0), "each next fire is the next 1 January: {:?}", &seen[..3]);
    let failures = samples(&page, "lamplighter_job_consecutive_failures");
    assert_eq!(failures.len(), JOBS, "a failure count for every job");
    assert!(failures.iter().all(|(_, v)| *v == 0.0));

    let pushed = poll(
        "a next fire time for every job over OTLP",
        Duration::from_secs(30),
        || {
            let seen: Vec<(String, f64)> = otlp
                .points("lamplighter.job.next_fire.timestamp")
                .into_iter()
                .filter_map(|p| Some((p.attributes.get("job")?.clone(), p.value)))
                .collect();
            every_job(&seen).then_some(seen)
        },
        || format!("{} next fire points: {:?}", otlp.points("lamplighter.job.next_fire.timestamp").len(), otlp.metric_names()),
    );
    assert!(pushed.iter().all(|(_, v)| *v > now), "{:?}", &pushed[..3]);
    assert!(
        otlp.points("lamplighter.job.next_fire.timestamp").iter().all(|p| !p.attributes.contains_key("otel.metric.overflow")),
        "no overflow series over OTLP"
    );
    // Every export carries them whole, once: none capped, none in a second copy. Three more
    // exports (300 ms apart) after the first that had them all.
    let counts = |otlp: &Receiver| otlp.point_counts("lamplighter.job.next_fire.timestamp");
    let first_whole = counts(&otlp).len();
    poll(
        "three more exports",
        Duration::from_secs(20),
        || (counts(&otlp).len() >= first_whole + 3).then_some(()),
        || format!("{:?}", counts(&otlp)),
    );
    assert!(counts(&otlp).iter().all(|n| *n == JOBS), "each export's next fire points: {:?}", counts(&otlp));
    // The other metrics still go out beside them.
    poll(
        "the queue depth over OTLP",
        Duration::from_secs(20),
        || otlp.points("lamplighter.queue.depth").first().cloned(),
        || format!("{:?}", otlp.metric_names()),
    );
    drop(rt);
}

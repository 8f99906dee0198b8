//! The container shapes, `deploy/docker/Dockerfile` and `deploy/compose.yaml`, checked without
//! a container engine (this machine has a docker client only and cannot pull images):
//!
//! - both files lint clean (hadolint; docker-compose's own validation, offline);
//! - the image's command line (ENTRYPOINT + CMD), its config (the file the Dockerfile copies,
//!   with the compose file's conf.d mounted) and the compose file's environment for the worker
//!   run the real binary against what compose would start beside it: a throwaway PostgreSQL
//!   for `postgres`, a real OTLP/HTTP receiver for `otel-collector`. The HEALTHCHECK command
//!   answers as Docker would read it, `lampctl` controls the worker with the token, a workflow
//!   waits for and gets an approval, and telemetry arrives.
//!
//! Not checked here: that the image builds (base images come from a registry), and the
//! collector's own config beyond its OTLP receiver's port (no collector binary here).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use lamplighter_tests::otlp::Receiver;
use lamplighter_tests::pg::Cluster;
use lamplighter_tests::proc::{KillOnDrop, READY_LINE, spawn_until};
use serde_json::Value;

use crate::support::{bin, ctl_at, free_port, poll, repo_root};

/// `name → path` of the checking tools `.ci/deploy-tools.sh` installs (once per machine).
pub(crate) fn tool(name: &str) -> PathBuf {
    static TOOLS: OnceLock<BTreeMap<String, PathBuf>> = OnceLock::new();
    let tools = TOOLS.get_or_init(|| {
        let out = Command::new("bash").arg(repo_root().join(".ci/deploy-tools.sh")).output().expect("bash");
        assert!(out.status.success(), ".ci/deploy-tools.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), PathBuf::from(v))))
            .collect()
    });
    tools.get(name).cloned().unwrap_or_else(|| panic!(".ci/deploy-tools.sh does not provide {name}"))
}

/// (success, stdout + stderr).
fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn deploy() -> PathBuf {
    repo_root().join("deploy")
}

fn compose() -> serde_yaml::Value {
    serde_yaml::from_str(&std::fs::read_to_string(deploy().join("compose.yaml")).unwrap()).unwrap()
}

#[test]
fn the_dockerfile_and_the_compose_file_lint_clean() {
    let dockerfile = deploy().join("docker/Dockerfile");
    let (ok, out) = run(Command::new(tool("hadolint")).arg("--no-color").arg(&dockerfile));
    assert!(ok && out.trim().is_empty(), "hadolint:\n{out}");

    let compose_file = deploy().join("compose.yaml");
    let check = |token: Option<&str>| {
        let mut cmd = Command::new(tool("docker-compose"));
        cmd.arg("-f").arg(&compose_file).args(["config", "-q"]).env_remove("LAMPLIGHTER_TOKEN");
        if let Some(t) = token {
            cmd.env("LAMPLIGHTER_TOKEN", t);
        }
        run(&mut cmd)
    };
    let (ok, out) = check(Some("t0ken"));
    assert!(ok && out.trim().is_empty(), "docker-compose config:\n{out}");
    // Without a token compose refuses to start the worker, and says what to set.
    let (ok, out) = check(None);
    assert!(!ok && out.contains("set LAMPLIGHTER_TOKEN"), "{out}");

    // What the compose file mounts is in the repository.
    let c = compose();
    for service in ["lamplighter", "otel-collector"] {
        for volume in c["services"][service]["volumes"].as_sequence().unwrap() {
            let source = volume.as_str().unwrap().split(':').next().unwrap();
            if source.starts_with("./") {
                assert!(deploy().join(source).exists(), "{service} mounts {source}, which is not there");
            }
        }
    }
    // The collector listens where the worker sends.
    let endpoint = c["services"]["lamplighter"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"].as_str().unwrap().to_owned();
    let collector = std::fs::read_to_string(deploy().join("docker/otelcol.yaml")).unwrap();
    let collector: serde_yaml::Value = serde_yaml::from_str(&collector).unwrap();
    let listen = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].as_str().unwrap();
    let port = listen.rsplit(':').next().unwrap();
    assert_eq!(endpoint, format!("http://otel-collector:{port}"), "the worker exports where the collector does not listen");
}

/// What the Dockerfile says about running the image.
struct Image {
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    healthcheck: Vec<String>,
    env: BTreeMap<String, String>,
    /// `COPY src dest` of the final stage, by destination.
    copies: BTreeMap<String, String>,
}

impl Image {
    fn read() -> Image {
        let text = std::fs::read_to_string(deploy().join("docker/Dockerfile")).unwrap();
        let joined = text.replace("\\\n", " ");
        let last_stage = joined.rsplit("\nFROM ").next().unwrap();
        let exec = |json: &str| -> Vec<String> { serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("{json}: {e}")) };
        let mut image = Image { entrypoint: vec![], cmd: vec![], healthcheck: vec![], env: BTreeMap::new(), copies: BTreeMap::new() };
        for line in last_stage.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("ENTRYPOINT ") {
                image.entrypoint = exec(rest);
            } else if let Some(rest) = line.strip_prefix("CMD ") {
                image.cmd = exec(rest);
            } else if let Some(rest) = line.strip_prefix("HEALTHCHECK ") {
                image.healthcheck = exec(rest.split_once(" CMD ").unwrap().1);
            } else if let Some(rest) = line.strip_prefix("ENV ") {
                image.env.extend(rest.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())));
            } else if let Some(rest) = line.strip_prefix("COPY ").filter(|r| !r.starts_with("--from")) {
                let (src, dest) = rest.split_once(' ').unwrap();
                image.copies.insert(dest.trim().into(), src.trim().into());
            }
        }
        image
    }
}

/// `program` with `args`, the image's `lamplighter` replaced by the one built here.
fn command_of(argv: &[String]) -> Command {
    let mut cmd = Command::new(if argv[0] == "lamplighter" { bin() } else { PathBuf::from(&argv[0]) });
    cmd.args(&argv[1..]);
    cmd
}

#[test]
fn the_compose_worker_runs_from_the_images_command_line_config_and_healthcheck() {
    let image = Image::read();
    // tini is PID 1 in the image; here the test is the parent that reaps.
    assert_eq!(image.entrypoint[..2], ["tini", "--"], "{:?}", image.entrypoint);
    let argv: Vec<String> = image.entrypoint[2..].iter().chain(&image.cmd).cloned().collect();
    assert_eq!(argv[..2], ["lamplighter", "run"], "{argv:?}");
    assert_eq!(image.healthcheck[0], "lamplighter", "{:?}", image.healthcheck);
    let config_in_image = image.env.get("LAMPLIGHTER_CONFIG").expect("the image sets LAMPLIGHTER_CONFIG").clone();
    let config_source = image.copies.get(&config_in_image).expect("the Dockerfile copies the config it names");

    // Compose's worker service: its conf.d mount and environment.
    let c = compose();
    let service = &c["services"]["lamplighter"];
    let conf_d = service["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .find_map(|v| v.strip_suffix(":/etc/lamplighter/conf.d:ro"))
        .expect("compose mounts a conf.d");
    let env: BTreeMap<String, String> = service["environment"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_str().unwrap().to_owned()))
        .collect();

    // What compose starts beside it.
    let cluster = Cluster::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let receiver = rt.block_on(Receiver::start());
    let url = env["DATABASE_URL"].clone();
    assert!(url.contains("@postgres:5432/"), "{url}");
    rt.block_on(async {
        let admin = sqlx::PgPool::connect(&cluster.url()).await.unwrap();
        for sql in ["CREATE ROLE lamplighter LOGIN PASSWORD 'lamplighter'", "CREATE DATABASE lamplighter OWNER lamplighter"] {
            sqlx::query(sql).execute(&admin).await.unwrap();
        }
        admin.close().await;
    });

    let dir = tempfile::tempdir().unwrap();
    let (data, port) = (dir.path().join("data"), free_port());
    std::fs::create_dir(&data).unwrap();
    let config = std::fs::read_to_string(repo_root().join(config_source)).unwrap();
    for expected in ["/etc/lamplighter/conf.d/", "data_dir: /var/lib/lamplighter\n", "port: 5100\n"] {
        assert!(config.contains(expected), "the image's config no longer has {expected:?}");
    }
    let config = config
        .replace("/etc/lamplighter/conf.d/", &format!("{}/", deploy().join(conf_d).display()))
        .replace("data_dir: /var/lib/lamplighter\n", &format!("data_dir: {}\n", data.display()))
        .replace("port: 5100\n", &format!("port: {port}\n"));
    let config_path = dir.path().join("lamplighter.yaml");
    std::fs::write(&config_path, config).unwrap();

    let token = "t0ken-for-the-test";
    let start = |with_token: bool| {
        let mut cmd = command_of(&argv);
        cmd.current_dir(&data).env("LAMPLIGHTER_CONFIG", &config_path).env_remove("RUST_LOG").stdout(std::process::Stdio::null());
        for (k, v) in &env {
            let v = v
                .replace("@postgres:5432/", &format!("@127.0.0.1:{}/", cluster.port()))
                .replace("http://otel-collector:4318", &receiver.base_url());
            cmd.env(k, v);
        }
        if with_token {
            cmd.env("LAMPLIGHTER_TOKEN", token);
        } else {
            cmd.env_remove("LAMPLIGHTER_TOKEN");
        }
        cmd
    };
    let log = dir.path().join("worker.log");
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    // Without the token it does not start: it would listen on every interface without auth.
    let (ok, out) = run(&mut start(false));
    assert!(!ok && out.contains("LAMPLIGHTER_TOKEN"), "{out}");

    let healthcheck: Vec<String> = image.healthcheck.iter().map(|a| a.replace("127.0.0.1:5100", &format!("127.0.0.1:{port}"))).collect();
    assert_ne!(healthcheck, image.healthcheck, "the HEALTHCHECK no longer names port 5100");
    assert!(!run(&mut command_of(&healthcheck)).0, "healthy before the worker started");

    let mut child = KillOnDrop(spawn_until(&mut start(true), &log, READY_LINE, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}")));
    let (ok, out) = run(&mut command_of(&healthcheck));
    assert!(ok, "HEALTHCHECK failed on a running worker: {out}\n{}", logs());

    let mcp = format!("http://127.0.0.1:{port}/mcp");
    let ctl = |args: &[&str]| {
        let (code, out, err) = ctl_at(&mcp, Some(token), args);
        assert_eq!(code, 0, "lampctl {args:?}: {out}{err}\n{}", logs());
        serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("lampctl {args:?}: {e}: {out}"))
    };
    assert_eq!(ctl_at(&mcp, None, &["status"]).0, 3, "MCP answered without the token");
    assert_eq!(ctl(&["status", "-o", "json"])["storage"], "postgres");
    let jobs = ctl(&["jobs", "list", "-o", "json"]);
    assert_eq!(jobs["jobs"][0]["name"], "heartbeat", "{jobs}");

    // The example workflow waits for a person, then publishes.
    let run_id = ctl(&["workflows", "run", "publish", "-o", "json"])["run_id"].as_str().unwrap().to_owned();
    let status = |id: &str| ctl(&["runs", "show", id, "-o", "json"])["status"].as_str().unwrap_or_default().to_owned();
    poll("the workflow to wait for approval", Duration::from_secs(20), || (status(&run_id) == "waiting_approval").then_some(()), logs);
    ctl(&["approvals", "approve", &run_id, "-o", "json"]);
    poll("the workflow to succeed", Duration::from_secs(20), || (status(&run_id) == "succeeded").then_some(()), logs);
    poll("spans at the collector", Duration::from_secs(20), || (!receiver.spans().is_empty()).then_some(()), logs);

    assert!(Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap().success());
    assert_eq!(child.0.wait().unwrap().code(), Some(0), "{}", logs());
    let (ok, out) = run(&mut command_of(&healthcheck));
    assert!(!ok && out.contains("unhealthy"), "HEALTHCHECK passed on a stopped worker: {out}");
    drop(rt);
}

#[test]
fn the_healthcheck_refuses_what_it_cannot_ask() {
    let (code, err) = {
        let out = Command::new(bin()).args(["healthcheck", "--url", "https://127.0.0.1:5100/healthz"]).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("http://"), "{err}");
    // Something that is not the worker: answers, but not 200.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n");
    });
    let out = Command::new(bin()).args(["healthcheck", "--url", &format!("http://127.0.0.1:{port}/healthz")]).output().unwrap();
    server.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("answered 503"), "{}", String::from_utf8_lossy(&out.stderr));
}

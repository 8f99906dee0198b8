//! A worker reached from elsewhere: TLS in the worker with a CA made for the test (lampctl with
//! `--ca-cert` and through a context; without the CA, exit 3 naming it; mutual TLS; a renewed
//! certificate served after a reload without a restart), roles per token, and a non-loopback
//! listener that refuses to start unprotected.

use std::process::Command;
use std::time::Duration;

use lamplighter_tests::pki::Pki;
use serde_json::Value;

use crate::support::{Worker, ctl_bin, free_port, run_cli};

const JOB: &str =
    "report:\n  type: plugin\n  plugin: file-save\n  action: save\n  cron: \"0 3 * * *\"\n  parameters: {path: r.txt, content: r}";

const TOKENS: &str = "auth:\n  type: bearer\n  tokens:\n    - {name: dashboard, token: r34d-0nly-t0ken, role: read}\n    - {name: ops, token: 0per8-t0ken, role: operate}\n    - {name: admin, token: m4n4ge-t0ken, role: manage}\nmanage_jobs: {enabled: true}";

/// lampctl with `args` and `env`: (exit code, stdout, stderr).
fn lampctl(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(ctl_bin());
    cmd.env_remove("LAMPLIGHTER_URL").env_remove("LAMPLIGHTER_TOKEN").env("LAMPCTL_CONFIG", "/nonexistent/lampctl.yaml");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.args(args).output().expect("lampctl runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn https(w: &Worker) -> String {
    format!("https://localhost:{}/mcp", w.port)
}

/// A worker serving TLS with a certificate of `pki`, plus `extra` under `worker.mcp.tls`.
fn tls_worker(pki: &Pki, extra: &str) -> Worker {
    let w = Worker::new("");
    let (cert, key) = pki.server("server");
    let tls = format!("tls:\n  cert_file: {}\n  key_file: {}\n{extra}{TOKENS}", cert.display(), key.display());
    w.write_config(JOB, &tls);
    w
}

#[test]
fn lampctl_reaches_a_tls_worker_with_its_ca_and_through_a_context() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "one");
    let mut w = tls_worker(&pki, "");
    w.start_tls();
    let url = https(&w);
    let ca = pki.ca();
    let ca = ca.to_str().expect("path");

    let (code, out, err) = lampctl(&["--url", &url, "--ca-cert", ca, "--token", "0per8-t0ken", "jobs", "list"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("report"), "{out}");
    // Without the CA: the system's roots do not know it.
    let (code, _, err) = lampctl(&["--url", &url, "--token", "0per8-t0ken", "jobs", "list"], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("does not trust") && err.contains("the system's trusted CAs") && err.contains("--ca-cert"), "{err}");
    // Another CA: named in the message.
    let other = Pki::new(dir.path(), "other");
    let (code, _, err) = lampctl(&["--url", &url, "--ca-cert", other.ca().to_str().expect("path"), "status"], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("other-ca.pem (--ca-cert)"), "{err}");
    // Plain HTTP to a TLS listener does not get an answer it could take for the worker's: it
    // is told, in plain HTTP, to use https.
    let (code, _, err) = lampctl(&["--url", &format!("http://localhost:{}/mcp", w.port), "status"], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("this worker speaks https"), "{err}");
    let (status, body) = crate::support::http_get(w.port, "/readyz").expect("a plain answer");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains(&format!("this worker speaks https on port {}", w.port)), "{body}");

    // A context keeps it all; flags still win.
    let config = dir.path().join("lampctl.yaml");
    let env = [("LAMPCTL_CONFIG", config.to_str().expect("path"))];
    let (code, out, err) =
        lampctl(&["config", "set-context", "prod", "--url", &url, "--ca-cert", ca, "--token-command", "printf 0per8-t0ken"], &env);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = lampctl(&["jobs", "pause", "report"], &env);
    assert_eq!(code, 0, "through the current context: {out}{err}");
    let (code, out, _) = lampctl(&["config", "get-contexts"], &env);
    assert_eq!(code, 0);
    assert!(out.contains("*") && out.contains("prod") && out.contains("from `printf 0per8-t0ken`"), "{out}");
    let (code, _, err) = lampctl(&["--token", "r34d-0nly-t0ken", "jobs", "resume", "report"], &env);
    assert_eq!(code, 1, "the flag's read token wins over the context's: {err}");
    assert!(err.contains("needs the operate role; token dashboard has the read role"), "{err}");
    let (code, _, err) = lampctl(&["--context", "staging", "status"], &env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no context \"staging\"") && err.contains("contexts: prod"), "{err}");
    // A contexts file others may read is refused: it holds tokens.
    std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
    let (code, _, err) = lampctl(&["status"], &env);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("chmod 600"), "{err}");

    // /healthz, /readyz and /metrics are on the same TLS listener.
    let client = reqwest::blocking::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&std::fs::read(pki.ca()).expect("ca")).expect("pem")])
        .build()
        .expect("client");
    let health = client.get(format!("https://localhost:{}/readyz", w.port)).send().expect("readyz over TLS");
    assert_eq!(health.status(), 200);
    let metrics = client.get(format!("https://localhost:{}/metrics", w.port)).bearer_auth("r34d-0nly-t0ken").send().expect("metrics");
    assert_eq!(metrics.status(), 200);

    // A renewed certificate (here from another CA) is served after a reload, same process.
    let pid = w.pid();
    let (cert, key) = other.server("renewed");
    std::fs::copy(&cert, pki_file(&pki, "server.pem")).expect("replace cert");
    std::fs::copy(&key, pki_file(&pki, "server.key")).expect("replace key");
    let (code, out, err) = lampctl(&["--url", &url, "--ca-cert", ca, "--token", "m4n4ge-t0ken", "config", "reload"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) =
        lampctl(&["--url", &url, "--ca-cert", other.ca().to_str().expect("path"), "--token", "0per8-t0ken", "status"], &[]);
    assert_eq!(code, 0, "the renewed certificate is served: {err}");
    assert_eq!(w.pid(), pid);
    // A broken file on the next reload keeps the certificate in use.
    std::fs::write(pki_file(&pki, "server.pem"), "not a certificate").expect("break cert");
    let (code, _, _) =
        lampctl(&["--url", &url, "--ca-cert", other.ca().to_str().expect("path"), "--token", "m4n4ge-t0ken", "config", "reload"], &[]);
    assert_eq!(code, 1, "the reload is refused: the config names a file that does not hold a certificate");
    let (code, _, err) =
        lampctl(&["--url", &url, "--ca-cert", other.ca().to_str().expect("path"), "--token", "0per8-t0ken", "status"], &[]);
    assert_eq!(code, 0, "still served: {err}");
}

fn pki_file(pki: &Pki, name: &str) -> std::path::PathBuf {
    pki.ca().parent().expect("dir").join(name)
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "mtls");
    let mut w = tls_worker(&pki, &format!("  client_ca_file: {}\n", pki.ca().display()));
    w.start_tls();
    let (url, ca) = (https(&w), pki.ca());
    let ca = ca.to_str().expect("path");
    let (code, _, err) = lampctl(&["--url", &url, "--ca-cert", ca, "--token", "r34d-0nly-t0ken", "status"], &[]);
    assert_eq!(code, 3, "no client certificate: {err}");
    let with_certificate = |cert: &std::path::Path, key: &std::path::Path| {
        let (cert, key) = (cert.to_str().expect("path"), key.to_str().expect("path"));
        lampctl(&["--url", &url, "--ca-cert", ca, "--client-cert", cert, "--client-key", key, "--token", "r34d-0nly-t0ken", "status"], &[])
    };
    let (cert, key) = pki.client("laptop", "laptop");
    let (code, out, err) = with_certificate(&cert, &key);
    assert_eq!(code, 0, "{out}{err}");
    // A well-formed client certificate from a CA the worker does not name is no certificate.
    let foreign = Pki::new(dir.path(), "foreign");
    let (fcert, fkey) = foreign.client("intruder", "laptop");
    let (code, out, err) = with_certificate(&fcert, &fkey);
    assert_eq!(code, 3, "a certificate of a foreign CA: {out}{err}");
    let (code, _, err) = lampctl(&["--url", &url, "--client-cert", cert.to_str().expect("path"), "status"], &[]);
    assert_eq!(code, 2, "a certificate needs its key: {err}");
}

#[test]
fn each_token_sees_and_calls_only_what_its_role_allows_and_is_the_actor() {
    let mut w = Worker::new("");
    w.write_config(JOB, TOKENS);
    w.start();
    let url = w.url();
    let run = |token: &str, args: &[&str]| lampctl(&[&["--url", url.as_str(), "--token", token][..], args].concat(), &[]);
    let tools = |token: &str| -> Vec<String> {
        let (code, out, err) = run(token, &["-o", "json", "tools", "list"]);
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&out).expect("json");
        v["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str().map(str::to_owned)).collect()
    };
    let read = tools("r34d-0nly-t0ken");
    assert!(read.contains(&"list_jobs".to_owned()) && read.contains(&"get_run".to_owned()), "{read:?}");
    for write in [
        "pause_job",
        "trigger_job",
        "cancel_run",
        "approve_step",
        "create_job",
        "reload_config",
        "scheduler_trigger_job",
        "run_agent",
        "run_pipeline",
        "run_group_chat",
    ] {
        assert!(!read.contains(&write.to_owned()), "a read token lists {write}: {read:?}");
    }
    let operate = tools("0per8-t0ken");
    assert!(operate.contains(&"pause_job".to_owned()) && !operate.contains(&"create_job".to_owned()), "{operate:?}");
    assert!(tools("m4n4ge-t0ken").contains(&"create_job".to_owned()));

    let (code, _, err) = run("r34d-0nly-t0ken", &["jobs", "pause", "report"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("tool \"pause_job\" needs the operate role; token dashboard has the read role"), "{err}");
    let file = w.dir.path().join("def.yaml");
    std::fs::write(&file, "every: 1h\nplugin: file-save\naction: save\n").expect("write");
    let (code, _, err) = run("0per8-t0ken", &["jobs", "create", "extra", "-f", file.to_str().expect("path")]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("needs the manage role; token ops has the operate role"), "{err}");
    let (code, out, err) = run("m4n4ge-t0ken", &["jobs", "create", "extra", "-f", file.to_str().expect("path")]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, history, _) = run("r34d-0nly-t0ken", &["jobs", "history", "extra"]);
    assert_eq!(code, 0);
    assert!(history.contains("token admin"), "the token's name is the actor: {history}");
    // A run started by hand names who asked.
    let (code, out, err) = run("0per8-t0ken", &["-o", "json", "jobs", "trigger", "report", "--wait"]);
    assert_eq!(code, 0, "{err}");
    let started: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(started["run"]["requested_by"], "token ops", "{out}");
    let (code, out, _) = run("r34d-0nly-t0ken", &["runs", "show", started["run_id"].as_str().expect("run id")]);
    assert_eq!(code, 0);
    assert!(out.contains("requested by:  token ops") || out.contains("requested by: token ops"), "{out}");
    let (code, _, err) = run("wrong", &["status"]);
    assert_eq!(code, 3, "{err}");
    assert!(!w.log().contains("m4n4ge-t0ken") && !w.log().contains("r34d-0nly-t0ken"), "tokens never reach the log");
}

/// A refused request whose body the worker did not read is answered with `Connection: close`:
/// the worker will not read that connection again, and a client that reuses it for its retry
/// (an OAuth client always retries a 401, with its new token) would be cut off.
#[test]
fn a_refusal_before_the_body_is_read_tells_the_client_the_connection_closes() {
    use std::io::{Read, Write};
    let mut w = Worker::new("");
    w.write_config(JOB, TOKENS);
    w.start();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", w.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    // The head alone, as a client that writes its body in a second write; no token.
    let port = w.port;
    write!(s, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n", INIT.len())
        .expect("write the head");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).expect("the answer's head"), 1, "the head ends: {}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 401"), "{head}");
    assert!(head.contains("\r\nconnection: close\r\n"), "the client is told the connection closes: {head}");
    // And it does: the rest of the answer, then the end of the stream.
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("the connection closes, not hangs");
    assert!(String::from_utf8_lossy(&rest).contains("Authorization: Bearer"), "{}", String::from_utf8_lossy(&rest));
}

/// `initialize` at an older revision: the smallest call that passes the guard in front of `/mcp`.
const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;

#[test]
fn off_loopback_the_worker_starts_only_with_auth_and_tls_and_names_each_missing_piece() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "edge");
    let (cert, key) = pki.server("server");
    let tls = format!("tls: {{cert_file: {}, key_file: {}}}\n", cert.display(), key.display());
    let auth = "auth: {type: bearer, token: s3cret-t0ken}\n";
    let mut w = Worker::new("");
    let off_loopback = |w: &Worker, mcp: &str| w.write_config(JOB, &format!("host: 0.0.0.0\n{mcp}"));

    // Each missing piece is refused by `run` itself, named with its fix, before storage opens.
    let refused = [
        ("", "refusing to listen on 0.0.0.0 without auth and without TLS", ["worker.mcp.auth", "worker.mcp.tls"]),
        (auth, "refusing to listen on 0.0.0.0 without TLS", ["worker.mcp.tls (cert_file and key_file)", "terminated_by_proxy: true"]),
        (tls.as_str(), "refusing to listen on 0.0.0.0 without auth;", ["worker.mcp.auth (type: bearer or oauth)", "listen on 127.0.0.1"]),
    ];
    for (mcp, why, fixes) in refused {
        off_loopback(&w, mcp);
        let (code, _, err) = run_with_timeout(&w);
        assert_eq!(code, 2, "{mcp:?}: {err}");
        assert!(err.contains(why) && fixes.iter().all(|f| err.contains(f)), "{mcp:?}: {err}");
        assert!(!w.db().exists(), "{mcp:?}: a refused start opens no storage");
        // `config validate` says the same, so a deploy is stopped before the restart.
        let (code, out, verr) = run_cli(&["config", "validate", "--config", w.config_path().to_str().expect("path")], w.dir.path());
        assert_eq!(code, 2, "{mcp:?}: {out}{verr}");
        assert!(verr.contains(why), "{mcp:?}: {verr}");
    }

    // Auth and TLS in the worker: it starts on every interface and answers only the token.
    off_loopback(&w, &format!("{tls}{auth}"));
    w.start_tls();
    assert!(w.log().contains(&format!("listen=0.0.0.0:{}", w.port)), "{}", w.log());
    let ca = pki.ca();
    let url = https(&w);
    let with = |token: &[&str]| {
        let mut args = vec!["--url", url.as_str(), "--ca-cert", ca.to_str().expect("path")];
        args.extend_from_slice(token);
        args.extend(["jobs", "list"]);
        lampctl(&args, &[])
    };
    let (code, out, err) = with(&["--token", "s3cret-t0ken"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("report"), "{out}");
    let (code, _, err) = with(&[]);
    assert_eq!(code, 3, "no token: {err}");
    w.signal("TERM");
    assert_eq!(w.wait_exit(Duration::from_secs(20)), Some(0));

    // Auth behind a TLS-terminating proxy, stated: it starts on every interface, plain HTTP,
    // and answers the proxy's host name with the token only.
    off_loopback(&w, &format!("{auth}tls: {{terminated_by_proxy: true}}\nallowed_hosts: [lamplighter.example]\n"));
    w.start();
    assert!(w.log().contains(&format!("listen=0.0.0.0:{}", w.port)), "{}", w.log());
    let proxied = [("Host", "lamplighter.example"), ("X-Forwarded-Proto", "https")];
    assert_eq!(crate::support::mcp_post(w.port, &proxied, INIT).0, 401, "no token");
    let mut with_token = proxied.to_vec();
    with_token.push(("Authorization", "Bearer s3cret-t0ken"));
    assert_eq!(crate::support::mcp_post(w.port, &with_token, INIT).0, 200, "the token, through the proxy's name");
    let mut foreign = with_token.clone();
    foreign[0] = ("Host", "elsewhere.example");
    assert_eq!(crate::support::mcp_post(w.port, &foreign, INIT).0, 403, "a host name not allowed");
    let (code, out, err) = crate::support::ctl_at(&w.url(), Some("s3cret-t0ken"), &["jobs", "list"]);
    assert_eq!(code, 0, "{out}{err}");
}

/// `lamplighter run` that is expected to refuse to start: its exit code and output.
fn run_with_timeout(w: &Worker) -> (i32, String, String) {
    let child = Command::new(crate::support::bin())
        .args(["run", "--config"])
        .arg(w.config_path())
        .current_dir(w.dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    // Its exit is the event: waited for on a thread, for at most 20 s.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => {
            let out = out.expect("output");
            (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
        }
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("the worker did not refuse to start");
        }
    }
}

/// nginx, from Debian's package (installed on first use), as README "Control a remote worker"
/// configures it: TLS ends at nginx, which streams `/mcp` to a worker on loopback.
struct Nginx {
    _master: Reaped,
    port: u16,
}

impl Nginx {
    fn start(dir: &std::path::Path, cert: &std::path::Path, key: &std::path::Path, upstream: u16) -> Nginx {
        lamplighter_tests::setup::debian_packages(&["nginx"], "the reverse-proxy test", || {
            std::path::Path::new("/usr/sbin/nginx").exists()
        });
        let port = free_port();
        let conf = dir.join("nginx.conf");
        // The `location /mcp` block is the README's, word for word.
        let text = format!(
            "user root;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  server {{\n    listen 127.0.0.1:{port} ssl;\n    ssl_certificate {cert};\n    ssl_certificate_key {key};\n{block}  }}\n}}\n",
            d = dir.display(),
            cert = cert.display(),
            key = key.display(),
            block = README_NGINX.replace("127.0.0.1:5100", &format!("127.0.0.1:{upstream}")),
        );
        std::fs::write(&conf, text).expect("write nginx.conf");
        let child = Command::new("/usr/sbin/nginx")
            .args(["-c", conf.to_str().expect("path"), "-p", dir.to_str().expect("path"), "-g", "daemon off;"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nginx starts");
        let n = Nginx { _master: Reaped(child), port };
        crate::support::poll(
            "nginx to listen",
            Duration::from_secs(10),
            || std::net::TcpStream::connect(("127.0.0.1", port)).ok().map(|_| ()),
            || std::fs::read_to_string(dir.join("error.log")).unwrap_or_default(),
        );
        n
    }
}

/// The `location` block README.md gives for nginx (a test reads it from there).
const README_NGINX: &str = include_str!("../../../deploy/nginx/lamplighter.conf");

#[test]
fn through_nginx_a_wait_and_a_follow_stream_to_the_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "proxy");
    let (cert, key) = pki.server("nginx");
    let mut w = Worker::new("");
    let slow = format!(
        "{JOB}\nslow:\n  type: plugin\n  plugin: shell-exec\n  action: run\n  every: 24h\n  parameters: {{command: \"sleep 2; echo done\"}}"
    );
    w.write_config(&slow, "tls: {terminated_by_proxy: true}\nauth: {type: bearer, token: pr0xy-t0ken}");
    w.start();
    let nginx = Nginx::start(dir.path(), &cert, &key, w.port);
    let url = format!("https://localhost:{}/mcp", nginx.port);
    let ca = pki.ca();
    let base = ["--url", url.as_str(), "--ca-cert", ca.to_str().expect("path"), "--token", "pr0xy-t0ken"];
    let (code, out, err) = lampctl(&[&base[..], &["-o", "json", "jobs", "trigger", "slow", "--wait"]].concat(), &[]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["run"]["status"], "succeeded", "{out}");
    let (code, out, err) = lampctl(&[&base[..], &["-o", "json", "jobs", "trigger", "slow"]].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    let id = serde_json::from_str::<Value>(&out).expect("json")["run_id"].as_str().expect("run id").to_owned();
    let (code, out, err) = lampctl(&[&base[..], &["runs", "follow", &id]].concat(), &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(": running") && out.contains("succeeded after"), "follows the run to its end:\nstdout: {out}\nstderr: {err}");
}

/// A process stopped (SIGTERM) and reaped when dropped: SIGTERM lets nginx's master stop its
/// workers, which SIGKILL would leave running.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}

/// The third shape: the worker stays on loopback, plain HTTP, and lampctl reaches it through an
/// SSH tunnel (a real sshd from Debian's package, on loopback, with keys made for the test).
#[test]
fn through_an_ssh_tunnel_a_loopback_worker_is_reached_as_if_local() {
    lamplighter_tests::setup::debian_packages(&["openssh-server", "openssh-client"], "the SSH tunnel test", || {
        std::path::Path::new("/usr/sbin/sshd").exists() && std::path::Path::new("/usr/bin/ssh").exists()
    });
    assert!(lamplighter_tests::setup::is_root(), "the SSH tunnel test runs sshd as root (as CI does)");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let keygen = |file: &str| {
        let out = Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(d.join(file)).output().expect("ssh-keygen");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    keygen("host_key");
    keygen("client_key");
    std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).expect("authorized_keys");
    std::fs::create_dir_all("/run/sshd").expect("sshd's privilege separation folder");
    let ssh_port = free_port();
    let config = format!(
        "Port {ssh_port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\nStrictModes no\nAllowTcpForwarding local\nPidFile {d}/sshd.pid\n",
        d = d.display()
    );
    std::fs::write(d.join("sshd_config"), config).expect("sshd_config");
    let _sshd = Reaped(
        Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sshd"),
    );
    crate::support::poll(
        "sshd to listen",
        Duration::from_secs(10),
        || std::net::TcpStream::connect(("127.0.0.1", ssh_port)).ok().map(|_| ()),
        String::new,
    );

    let mut w = Worker::new("");
    w.write_config(JOB, "auth: {type: bearer, token: tunn3l-t0ken}");
    w.start();
    let local = free_port();
    let _tunnel = Reaped(
        Command::new("ssh")
            .args([
                "-N",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "ExitOnForwardFailure=yes",
                "-i",
            ])
            .arg(d.join("client_key"))
            .args(["-p", &ssh_port.to_string(), "-L", &format!("127.0.0.1:{local}:127.0.0.1:{}", w.port), "root@127.0.0.1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("ssh"),
    );
    crate::support::poll(
        "the tunnel to open",
        Duration::from_secs(15),
        || std::net::TcpStream::connect(("127.0.0.1", local)).ok().map(|_| ()),
        String::new,
    );
    let url = format!("http://127.0.0.1:{local}/mcp");
    let (code, out, err) = lampctl(&["--url", &url, "--token", "tunn3l-t0ken", "-o", "json", "jobs", "trigger", "report", "--wait"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).expect("json")["run"]["status"], "succeeded", "{out}");
}

//! The worker as an OAuth 2.1 resource server (SPEC §8a) against a real OpenID provider: npm
//! `oidc-provider` (OpenID Certified) on loopback, with the official Python MCP SDK's OAuth
//! client doing the whole flow a hosted assistant does (401 → protected-resource metadata →
//! authorization-server metadata → registration → authorization code with PKCE, the redirect
//! followed headlessly → token → tool calls), and its client-credentials client as a machine.
//! Refused: another audience, an expired or not-yet-valid token, another issuer, a key the
//! issuer does not publish, a read scope pausing.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Worker, ctl_at, repo_root};

/// The provider, killed with the test (it also exits when its stdin closes).
struct Provider {
    child: Child,
    /// Its first line: issuer, the machine client's credentials, …
    info: Value,
    /// The issuer's RSA signing key (kid `rsa-1`) as PKCS#8 PEM.
    rsa_pem: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Provider {
    fn start(alg: &str, dir: &std::path::Path) -> Provider {
        let modules = lamplighter_tests::setup::oidc_provider();
        let keys = dir.join("issuer-key.json");
        let mut child = Command::new(modules.join("node"))
            .arg(repo_root().join("tests/clients/oidc_provider.mjs"))
            .arg("--modules")
            .arg(&modules)
            .args(["--alg", alg, "--keys-out"])
            .arg(&keys)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("the provider's first line");
        let info: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("the provider's line is not JSON ({e}): {line:?}"));
        let key: Value = serde_json::from_str(&std::fs::read_to_string(&keys).expect("the exported key")).expect("key JSON");
        Provider { child, info, rsa_pem: key["pem"].as_str().expect("pem").to_string() }
    }

    fn issuer(&self) -> &str {
        self.info["issuer"].as_str().expect("issuer")
    }

    /// `mcp_oauth.py`'s arguments for the machine client (client credentials), then `extra`.
    /// The secret is given as `--client-secret=…`: a random one may begin with `-`, which
    /// argparse would take for an option.
    fn machine(&self, extra: &[&str]) -> Vec<String> {
        let id = self.info["machine"]["client_id"].as_str().expect("client_id");
        let secret = self.info["machine"]["client_secret"].as_str().expect("client_secret");
        let mut args: Vec<String> = vec!["client_credentials".into(), "--client-id".into(), id.into()];
        args.push(format!("--client-secret={secret}"));
        args.extend(["--issuer", self.issuer()].into_iter().chain(extra.iter().copied()).map(str::to_owned));
        args
    }

    /// A token signed with the issuer's own RSA key, with `claims` over good defaults.
    fn sign(&self, audience: &str, claims: Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(self.rsa_pem.as_bytes()).expect("the issuer's key");
        sign(&key, jsonwebtoken::Algorithm::RS256, "rsa-1", &self.defaults(audience, claims))
    }

    fn defaults(&self, audience: &str, claims: Value) -> Value {
        let now = chrono::Utc::now().timestamp();
        let mut c = json!({"iss": self.issuer(), "aud": audience, "sub": "mallory@example.test", "iat": now, "exp": now + 600,
                           "scope": "lamplighter:read lamplighter:operate"});
        for (k, v) in claims.as_object().expect("claims") {
            c[k] = v.clone();
        }
        c
    }
}

fn sign(key: &jsonwebtoken::EncodingKey, alg: jsonwebtoken::Algorithm, kid: &str, claims: &Value) -> String {
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.into());
    header.typ = Some("at+jwt".into());
    jsonwebtoken::encode(&header, claims, key).expect("sign")
}

/// An Ed25519 key the issuer never published (PKCS#8 DER: the fixed prefix, then the seed).
fn rogue_ed25519() -> jsonwebtoken::EncodingKey {
    let mut der = vec![0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    der.extend([7u8; 32]);
    jsonwebtoken::EncodingKey::from_ed_der(&der)
}

fn oauth_worker(issuer: &str, jobs: &str) -> Worker {
    let mut w = Worker::new("");
    let auth = format!(
        "auth:\n  type: oauth\n  oauth: {{issuer: \"{issuer}\", audience: \"http://127.0.0.1:{}/mcp\", token_audiences: [app-1234]}}\n  tokens:\n    - {{name: ci, token: s3cret, role: manage}}\n",
        w.port
    );
    w.write_config(jobs, &auth);
    w.start();
    w
}

/// The SDK's OAuth client against the worker: one JSON line per call, then the last line.
fn sdk<S: AsRef<std::ffi::OsStr>>(w: &Worker, args: &[S]) -> (Vec<Value>, Value, i32) {
    let out = Command::new(lamplighter_tests::setup::python_mcp())
        .arg(repo_root().join("tests/clients/mcp_oauth.py"))
        .args(&args[..1])
        .arg(w.url())
        .args(&args[1..])
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{stdout}"))).collect();
    let last = lines.pop().unwrap_or_else(|| panic!("no output; stderr:\n{}\nworker:\n{}", String::from_utf8_lossy(&out.stderr), w.log()));
    (lines, last, out.status.code().unwrap_or(-1))
}

/// A raw JSON-RPC call to `/mcp` with `token`: (status, `WWW-Authenticate`, body).
fn post(w: &Worker, token: Option<&str>, body: Value) -> (u16, String, String) {
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let mut req = client
        .post(w.url())
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", body["method"].as_str().unwrap_or_default())
        .header("Mcp-Name", body["params"]["name"].as_str().unwrap_or_default())
        .json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().expect("the worker answers");
    let challenge = r.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    (r.status().as_u16(), challenge, r.text().unwrap_or_default())
}

fn call(tool: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args,
           "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
}

const JOB: &str =
    "nightly:\n  type: plugin\n  plugin: file-save\n  action: save\n  cron: \"0 3 * * *\"\n  parameters: {path: n.txt, content: n}";

#[test]
fn a_hosted_assistant_signs_in_and_a_machine_uses_client_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let idp = Provider::start("RS256", tmp.path());
    let w = oauth_worker(idp.issuer(), JOB);
    let audience = w.url();
    let metadata_url = format!("http://127.0.0.1:{}/.well-known/oauth-protected-resource/mcp", w.port);

    // The metadata, at its path form and at the root, before any token.
    for path in ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"] {
        let (code, body) = crate::support::http_get(w.port, path).expect("metadata");
        assert_eq!(code, 200, "{path}: {body}");
        let m: Value = serde_json::from_str(body.split("\r\n\r\n").last().unwrap_or(&body)).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(m["resource"], json!(audience), "{m}");
        assert_eq!(m["authorization_servers"], json!([idp.issuer()]));
        assert_eq!(m["scopes_supported"], json!(["lamplighter:read", "lamplighter:operate", "lamplighter:manage"]));
    }
    // No token: 401 naming where the metadata is.
    let (code, challenge, _) = post(&w, None, call("list_jobs", json!({})));
    assert_eq!(code, 401);
    assert!(challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")), "{challenge}");

    // The assistant: the whole authorization-code flow, then a read and a trigger.
    let (calls, last, exit) = sdk(&w, &["code", "--call", "list_jobs", "{}", "--call", "trigger_job", r#"{"name": "nightly"}"#]);
    assert_eq!((exit, &last["done"]), (0, &json!(true)), "{last}\nworker:\n{}", w.log());
    assert_eq!(last["token_claims"]["sub"], "alice@example.test");
    assert_eq!(last["token_claims"]["aud"], json!(audience));
    assert_eq!(calls[0]["is_error"], json!(false), "{}", calls[0]);
    assert!(calls[0]["text"].as_str().unwrap().contains("nightly"), "the model reads the jobs in the text: {}", calls[0]);
    assert_eq!(calls[1]["is_error"], json!(false), "{}", calls[1]);
    // The subject is the actor recorded on the run.
    let run_id = calls[1]["structured"]["run_id"].as_str().expect("run_id");
    let (code, out, err) = ctl_at(&audience, Some("s3cret"), &["--output", "json", "runs", "show", run_id]);
    assert_eq!(code, 0, "{out}{err}");
    let run: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(run["requested_by"], "oauth alice@example.test", "{run}");

    // A user who granted only reading: the read works, the pause is refused as 403 naming the
    // scope it needs, and the job stays unpaused.
    let (calls, last, exit) =
        sdk(&w, &["code", "--scope", "lamplighter:read", "--call", "list_jobs", "{}", "--call", "pause_job", r#"{"name": "nightly"}"#]);
    assert_eq!(exit, 0, "{last}");
    assert_eq!(last["token_claims"]["scope"], "lamplighter:read");
    assert_eq!(calls[0]["is_error"], json!(false), "{}", calls[0]);
    assert_eq!(calls[1]["status"], json!(403), "{}", calls[1]);

    // A machine with client credentials, reading only.
    let id = idp.info["machine"]["client_id"].as_str().unwrap();
    let (calls, last, exit) = sdk(
        &w,
        &idp.machine(&[
            "--scope",
            "lamplighter:read",
            "--call",
            "get_job",
            r#"{"name": "nightly"}"#,
            "--call",
            "pause_job",
            r#"{"name": "nightly"}"#,
        ]),
    );
    assert_eq!(exit, 0, "{last}");
    assert_eq!(last["token_claims"]["sub"], json!(id));
    assert_eq!(calls[0]["is_error"], json!(false), "{}", calls[0]);
    assert_eq!(calls[1]["status"], json!(403), "{}", calls[1]);
    // A token the provider issued for another audience: refused, and the flow fails.
    let (_, last, exit) = sdk(&w, &idp.machine(&["--resource", "http://127.0.0.1:1/other"]));
    assert_ne!(exit, 0, "{last}");
    assert_eq!(last["status"], json!(401), "{last}");

    let (code, out, err) = ctl_at(&audience, Some("s3cret"), &["jobs", "show", "nightly"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.to_lowercase().contains("paused"), "no refused pause went through: {out}");
    // The static token beside OAuth still serves lampctl.
    let (code, out, err) = ctl_at(&audience, Some("s3cret"), &["jobs", "list"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("nightly"), "{out}");
}

#[test]
fn tokens_that_are_not_for_this_worker_are_refused_each_for_its_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let idp = Provider::start("RS256", tmp.path());
    let w = oauth_worker(idp.issuer(), JOB);
    let aud = w.url();
    let now = chrono::Utc::now().timestamp();
    let list = || call("list_jobs", json!({}));

    // The control: a token as the issuer would make it is accepted.
    let good = idp.sign(&aud, json!({}));
    let (code, _, body) = post(&w, Some(&good), list());
    assert_eq!(code, 200, "{body}\n{}", w.log());
    assert!(body.contains("nightly"), "{body}");

    // Entra ID's shape: an application id as `aud` (accepted by `token_audiences`), an app-only
    // token's permissions in `roles`.
    let entra = idp.sign("app-1234", json!({"scope": null, "roles": ["lamplighter:read"]}));
    let (code, _, body) = post(&w, Some(&entra), list());
    assert_eq!(code, 200, "{body}");

    let refused = [
        (idp.sign("http://127.0.0.1:1/other", json!({})), "the token is for another audience (aud)"),
        (idp.sign(&aud, json!({"exp": now - 3600, "iat": now - 7200})), "the token has expired"),
        (idp.sign(&aud, json!({"nbf": now + 3600})), "the token is not valid yet (nbf)"),
        (idp.sign(&aud, json!({"iss": "http://127.0.0.1:1"})), "the token is from another issuer (iss)"),
        (
            sign(&rogue_ed25519(), jsonwebtoken::Algorithm::EdDSA, "rogue-1", &idp.defaults(&aud, json!({}))),
            "a key the issuer does not publish",
        ),
        // A published kid, the wrong key behind it.
        (sign(&rogue_ed25519(), jsonwebtoken::Algorithm::EdDSA, "ed-1", &idp.defaults(&aud, json!({}))), "signature does not verify"),
        ("not-a-jwt".to_string(), "neither one of worker.mcp.auth.tokens nor an access token (a JWT)"),
    ];
    for (token, why) in refused {
        let (code, challenge, body) = post(&w, Some(&token), list());
        assert_eq!(code, 401, "{why}: {body}");
        assert!(body.contains(why), "wanted {why:?} in {body:?}");
        assert!(challenge.contains("error=\"invalid_token\"") && challenge.contains("resource_metadata="), "{challenge}");
    }

    // A read scope pausing: 403 naming the scope that would do it, the job not paused.
    let reader = idp.sign(&aud, json!({"scope": "openid lamplighter:read"}));
    let (code, challenge, body) = post(&w, Some(&reader), call("pause_job", json!({"name": "nightly"})));
    assert_eq!(code, 403, "{body}");
    assert!(challenge.contains("error=\"insufficient_scope\", scope=\"lamplighter:operate\""), "{challenge}");
    assert!(body.contains("tool \"pause_job\" needs the scope \"lamplighter:operate\""), "{body}");
    let (code, _, body) = post(&w, Some(&reader), call("get_job", json!({"name": "nightly"})));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"paused\":false") || !body.contains("\"paused\":true"), "{body}");
    // None of this worker's scopes at all: 403 naming the read scope.
    let stranger = idp.sign(&aud, json!({"scope": "openid profile"}));
    let (code, challenge, _) = post(&w, Some(&stranger), list());
    assert_eq!(code, 403);
    assert!(challenge.contains("scope=\"lamplighter:read\""), "{challenge}");
}

/// ES256 and EdDSA tokens as the provider signs them, for a machine client.
#[test]
fn elliptic_curve_and_edwards_signatures_are_accepted() {
    for alg in ["ES256", "EdDSA"] {
        let tmp = tempfile::tempdir().unwrap();
        let idp = Provider::start(alg, tmp.path());
        let w = oauth_worker(idp.issuer(), JOB);
        let (calls, last, exit) = sdk(&w, &idp.machine(&["--call", "pause_job", r#"{"name": "nightly"}"#]));
        assert_eq!(exit, 0, "{alg}: {last}\n{}", w.log());
        assert_eq!(calls[0]["is_error"], json!(false), "{alg}: {}", calls[0]);
        assert_eq!(calls[0]["structured"]["paused"], json!(true), "{alg}: {}", calls[0]);
    }
}

//! lampctl's contexts, as kubectl keeps them: named workers (URL, token or a command that prints
//! it, CA, client certificate) in `$XDG_CONFIG_HOME/lampctl/config.yaml` (`$LAMPCTL_CONFIG`
//! overrides the path), one of them current. The file holds tokens, so lampctl refuses to read
//! it while others may, and writes it with mode 0600. Flags win over environment variables,
//! which win over the context.
//!
//! The file is YAML of one shape (`current_context: NAME`, then `contexts:` with a map of
//! settings per name), read by the small reader below rather than a YAML library: lampctl stays
//! small (SPEC §12), and anything outside that shape is refused naming its line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cli::DEFAULT_URL;
use crate::client::Connection;
use crate::error::{CtlError, Failure};

/// The file.
#[derive(Debug, Default, PartialEq, Eq)]
struct File {
    current_context: Option<String>,
    contexts: BTreeMap<String, Context>,
}

/// One worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Context {
    pub(crate) url: Option<String>,
    pub(crate) token: Option<String>,
    /// A shell command whose output is the token (e.g. `pass show lamplighter/prod`), run when
    /// the context is used.
    pub(crate) token_command: Option<String>,
    pub(crate) ca_cert: Option<PathBuf>,
    pub(crate) client_cert: Option<PathBuf>,
    pub(crate) client_key: Option<PathBuf>,
}

/// The settings of a context, as the file names them.
const SETTINGS: [&str; 6] = ["url", "token", "token_command", "ca_cert", "client_cert", "client_key"];

impl Context {
    fn set(&mut self, key: &str, value: String) -> bool {
        match key {
            "url" => self.url = Some(value),
            "token" => self.token = Some(value),
            "token_command" => self.token_command = Some(value),
            "ca_cert" => self.ca_cert = Some(value.into()),
            "client_cert" => self.client_cert = Some(value.into()),
            "client_key" => self.client_key = Some(value.into()),
            _ => return false,
        }
        true
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let values = [
            self.url.clone(),
            self.token.clone(),
            self.token_command.clone(),
            path(&self.ca_cert),
            path(&self.client_cert),
            path(&self.client_key),
        ];
        SETTINGS.into_iter().zip(values).filter_map(|(k, v)| Some((k, v?))).collect()
    }
}

/// Reads the file's one shape: `current_context: NAME`, and `contexts:` with, indented, each
/// name and, indented again, its settings as `key: value` (values plain, or quoted as YAML
/// quotes them). Comments and blank lines are skipped.
fn parse(text: &str) -> Result<File, String> {
    let mut file = File::default();
    let mut in_contexts = false;
    let mut current: Option<String> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end();
        let content = line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = line.len() - content.len();
        let (key, value) = content.split_once(':').ok_or_else(|| format!("line {n}: expected `key: value`"))?;
        let key = scalar(key.trim()).map_err(|e| format!("line {n}: {e}"))?;
        let value = value.trim();
        match (indent, in_contexts, current.is_some()) {
            (0, _, _) => {
                current = None;
                match key.as_str() {
                    "current_context" => {
                        file.current_context = Some(scalar(value).map_err(|e| format!("line {n}: {e}"))?).filter(|v| !v.is_empty());
                        in_contexts = false;
                    }
                    "contexts" if value.is_empty() || value == "{}" => in_contexts = true,
                    other => return Err(format!("line {n}: unknown key \"{other}\"; the file has current_context and contexts")),
                }
            }
            (_, true, _) if value.is_empty() || value == "{}" => {
                file.contexts.entry(key.clone()).or_default();
                current = Some(key);
            }
            (_, true, true) => {
                let name = current.as_ref().expect("checked");
                let v = scalar(value).map_err(|e| format!("line {n}: {e}"))?;
                if !file.contexts.entry(name.clone()).or_default().set(&key, v) {
                    return Err(format!("line {n}: unknown setting \"{key}\"; a context has {}", SETTINGS.join(", ")));
                }
            }
            _ => return Err(format!("line {n}: expected a context's name under `contexts:`, or its settings under that")),
        }
    }
    Ok(file)
}

/// A scalar as YAML writes one: plain, `'single'` (with `''` for a quote) or `"double"` (JSON's
/// escapes).
fn scalar(v: &str) -> Result<String, String> {
    if let Some(inner) = v.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        return Ok(inner.replace("''", "'"));
    }
    if v.starts_with('"') {
        return serde_json::from_str::<String>(v).map_err(|e| format!("a quoted value that does not read: {e}"));
    }
    // A plain scalar ends where a comment starts.
    let plain = match v.find(" #") {
        Some(i) => v[..i].trim_end(),
        None => v,
    };
    Ok(plain.to_owned())
}

/// The file as YAML that [`parse`] (and any YAML reader) reads back; every value double-quoted.
fn render(file: &File) -> String {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let mut out = String::from("# lampctl contexts (lampctl config set-context / use-context); mode 0600: it holds tokens.\n");
    if let Some(c) = &file.current_context {
        out.push_str(&format!("current_context: {}\n", q(c)));
    }
    out.push_str("contexts:\n");
    for (name, ctx) in &file.contexts {
        out.push_str(&format!("  {}:\n", q(name)));
        for (k, v) in ctx.settings() {
            out.push_str(&format!("    {k}: {}\n", q(&v)));
        }
    }
    out
}

fn usage(message: String) -> CtlError {
    CtlError::new(Failure::Usage, message)
}

/// Where the file is.
pub(crate) fn path() -> PathBuf {
    if let Some(p) = std::env::var_os("LAMPCTL_CONFIG").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("lampctl").join("config.yaml")
}

/// The file, or none when there is none. Refused while group or others may read it.
fn load(path: &Path) -> Result<Option<File>, CtlError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(usage(format!("cannot read {}: {e}", path.display()))),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
        if mode & 0o077 != 0 {
            return Err(usage(format!(
                "{} may be read by others (mode {mode:o}) and it holds tokens; run: chmod 600 {}",
                path.display(),
                path.display()
            )));
        }
    }
    parse(&text).map(Some).map_err(|e| usage(format!("{}: {e}", path.display())))
}

/// Writes the file whole, mode 0600, through a temporary file beside it.
fn save(path: &Path, file: &File) -> Result<(), CtlError> {
    let local = |e: std::io::Error| CtlError::new(Failure::Local, format!("cannot write {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(local)?;
    }
    let text = render(file);
    let tmp = path.with_extension("yaml.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options.open(&tmp).map_err(local)?;
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(local)?;
    drop(f);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(local)?;
    }
    std::fs::rename(&tmp, path).map_err(local)
}

/// What the command line gave (`given`), completed from the context named (or the current
/// one): each setting from a flag or the environment wins over the context's.
pub(crate) fn resolve(given: Connection, context: Option<&str>) -> Result<Connection, CtlError> {
    let path = path();
    let file = load(&path)?;
    let named = context.map(str::to_owned).or_else(|| file.as_ref().and_then(|f| f.current_context.clone()));
    let ctx = match (&named, &file) {
        (None, _) => Context::default(),
        (Some(name), Some(f)) => match f.contexts.get(name) {
            Some(c) => c.clone(),
            None => return Err(no_context(name, f, &path)),
        },
        (Some(name), None) => {
            return Err(usage(format!(
                "no context \"{name}\": {} does not exist; add one with lampctl config set-context",
                path.display()
            )));
        }
    };
    // An empty $LAMPLIGHTER_TOKEN means no token, not an empty one.
    let token = match given.token.filter(|t| !t.trim().is_empty()) {
        Some(t) => Some(t),
        None => match (&ctx.token, &ctx.token_command) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(cmd)) => Some(token_from(cmd, named.as_deref().unwrap_or_default())?),
            (None, None) => None,
        },
    };
    Ok(Connection {
        url: Some(given.url).filter(|u| !u.is_empty()).or(ctx.url).unwrap_or_else(|| DEFAULT_URL.to_owned()),
        token,
        ca_cert: given.ca_cert.or(ctx.ca_cert),
        // A client certificate goes with its key: both from the command line, or both from the context.
        client_cert: if given.client_cert.is_some() { given.client_cert } else { ctx.client_cert },
        client_key: if given.client_key.is_some() { given.client_key } else { ctx.client_key },
    })
}

fn no_context(name: &str, f: &File, path: &Path) -> CtlError {
    let known: Vec<&str> = f.contexts.keys().map(String::as_str).collect();
    let known = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
    usage(format!("no context \"{name}\" in {}; contexts: {known}", path.display()))
}

/// The token a context's `token_command` prints (its last line ending trimmed).
#[allow(clippy::disallowed_methods, reason = "the user's own command for their token, run in the foreground")]
fn token_from(command: &str, context: &str) -> Result<String, CtlError> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| usage(format!("context \"{context}\": cannot run its token_command: {e}")))?;
    if !out.status.success() {
        return Err(usage(format!("context \"{context}\": its token_command failed ({})", out.status)));
    }
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if token.is_empty() {
        return Err(usage(format!("context \"{context}\": its token_command printed no token")));
    }
    Ok(token)
}

/// `config use-context NAME`.
pub(crate) fn use_context(name: &str) -> Result<String, CtlError> {
    let path = path();
    let mut file = load(&path)?.unwrap_or_default();
    if !file.contexts.contains_key(name) {
        return Err(no_context(name, &file, &path));
    }
    file.current_context = Some(name.to_owned());
    save(&path, &file)?;
    Ok(format!("using context \"{name}\"\n"))
}

/// `config get-contexts`: name, whether current, URL, how it authenticates.
pub(crate) fn get_contexts() -> Result<String, CtlError> {
    let path = path();
    let Some(file) = load(&path)? else {
        return Ok(format!("no contexts ({} does not exist); add one with lampctl config set-context NAME --url URL\n", path.display()));
    };
    let mut table = crate::render::Table::new(&["CURRENT", "NAME", "URL", "TOKEN", "CA"]);
    for (name, c) in &file.contexts {
        let auth = match (&c.token, &c.token_command) {
            (Some(_), _) => "stored".to_owned(),
            (None, Some(cmd)) => format!("from `{cmd}`"),
            (None, None) => crate::render::NONE.to_owned(),
        };
        table.push(vec![
            if file.current_context.as_deref() == Some(name) { "*".to_owned() } else { String::new() },
            name.clone(),
            c.url.clone().unwrap_or_else(|| DEFAULT_URL.to_owned()),
            auth,
            c.ca_cert.as_ref().map_or_else(|| crate::render::NONE.to_owned(), |p| p.display().to_string()),
        ]);
    }
    Ok(table.render())
}

/// `config set-context NAME …`: creates the context or changes the settings given; the first
/// context made becomes the current one.
pub(crate) fn set_context(name: &str, set: Context) -> Result<String, CtlError> {
    if name.trim().is_empty() {
        return Err(usage("a context needs a name".to_owned()));
    }
    if set.token.is_some() && set.token_command.is_some() {
        return Err(usage("give --token or --token-command, not both".to_owned()));
    }
    let path = path();
    let mut file = load(&path)?.unwrap_or_default();
    let entry = file.contexts.entry(name.to_owned()).or_default();
    let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    if let Some(u) = set.url {
        entry.url = Some(u);
    }
    if let Some(t) = set.token {
        entry.token = Some(t);
        entry.token_command = None;
    }
    if let Some(c) = set.token_command {
        entry.token_command = Some(c);
        entry.token = None;
    }
    if let Some(p) = set.ca_cert {
        entry.ca_cert = Some(abs(p));
    }
    if let Some(p) = set.client_cert {
        entry.client_cert = Some(abs(p));
    }
    if let Some(p) = set.client_key {
        entry.client_key = Some(abs(p));
    }
    if file.current_context.is_none() {
        file.current_context = Some(name.to_owned());
    }
    save(&path, &file)?;
    Ok(format!("context \"{name}\" saved in {}\n", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_reads_back_what_it_writes_and_hand_written_yaml() {
        let mut file = File { current_context: Some("prod".into()), contexts: BTreeMap::new() };
        file.contexts.insert(
            "prod".into(),
            Context {
                url: Some("https://w.example:5100/mcp".into()),
                token: Some("t: 'x\" #".into()),
                ca_cert: Some("/etc/ca.pem".into()),
                ..Default::default()
            },
        );
        file.contexts.insert("dev".into(), Context { token_command: Some("pass show ll/dev".into()), ..Default::default() });
        assert_eq!(parse(&render(&file)), Ok(file));
        let hand = "# mine\ncurrent_context: dev\ncontexts:\n  dev:\n    url: http://127.0.0.1:5100/mcp  # local\n    token: 'it''s'\n  empty: {}\n";
        let read = parse(hand).expect("reads");
        assert_eq!(read.current_context.as_deref(), Some("dev"));
        assert_eq!(read.contexts["dev"].url.as_deref(), Some("http://127.0.0.1:5100/mcp"));
        assert_eq!(read.contexts["dev"].token.as_deref(), Some("it's"));
        assert!(read.contexts.contains_key("empty"));
        assert_eq!(
            parse("contexts:\n  a:\n    passwd: x\n").unwrap_err(),
            "line 3: unknown setting \"passwd\"; a context has url, token, token_command, ca_cert, client_cert, client_key"
        );
        assert!(parse("users: []\n").unwrap_err().starts_with("line 1: unknown key \"users\""));
    }
}

//! lampctl's contexts, as kubectl keeps them: named workers (URL, token or a command that prints
//! it, CA, client certificate) in `$XDG_CONFIG_HOME/lampctl/config.yaml` (`$LAMPCTL_CONFIG`
//! overrides the path), one of them current. The file holds tokens, so lampctl refuses to read
//! it while others may, and writes it with mode 0600. Flags win over environment variables,
//! which win over the context.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cli::DEFAULT_URL;
use crate::client::Connection;
use crate::error::{CtlError, Failure};

/// The file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    current_context: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, Context>,
}

/// One worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Context {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    /// A shell command whose output is the token (e.g. `pass show lamplighter/prod`), run when
    /// the context is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token_command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ca_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_key: Option<PathBuf>,
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
    if text.trim().is_empty() {
        return Ok(Some(File::default()));
    }
    serde_yaml::from_str(&text).map(Some).map_err(|e| usage(format!("{}: {e}", path.display())))
}

/// Writes the file whole, mode 0600, through a temporary file beside it.
fn save(path: &Path, file: &File) -> Result<(), CtlError> {
    let local = |e: std::io::Error| CtlError::new(Failure::Local, format!("cannot write {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(local)?;
    }
    let text = serde_yaml::to_string(file).map_err(|e| CtlError::new(Failure::Local, format!("cannot write the contexts: {e}")))?;
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

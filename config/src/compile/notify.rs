//! Compiles `notify:` lists (a job's, and `scheduling.notify`, the default).

use super::Compiler;
use super::jobs::Runnable;
use crate::ai::Secret;
use crate::diag::{did_you_mean, quoted_list};
use crate::notify::{NotifyOn, NotifyRule, NotifyTarget, Webhook, WebhookFormat};
use crate::raw;

impl Compiler<'_> {
    /// The rules of one `notify:` list at `at` (`who`: how messages name its owner, `job "x"`
    /// or `scheduling.notify`), each error naming the entry. `None` when any entry is wrong.
    pub(super) fn notify(&mut self, at: &[&str], who: &str, rules: &[raw::Notify], runnable: &Runnable<'_>) -> Option<Vec<NotifyRule>> {
        let mut out = Vec::with_capacity(rules.len());
        let mut ok = true;
        for (i, r) in rules.iter().enumerate() {
            let mut err = |this: &mut Self, msg: String| {
                this.err(at, format!("{who}: notify[{i}]: {msg}"));
                ok = false;
            };
            let names: Vec<&str> = NotifyOn::ALL.iter().map(|o| o.as_str()).collect();
            let on = match r.on.as_deref() {
                None => {
                    err(self, format!("needs \"on\": one of {}", names.join(", ")));
                    None
                }
                Some(s) => match NotifyOn::parse(s) {
                    Some(on) => Some(on),
                    None => {
                        err(self, format!("\"on: {s}\" is not one of {}{}", names.join(", "), did_you_mean(s, names.iter().copied())));
                        None
                    }
                },
            };
            let after = r.after_consecutive.unwrap_or(1);
            if after == 0 {
                err(self, "after_consecutive must be 1 or more".into());
            }
            if r.after_consecutive.is_some() && !matches!(on, Some(NotifyOn::Failure | NotifyOn::Recovery) | None) {
                err(self, "after_consecutive applies to on: failure and on: recovery only".into());
            }
            let to = match &r.to {
                None => {
                    err(self, "needs \"to\": {webhook: URL}, {workflow: W}, {agent: A} or {plugin: P, action: X}".into());
                    None
                }
                Some(to) => match self.notify_target(to, runnable) {
                    Ok(t) => Some(t),
                    Err(why) => {
                        err(self, why);
                        None
                    }
                },
            };
            if let (Some(on), Some(to)) = (on, to) {
                out.push(NotifyRule { on, after_consecutive: after.max(1), to });
            }
        }
        ok.then_some(out)
    }

    fn notify_target(&mut self, to: &raw::NotifyTo, runnable: &Runnable<'_>) -> Result<NotifyTarget, String> {
        let given = [to.webhook.is_some(), to.workflow.is_some(), to.agent.is_some(), to.plugin.is_some()].iter().filter(|b| **b).count();
        if given != 1 {
            return Err("\"to\" names exactly one of webhook, workflow, agent, plugin".into());
        }
        if to.action.is_some() && to.plugin.is_none() {
            return Err("\"to.action\" goes with \"to.plugin\"".into());
        }
        if let Some(w) = &to.workflow {
            if !runnable.workflows.contains(w.as_str()) {
                let hint = did_you_mean(w, runnable.workflows.iter().copied());
                return Err(format!(
                    "workflow \"{w}\" is not defined{hint} (defined workflows: {})",
                    quoted_list(runnable.workflows.iter().copied())
                ));
            }
            return Ok(NotifyTarget::Workflow(w.clone()));
        }
        if let Some(a) = &to.agent {
            if !runnable.agents.contains(a.as_str()) {
                let hint = did_you_mean(a, runnable.agents.iter().copied());
                return Err(format!(
                    "agent \"{a}\" is not defined{hint} (defined agents: {})",
                    quoted_list(runnable.agents.iter().copied())
                ));
            }
            return Ok(NotifyTarget::Agent(a.clone()));
        }
        if let Some(p) = &to.plugin {
            return match (&to.action, p.split_once('.')) {
                (Some(action), _) => Ok(NotifyTarget::Plugin { plugin: p.clone(), action: action.clone() }),
                (None, Some((plugin, action))) => Ok(NotifyTarget::Plugin { plugin: plugin.into(), action: action.into() }),
                (None, None) => Err(format!("plugin \"{p}\" needs an \"action\" (or write plugin: {p}.ACTION)")),
            };
        }
        let (url, headers, format) = match to.webhook.as_ref() {
            Some(raw::WebhookTo::Url(url)) => (Some(url.clone()), None, None),
            Some(raw::WebhookTo::Full(f)) => (f.url.clone(), f.headers.clone(), f.format.clone()),
            None => return Err("\"to\" names no target".into()),
        };
        let Some(url) = url else { return Err("webhook needs a \"url\"".into()) };
        check_url(&url)?;
        let format = match format.as_deref() {
            None | Some("generic") => WebhookFormat::Generic,
            Some("slack") => WebhookFormat::Slack,
            Some(o) => return Err(format!("webhook format \"{o}\" is not one of generic, slack{}", did_you_mean(o, ["generic", "slack"]))),
        };
        let mut hs = Vec::new();
        for (name, value) in headers.unwrap_or_default() {
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
                return Err(format!("webhook header name \"{name}\" is not a valid HTTP header name"));
            }
            if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(format!("webhook header \"{name}\" has a line break or NUL in its value"));
            }
            hs.push((name, Secret::new(value)));
        }
        Ok(NotifyTarget::Webhook(Webhook { url, headers: hs, format }))
    }
}

/// An `http://` or `https://` URL with a host, and nothing a request line cannot carry.
fn check_url(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    let Some(rest) = rest else {
        return Err(format!("webhook URL \"{url}\" must start with http:// or https://"));
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = host.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return Err(format!("webhook URL \"{url}\" has no host"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("webhook URL \"{url}\" has a space or control character in it"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn webhook_urls_are_checked() {
        assert!(check_url("https://hooks.slack.com/services/T/B/x").is_ok());
        assert!(check_url("http://127.0.0.1:9/hook?k=1").is_ok());
        assert!(check_url("ftp://x").unwrap_err().contains("must start with http"));
        assert!(check_url("http:///path").unwrap_err().contains("no host"));
        assert!(check_url("http://a b").unwrap_err().contains("space"));
    }
}

//! The worker as an OAuth 2.1 resource server (SPEC §8a, the MCP authorization spec): it
//! publishes its protected-resource metadata (RFC 9728) and checks each access token (a JWT)
//! against the issuer's published keys — signature, `iss`, `aud` (RFC 8707), `exp` and `nbf`
//! within a leeway — and reads the role from its scopes. Nothing here issues tokens; the
//! identity provider does.
//!
//! Keys: the issuer's discovery document names its JWKS; both are fetched on the first token
//! and kept. A token signed with a `kid` not in the kept set fetches them again (a provider
//! rotating its keys), at most once per [`REFETCH_AFTER`], so that a stream of made-up `kid`s
//! cannot make the worker hammer the provider.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use lamplighter_config::{OAuthSettings, Role};
use serde::Deserialize;
use tokio::sync::Mutex;

/// The soonest the keys are fetched again for an unknown `kid`.
const REFETCH_AFTER: Duration = Duration::from_secs(30);
/// How long a request to the provider may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The signatures accepted (SPEC §8a); a token with any other `alg` is refused.
const ALGORITHMS: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

/// Checks access tokens for one issuer and audience. Shared behind the guard's `Arc`.
pub(crate) struct OAuth {
    settings: OAuthSettings,
    /// Where the metadata is published: named in every 401 and 403.
    metadata_url: String,
    http: reqwest::Client,
    keys: Mutex<Keys>,
}

/// The issuer's keys as last fetched.
#[derive(Default)]
struct Keys {
    set: Option<JwkSet>,
    fetched: Option<Instant>,
}

/// What a valid token says: who, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The subject, else the client id: recorded as the actor.
    pub(crate) subject: String,
    /// The highest role its scopes give; `None` when they give none.
    pub(crate) role: Option<Role>,
}

/// Why a token was not accepted, for the `error_description` of the 401.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid(pub(crate) String);

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

/// The claims read beyond those `jsonwebtoken` checks.
#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    client_id: Option<String>,
    azp: Option<String>,
    /// RFC 9068 and most providers: one string, scopes separated by spaces.
    scope: Option<Scopes>,
    /// Microsoft Entra ID (a string) and some others (an array).
    scp: Option<Scopes>,
    /// Entra ID's application permissions, in app-only (client credentials) tokens.
    roles: Option<Scopes>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Scopes {
    Spaced(String),
    List(Vec<String>),
}

impl Scopes {
    fn contains(&self, scope: &str) -> bool {
        match self {
            Scopes::Spaced(s) => s.split_whitespace().any(|s| s == scope),
            Scopes::List(l) => l.iter().any(|s| s == scope),
        }
    }
}

impl OAuth {
    pub(crate) fn new(settings: OAuthSettings) -> Self {
        let http = reqwest::Client::builder().timeout(FETCH_TIMEOUT).build().unwrap_or_default();
        let metadata_url = metadata_url(&settings.audience);
        Self { settings, metadata_url, http, keys: Mutex::new(Keys::default()) }
    }

    pub(crate) fn settings(&self) -> &OAuthSettings {
        &self.settings
    }

    /// Where the metadata of the audience is published.
    pub(crate) fn metadata_url(&self) -> &str {
        &self.metadata_url
    }

    /// The protected-resource metadata (RFC 9728) as JSON.
    pub(crate) fn metadata(&self) -> String {
        serde_json::json!({
            "resource": self.settings.audience,
            "authorization_servers": [self.settings.issuer],
            "scopes_supported": self.settings.scopes,
            "bearer_methods_supported": ["header"],
            "resource_name": "Lamplighter",
        })
        .to_string()
    }

    /// Checks `token`; the holder, or why not.
    pub(crate) async fn check(&self, token: &str) -> Result<Holder, Invalid> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| Invalid("the bearer token is neither one of worker.mcp.auth.tokens nor an access token (a JWT)".into()))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(Invalid(format!("tokens signed with {:?} are not accepted (RS256, ES256 or EdDSA)", header.alg)));
        }
        let jwk = self.key(header.kid.as_deref(), header.alg).await?;
        let key =
            DecodingKey::from_jwk(&jwk).map_err(|e| Invalid(format!("the issuer's key {} cannot be used: {e}", kid_text(&header.kid))))?;
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&self.settings.issuer]);
        let audiences: Vec<&str> =
            std::iter::once(self.settings.audience.as_str()).chain(self.settings.token_audiences.iter().map(String::as_str)).collect();
        v.set_audience(&audiences);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v.validate_nbf = true;
        v.leeway = self.settings.leeway.as_secs();
        let data = jsonwebtoken::decode::<Claims>(token, &key, &v).map_err(|e| Invalid(self.why(&e)))?;
        let c = data.claims;
        let subject =
            c.sub.or(c.client_id).or(c.azp).ok_or_else(|| Invalid("the token names no subject (sub) or client (client_id)".into()))?;
        let has = |scope: &str| [&c.scope, &c.scp, &c.roles].into_iter().any(|s| s.as_ref().is_some_and(|s| s.contains(scope)));
        let role = Role::ALL.into_iter().rev().find(|r| has(self.settings.scope_of(*r)));
        Ok(Holder { subject, role })
    }

    fn why(&self, e: &jsonwebtoken::errors::Error) -> String {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::ExpiredSignature => "the token has expired".into(),
            K::ImmatureSignature => "the token is not valid yet (nbf)".into(),
            K::InvalidAudience => format!("the token is for another audience (aud); this worker is {}", self.settings.audience),
            K::InvalidIssuer => format!("the token is from another issuer (iss); this worker accepts {}", self.settings.issuer),
            K::InvalidSignature => "the token's signature does not verify".into(),
            K::MissingRequiredClaim(c) => format!("the token has no \"{c}\" claim"),
            K::InvalidAlgorithm => "the token's alg does not match its key".into(),
            other => format!("the token does not read ({other:?})"),
        }
    }

    /// The issuer's key for `kid` (or its only key for `alg` when the token names none),
    /// fetching the keys when none are kept, or again when `kid` is unknown and they were
    /// fetched more than [`REFETCH_AFTER`] ago.
    async fn key(&self, kid: Option<&str>, alg: Algorithm) -> Result<Jwk, Invalid> {
        let mut keys = self.keys.lock().await;
        if let Some(found) = keys.set.as_ref().and_then(|s| pick(s, kid, alg)) {
            return Ok(found);
        }
        let stale = keys.fetched.is_none_or(|t| t.elapsed() >= REFETCH_AFTER);
        if stale {
            match self.fetch().await {
                Ok(set) => {
                    keys.set = Some(set);
                    keys.fetched = Some(Instant::now());
                }
                Err(why) => {
                    keys.fetched = Some(Instant::now());
                    tracing::warn!(issuer = %self.settings.issuer, "cannot fetch the OAuth issuer's keys: {why}");
                    return Err(Invalid(format!("the issuer's keys cannot be fetched now: {why}")));
                }
            }
        }
        keys.set.as_ref().and_then(|s| pick(s, kid, alg)).ok_or_else(|| {
            Invalid(format!("the token is signed with a key the issuer does not publish ({})", kid_text(&kid.map(String::from))))
        })
    }

    /// The discovery document, then the JWKS it names.
    async fn fetch(&self) -> Result<JwkSet, String> {
        let issuer = self.settings.issuer.trim_end_matches('/');
        let mut last = String::new();
        // OpenID Connect discovery, then RFC 8414 (a plain OAuth server).
        for path in ["/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"] {
            let url = format!("{issuer}{path}");
            match self.get_json::<Discovery>(&url).await {
                Ok(d) if d.issuer == self.settings.issuer => {
                    return self.get_json::<JwkSet>(&d.jwks_uri).await;
                }
                Ok(d) => {
                    return Err(format!(
                        "{url} names issuer \"{}\", not \"{}\"; set worker.mcp.auth.oauth.issuer to the provider's own",
                        d.issuer, self.settings.issuer
                    ));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let response = self.http.get(url).send().await.map_err(|e| format!("GET {url}: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("GET {url}: HTTP {status}"));
        }
        response.json::<T>().await.map_err(|e| format!("GET {url}: {e}"))
    }
}

/// RFC 9728 §3.1: the well-known path inserted between the host and the resource's path.
fn metadata_url(audience: &str) -> String {
    let audience = audience.trim_end_matches('/');
    let scheme_end = audience.find("://").map_or(0, |i| i + 3);
    let path_start = audience[scheme_end..].find('/').map_or(audience.len(), |i| scheme_end + i);
    let (origin, path) = audience.split_at(path_start);
    format!("{origin}/.well-known/oauth-protected-resource{path}")
}

/// The key a token names, or, when it names none, the only key the issuer has for its `alg`.
fn pick(set: &JwkSet, kid: Option<&str>, alg: Algorithm) -> Option<Jwk> {
    match kid {
        Some(kid) => set.find(kid).cloned(),
        None => {
            let mut fitting = set.keys.iter().filter(|k| {
                let algorithm = k.common.key_algorithm.and_then(|a| a.to_string().parse::<Algorithm>().ok());
                algorithm.is_none_or(|a| a == alg)
            });
            let only = fitting.next()?;
            fitting.next().is_none().then(|| only.clone())
        }
    }
}

fn kid_text(kid: &Option<String>) -> String {
    kid.as_deref().map_or_else(|| "without a kid".to_string(), |k| format!("kid \"{k}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(audience: &str) -> OAuthSettings {
        OAuthSettings {
            issuer: "https://id.example".into(),
            audience: audience.into(),
            scopes: ["lamplighter:read".into(), "lamplighter:operate".into(), "lamplighter:manage".into()],
            leeway: Duration::from_secs(60),
            token_audiences: Vec::new(),
        }
    }

    #[test]
    fn the_metadata_url_inserts_the_well_known_path_before_the_resource_path() {
        assert_eq!(
            OAuth::new(settings("https://w.example:8443/mcp")).metadata_url(),
            "https://w.example:8443/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(OAuth::new(settings("https://w.example/")).metadata_url(), "https://w.example/.well-known/oauth-protected-resource");
        let m: serde_json::Value = serde_json::from_str(&OAuth::new(settings("https://w.example/mcp")).metadata()).unwrap();
        assert_eq!(m["resource"], "https://w.example/mcp");
        assert_eq!(m["authorization_servers"], serde_json::json!(["https://id.example"]));
        assert_eq!(m["scopes_supported"][2], "lamplighter:manage");
    }

    #[tokio::test]
    async fn what_is_not_a_jwt_is_refused_before_any_fetch() {
        let o = OAuth::new(settings("https://w.example/mcp"));
        assert_eq!(
            o.check("s3cret").await,
            Err(Invalid("the bearer token is neither one of worker.mcp.auth.tokens nor an access token (a JWT)".into()))
        );
        // HS256: a shared secret, never accepted from an identity provider's token.
        let hs = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ4In0.c2ln";
        assert!(o.check(hs).await.unwrap_err().0.contains("HS256"), "{:?}", o.check(hs).await);
        assert!(o.keys.lock().await.fetched.is_none(), "nothing was fetched");
    }

    #[test]
    fn scopes_read_as_a_spaced_string_or_a_list() {
        let spaced = Scopes::Spaced("openid lamplighter:operate".into());
        assert!(spaced.contains("lamplighter:operate") && !spaced.contains("lamplighter:op"));
        assert!(Scopes::List(vec!["lamplighter:read".into()]).contains("lamplighter:read"));
    }
}

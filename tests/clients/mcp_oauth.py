"""Drives a worker behind OAuth with the official Python MCP SDK's own OAuth client, as a
third-party MCP client would, against the provider `oidc_provider.mjs` runs. Run it with the venv
python of `.ci/python-mcp.sh` (PyPI `mcp` 2.3.0; its HTTP client is `httpx2`).

  python mcp_oauth.py code URL [--scope S] [--resource R] [--step-up] [--redirect-uri U]
                               [--call TOOL JSON_ARGS]... [--sleep SECONDS]...
  python mcp_oauth.py client_credentials URL --client-id ID --client-secret SECRET [--issuer ISS]
                               [--scope S] [--resource R]
                               [--call TOOL JSON_ARGS]... [--sleep SECONDS]...

`code` is the SDK's `OAuthClientProvider`: the first request's 401 and its `WWW-Authenticate:
Bearer resource_metadata=…` → protected-resource metadata → authorization-server metadata →
dynamic registration (a public client, token_endpoint_auth_method "none") → authorization URL with
PKCE. Its redirect handler follows that URL headlessly (the provider logs alice in and consents by
itself), stops at the redirect to the client's redirect_uri and hands its code/state/iss to the
callback handler; the SDK then exchanges the code (with `resource`) and retries.
`client_credentials` is the SDK's own `ClientCredentialsOAuthProvider`
(mcp.client.auth.extensions.client_credentials): same discovery, then a client-credentials token
request (client_secret_basic, the SDK's default and what the provider's machine client is
registered with) with `resource`, no registration. Pass --issuer (the provider's): without it the
SDK would send the secret to whichever AS the worker names (and warns that is deprecated).

--scope S: the scope asked for. The SDK itself would ask for the WWW-Authenticate `scope`, else the
  protected-resource metadata's scopes_supported (plus offline_access when the AS lists it, for the
  code flow), whatever the client was configured with; S replaces that in every authorization
  (re-authorizations included), as a user consenting to S only. Without --scope the SDK's choice
  stands.
--step-up: with --scope, only the first authorization is pinned to S; a re-authorization after a
  403 `insufficient_scope` asks for what the SDK computes (its SEP-2350 union of what it had and
  the challenged scope), so such a call can succeed on the second token.
--resource R: ask the AS for a token for resource R instead of the one the protected-resource
  metadata names (to check the worker refuses another audience).
--call TOOL JSON / --sleep SECONDS: run in the order given, after the session is up.

Prints one JSON line per --call: {"tool", "is_error", "text", "structured"} for a tool result, or
{"tool", "exception": "<type>: <message>", "status": <HTTP status of the refused POST, or null>}
when the call raised (e.g. an HTTP 403), and goes on. Ends with {"done": true, "token_claims":
<the last access token's JWT payload, unverified>, "token_scope", "refresh_token": bool,
"tokens_issued", "authorizations": [{"scope", "resource"}, …], "client_id"}. Exit 0 when the
flow finished (refused calls included); 1 when the OAuth flow or the connection failed, with one
line on stderr and, on stdout, that last line with "done": false, "error" and "status" (the last
MCP POST's). --trace: one stderr line per HTTP exchange of the flow; --verbose: SDK debug logs.
"""

import argparse
import asyncio
import base64
import json
import logging
import sys
import warnings
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken


TRACE = False  # --trace
TRACE_SKIP_BODY = None  # the MCP URL: its request bodies are not traced


class Steps(argparse.Action):
    """--call and --sleep append to one ordered list."""

    def __call__(self, parser, namespace, values, option_string=None):
        steps = getattr(namespace, self.dest) or []
        if option_string == "--call":
            tool, raw = values
            try:
                arguments = json.loads(raw)
            except json.JSONDecodeError as e:
                parser.error(f"--call {tool}: arguments are not JSON: {e}")
            steps.append(("call", tool, arguments))
        else:
            steps.append(("sleep", float(values), None))
        setattr(namespace, self.dest, steps)


class MemoryStorage:
    """The SDK's TokenStorage protocol, in memory; counts the tokens it is handed."""

    def __init__(self):
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None
        self.tokens_issued = 0

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.tokens_issued += 1

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class Pinned:
    """Mixin over an SDK provider: pins the scope asked for (see --scope / --step-up), overrides the
    resource (--resource), and records each authorization. `_perform_authorization` is where both
    SDK providers build the authorization / token request, after the SDK chose the scope."""

    def setup(self, scope: str | None, step_up: bool, resource: str | None):
        self.pinned_scope = scope
        self.step_up = step_up
        self.authorizations: list[dict] = []
        if resource is not None:
            self.context.get_resource_url = lambda: resource

    async def _perform_authorization(self):
        if self.pinned_scope is not None and not (self.step_up and self.authorizations):
            self.context.client_metadata.scope = self.pinned_scope
        resource = (
            self.context.get_resource_url()
            if self.context.should_include_resource_param(self.context.protocol_version)
            else None
        )
        self.authorizations.append({"scope": self.context.client_metadata.scope, "resource": resource})
        return await super()._perform_authorization()


class CodeProvider(Pinned, OAuthClientProvider):
    pass


class MachineProvider(Pinned, ClientCredentialsOAuthProvider):
    pass


class FlowFailed(Exception):
    pass


class HeadlessBrowser:
    """The SDK's redirect_handler and callback_handler: follows the authorization URL through the
    provider's redirects (keeping its cookies), without following the last one, to redirect_uri."""

    def __init__(self, redirect_uri: str):
        self.redirect_uri = redirect_uri
        self.result: AuthorizationCodeResult | None = None

    def _is_redirect_uri(self, url: str) -> bool:
        a, b = urlsplit(url), urlsplit(self.redirect_uri)
        return (a.scheme, a.netloc, a.path) == (b.scheme, b.netloc, b.path)

    async def redirect_handler(self, authorization_url: str) -> None:
        self.result = None
        url = authorization_url
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as http:
            for _ in range(20):
                response = await http.get(url)
                if TRACE:
                    trace(response)
                location = response.headers.get("location")
                if not (300 <= response.status_code < 400 and location):
                    body = " ".join(response.text.split())[:300]
                    raise FlowFailed(f"authorization stopped at {url.split('?')[0]}: HTTP {response.status_code}: {body}")
                url = urljoin(url, location)
                if self._is_redirect_uri(url):
                    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
                    if "error" in query:
                        raise FlowFailed(
                            f"authorization refused: {query['error']}: {query.get('error_description', '')}"
                        )
                    if "code" not in query:
                        raise FlowFailed(f"redirect to redirect_uri without a code: {url}")
                    self.result = AuthorizationCodeResult(
                        code=query["code"], state=query.get("state"), iss=query.get("iss")
                    )
                    return
        raise FlowFailed("authorization did not reach the redirect_uri in 20 redirects")

    async def callback_handler(self) -> AuthorizationCodeResult:
        if self.result is None:
            raise FlowFailed("no authorization code captured")
        return self.result


def jwt_claims(token: str | None):
    """The payload of a JWT, not verified; None if the token is not a JWT."""
    try:
        payload = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except Exception:
        return None


def root_cause(exc: BaseException) -> BaseException:
    """The interesting exception inside task-group wrappers, preferring an OAuth one."""
    leaves: list[BaseException] = []

    def walk(e: BaseException):
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(exc)
    for e in leaves:
        if "OAuth" in type(e).__name__ or isinstance(e, FlowFailed):
            return e
    return leaves[0] if leaves else exc


def one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


def trace(response: httpx2.Response) -> None:
    """--trace: one stderr line per HTTP exchange (MCP bodies left out, OAuth ones shown)."""
    request = response.request
    line = f"trace: {request.method} {request.url} -> {response.status_code}"
    if request.headers.get("authorization"):
        line += f" [Authorization: {request.headers['authorization'][:16]}...]"
    if request.content and str(request.url).split("?")[0] != TRACE_SKIP_BODY:
        line += f" body={request.content.decode(errors='replace')}"
    for header in ("www-authenticate", "location"):
        if header in response.headers:
            line += f" {header}: {response.headers[header]}"
    sys.stderr.write(line + "\n")



def emit(obj) -> None:
    print(json.dumps(obj), flush=True)


class OneLineHandler(logging.Handler):
    """SDK warnings/errors as one line each, without the tracebacks `logger.exception` attaches."""

    def emit(self, record):
        if record.getMessage() in ("OAuth flow error", "Error in post_writer"):
            return  # the exception itself is reported, once, by run()
        sys.stderr.write(f"{record.name}: {record.levelname}: {' '.join(record.getMessage().split())}\n")


async def run(args) -> int:
    storage = MemoryStorage()
    if args.mode == "code":
        browser = HeadlessBrowser(args.redirect_uri)
        provider = CodeProvider(
            server_url=args.url,
            client_metadata=OAuthClientMetadata(
                client_name="lamplighter e2e (mcp python sdk)",
                redirect_uris=[args.redirect_uri],
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                token_endpoint_auth_method="none",
            ),
            storage=storage,
            redirect_handler=browser.redirect_handler,
            callback_handler=browser.callback_handler,
        )
    else:
        provider = MachineProvider(
            server_url=args.url,
            storage=storage,
            client_id=args.client_id,
            client_secret=args.client_secret,
            token_endpoint_auth_method="client_secret_basic",
            scope=args.scope,
            issuer=args.issuer,
        )
    provider.setup(args.scope, args.step_up, args.resource)

    # The status of the last MCP POST, so a refused call can say 401/403: the SDK's transport
    # turns a non-JSON-RPC error response into a bare "Server returned an error response".
    last = {"status": None}

    async def on_response(response: httpx2.Response):
        if response.request.method == "POST" and str(response.request.url) == args.url:
            last["status"] = response.status_code
        if args.trace:
            trace(response)

    http = httpx2.AsyncClient(
        auth=provider, timeout=httpx2.Timeout(30, read=300), event_hooks={"response": [on_response]}
    )
    try:
        async with http, Client(streamable_http_client(args.url, http_client=http)) as client:
            for kind, what, arguments in args.steps or []:
                if kind == "sleep":
                    await asyncio.sleep(what)
                    continue
                last["status"] = None
                try:
                    r = await client.call_tool(what, arguments)
                except Exception as e:
                    status = last["status"] if last["status"] is not None and last["status"] >= 400 else None
                    emit({"tool": what, "exception": one_line(e), "status": status})
                    continue
                text = "\n".join(getattr(b, "text", "") for b in r.content)
                emit({"tool": what, "is_error": bool(r.is_error), "text": text, "structured": r.structured_content})
    except BaseException as e:  # noqa: BLE001 - an ExceptionGroup from the transport's task group
        if isinstance(e, KeyboardInterrupt):
            raise
        cause = root_cause(e)
        status = f" (last MCP POST: HTTP {last['status']})" if last["status"] else ""
        sys.stderr.write(f"mcp_oauth: {args.mode} flow failed: {one_line(cause)}{status}\n")
        emit(summary(False, storage, provider) | {"error": one_line(cause), "status": last["status"]})
        return 1
    emit(summary(True, storage, provider))
    return 0


def summary(done: bool, storage: MemoryStorage, provider) -> dict:
    tokens = storage.tokens
    return {
        "done": done,
        "token_claims": jwt_claims(tokens.access_token if tokens else None),
        "token_scope": tokens.scope if tokens else None,
        "refresh_token": bool(tokens and tokens.refresh_token),
        "tokens_issued": storage.tokens_issued,
        "authorizations": provider.authorizations,
        "client_id": provider.context.client_info.client_id if provider.context.client_info else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["code", "client_credentials"])
    parser.add_argument("url")
    parser.add_argument("--scope")
    parser.add_argument("--resource")
    parser.add_argument("--step-up", action="store_true")
    parser.add_argument("--redirect-uri", default="http://127.0.0.1:33418/callback")
    parser.add_argument("--client-id")
    parser.add_argument("--client-secret")
    parser.add_argument("--issuer")
    parser.add_argument("--call", nargs=2, metavar=("TOOL", "JSON_ARGS"), action=Steps, dest="steps")
    parser.add_argument("--sleep", metavar="SECONDS", action=Steps, dest="steps")
    parser.add_argument("--verbose", action="store_true", help="SDK debug logging on stderr")
    parser.add_argument("--trace", action="store_true", help="one stderr line per HTTP exchange")
    args = parser.parse_args()
    global TRACE, TRACE_SKIP_BODY
    TRACE, TRACE_SKIP_BODY = args.trace, args.url
    if args.mode == "client_credentials" and not (args.client_id and args.client_secret):
        parser.error("client_credentials needs --client-id and --client-secret")

    handler = OneLineHandler()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, handlers=[handler])
    # Without --issuer the SDK warns that omitting it is deprecated; that is the caller's choice here.
    warnings.filterwarnings("ignore", message="Omitting `issuer` is deprecated")
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

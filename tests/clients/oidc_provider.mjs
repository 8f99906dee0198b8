// A real OpenID provider (npm `oidc-provider`, installed by `.ci/oidc.sh`) on loopback, for the
// OAuth end-to-end tests: the worker is the resource server, this is its authorization server.
//
//   $DIR/node oidc_provider.mjs --modules $DIR [--resource http://127.0.0.1:PORT/mcp] \
//       [--port 0] [--alg RS256|ES256|EdDSA] [--ttl SECONDS] [--keys-out FILE]
//
// --keys-out writes the issuer's RSA signing key (its kid and PKCS#8 PEM) to FILE, so that a test
// can sign tokens the provider would not issue (expired, not yet valid, another issuer) with a
// key the issuer does publish, and check that the worker refuses them for the right reason.
//
// where $DIR is what `.ci/oidc.sh` prints (without --modules: $LAMPLIGHTER_OIDC, then
// ~/.cache/lamplighter-oidc). Once listening it prints ONE JSON line on stdout:
//   {"issuer":"http://127.0.0.1:NNNN","machine":{"client_id":"lamplighter-machine","client_secret":"…"},
//    "resource":…,"alg":…,"ttl":…,"scopes":[…],"jwks_uri":…,"token_endpoint":…,
//    "authorization_endpoint":…,"registration_endpoint":…,"keys":[{"kid","kty","alg"},…]}
// and serves until SIGTERM/SIGINT, or until its stdin closes when stdin is a pipe (so it dies
// with the test that spawned it; a /dev/null or terminal stdin is not watched).
//
// What it does:
// - Keys: an RSA (RS256), an EC P-256 (ES256) and an Ed25519 (EdDSA) key, made at start, each with
//   a kid, all in the JWKS; access tokens are JWTs (typ at+jwt) signed with --alg (default RS256).
// - Every resource indicator is a resource server (RFC 8707): its access tokens are JWTs whose aud
//   is that resource, with scope = requested ∩ {lamplighter:read, lamplighter:operate,
//   lamplighter:manage}, living --ttl seconds (default 3600). A request naming no resource gets
//   one for --resource (without --resource, an opaque token: MCP clients always name the resource,
//   so a test may start this before the worker, whose port it then need not know). A token for
//   another resource (say http://127.0.0.1:1/other) is issued just as readily, so a test can check
//   the worker refuses it.
// - Grants: authorization_code (PKCE S256, required for public clients), refresh_token (issued to
//   every client allowed the grant, offline_access or not), client_credentials.
// - Open dynamic client registration (no initial access token), as MCP clients use.
// - A pre-registered confidential client "lamplighter-machine" (client_secret_basic, client
//   credentials only, all three scopes): the "machine" of the printed line.
// - Headless interactions: the authorization endpoint's redirect to /interaction/UID is answered
//   here by logging in alice@example.test and granting every requested scope and resource, so an
//   HTTP client that follows redirects (and keeps cookies) ends at the client's redirect_uri with
//   ?code=…&state=…&iss=…. No HTML form.
// - Discovery: /.well-known/openid-configuration and RFC 8414 /.well-known/oauth-authorization-server.
// - Every *.error event (invalid_grant, invalid_target, …) and server_error is logged on stderr.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import { fstatSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    resource: { type: 'string' },
    alg: { type: 'string', default: 'RS256' },
    ttl: { type: 'string', default: '3600' },
    modules: { type: 'string' },
    'keys-out': { type: 'string' },
  },
});

function die(message) {
  process.stderr.write(`oidc_provider: ${message}\n`);
  process.exit(2);
}

if (args.resource !== undefined && !URL.canParse(args.resource)) die(`--resource is not a URL: ${args.resource}`);
const RESOURCE = args.resource ?? null;
const ALGS = ['RS256', 'ES256', 'EdDSA']; // one key of each kind is in the JWKS
const ALG = args.alg;
if (!ALGS.includes(ALG)) die(`--alg must be one of ${ALGS.join(', ')}`);
const TTL = Number(args.ttl);
if (!Number.isInteger(TTL) || TTL <= 0) die('--ttl must be a positive integer (seconds)');
const PORT = Number(args.port);

const ACCOUNT = 'alice@example.test';
const RS_SCOPES = ['lamplighter:read', 'lamplighter:operate', 'lamplighter:manage'];
const MACHINE = { client_id: 'lamplighter-machine', client_secret: randomBytes(24).toString('base64url') };

// oidc-provider lives in the cache directory `.ci/oidc.sh` installed it into, not next to this
// file, and ESM `import` does not search NODE_PATH: resolve it from there.
async function loadProvider() {
  const dirs = [args.modules, process.env.LAMPLIGHTER_OIDC, join(homedir(), '.cache/lamplighter-oidc')];
  for (const dir of dirs.filter(Boolean)) {
    try {
      const entry = createRequire(join(dir, 'package.json')).resolve('oidc-provider');
      return (await import(pathToFileURL(entry).href)).default;
    } catch (err) {
      if (err.code !== 'MODULE_NOT_FOUND') throw err;
    }
  }
  try {
    return (await import('oidc-provider')).default;
  } catch {
    die(`oidc-provider not found (looked in ${dirs.filter(Boolean).join(', ')}): run .ci/oidc.sh`);
  }
  return undefined;
}

function signingKeys() {
  const jwk = (pair, kid, alg) => ({ ...pair.privateKey.export({ format: 'jwk' }), kid, alg, use: 'sig' });
  const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
  if (args['keys-out']) {
    const pem = rsa.privateKey.export({ format: 'pem', type: 'pkcs8' });
    writeFileSync(args['keys-out'], JSON.stringify({ kid: 'rsa-1', alg: 'RS256', pem }), { mode: 0o600 });
  }
  return [
    jwk(rsa, 'rsa-1', 'RS256'),
    jwk(generateKeyPairSync('ec', { namedCurve: 'P-256' }), 'ec-1', 'ES256'),
    jwk(generateKeyPairSync('ed25519'), 'ed-1', 'EdDSA'),
  ];
}

const Provider = await loadProvider();
const keys = signingKeys();

// Listen first: the issuer must carry the port the kernel picked.
const server = createServer();
await new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(PORT, '127.0.0.1', resolve);
});
const ISSUER = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(ISSUER, {
  clients: [{
    ...MACHINE,
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    token_endpoint_auth_method: 'client_secret_basic',
    scope: RS_SCOPES.join(' '),
  }],
  jwks: { keys },
  scopes: ['openid', 'offline_access', ...RS_SCOPES],
  responseTypes: ['code'],
  findAccount: async (_ctx, sub) => ({ accountId: sub, claims: async () => ({ sub }) }),
  cookies: { keys: [randomBytes(32).toString('base64url')] },
  clientBasedCORS: () => true,
  pkce: { required: (_ctx, client) => client.clientAuthMethod === 'none' },
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
  ttl: {
    AccessToken: (_ctx, token) => token.resourceServer?.accessTokenTTL ?? TTL,
    ClientCredentials: (_ctx, token) => token.resourceServer?.accessTokenTTL ?? TTL,
    AuthorizationCode: 60,
    IdToken: 3600,
    RefreshToken: 24 * 3600,
    Interaction: 3600,
    Session: 24 * 3600,
    Grant: 24 * 3600,
  },
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: true, initialAccessToken: false },
    clientCredentials: { enabled: true },
    revocation: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      // No `resource` asked for: the worker's. Several granted: the worker's if among them.
      defaultResource: async (_ctx, _client, oneOf) => {
        if (!oneOf) return RESOURCE ?? undefined;
        if (oneOf.length === 1) return oneOf[0];
        return oneOf.includes(RESOURCE) ? RESOURCE : oneOf;
      },
      useGrantedResource: async () => true,
      getResourceServerInfo: async (_ctx, resourceIndicator) => ({
        scope: RS_SCOPES.join(' '),
        audience: resourceIndicator,
        accessTokenFormat: 'jwt',
        accessTokenTTL: TTL,
        jwt: { sign: { alg: ALG } },
      }),
    },
  },
});

const errorEvents = [
  'authorization.error', 'grant.error', 'registration_create.error', 'registration_read.error',
  'registration_update.error', 'registration_delete.error', 'revocation.error', 'introspection.error',
  'discovery.error', 'jwks.error', 'userinfo.error', 'end_session.error', 'pushed_authorization_request.error',
];
for (const event of errorEvents) {
  provider.on(event, (ctx, err) => {
    const desc = err?.error_description ? `: ${err.error_description}` : '';
    const detail = err?.error_detail ? ` (${err.error_detail})` : '';
    process.stderr.write(`oidc_provider: ${event} ${ctx?.method ?? ''} ${ctx?.path ?? ''} ${err?.error ?? err?.message}${desc}${detail}\n`);
  });
}
provider.on('server_error', (ctx, err) => {
  process.stderr.write(`oidc_provider: server_error ${ctx?.method ?? ''} ${ctx?.path ?? ''}: ${err?.stack ?? err}\n`);
});

// The headless user: logs alice in, then consents to whatever was asked.
async function interaction(req, res) {
  try {
    const { prompt: { name, details }, params, session, grantId } = await provider.interactionDetails(req, res);
    if (name === 'login') {
      await provider.interactionFinished(req, res, { login: { accountId: ACCOUNT } }, { mergeWithLastSubmission: false });
      return;
    }
    if (name === 'consent') {
      const grant = grantId
        ? await provider.Grant.find(grantId)
        : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
      if (details.missingOIDCScope) grant.addOIDCScope(details.missingOIDCScope.join(' '));
      if (details.missingOIDCClaims) grant.addOIDCClaims(details.missingOIDCClaims);
      for (const [indicator, scopes] of Object.entries(details.missingResourceScopes ?? {})) {
        grant.addResourceScope(indicator, scopes.join(' '));
      }
      for (const detail of details.rar ?? []) grant.addRar(detail);
      const result = { consent: { grantId: await grant.save() } };
      await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: true });
      return;
    }
    throw new Error(`unexpected prompt ${name}`);
  } catch (err) {
    process.stderr.write(`oidc_provider: interaction ${req.url}: ${err?.stack ?? err}\n`);
    if (!res.headersSent) {
      res.statusCode = 400;
      res.setHeader('Content-Type', 'text/plain');
      res.end(`interaction failed: ${err?.message ?? err}\n`);
    }
  }
}

const callback = provider.callback();
server.on('request', (req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res);
  } else {
    callback(req, res);
  }
});

const discovery = `${ISSUER}/.well-known/openid-configuration`;
const meta = await (await fetch(discovery)).json();
process.stdout.write(`${JSON.stringify({
  issuer: ISSUER,
  machine: MACHINE,
  resource: RESOURCE,
  alg: ALG,
  ttl: TTL,
  scopes: RS_SCOPES,
  account: ACCOUNT,
  discovery,
  jwks_uri: meta.jwks_uri,
  token_endpoint: meta.token_endpoint,
  authorization_endpoint: meta.authorization_endpoint,
  registration_endpoint: meta.registration_endpoint,
  keys: keys.map(({ kid, kty, alg }) => ({ kid, kty, alg })),
})}\n`);

const stop = () => process.exit(0);
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
let stdinIsPipe = false;
try {
  stdinIsPipe = fstatSync(0).isFIFO();
} catch { /* no stdin */ }
if (stdinIsPipe) {
  process.stdin.on('end', () => process.exit(0));
  process.stdin.on('error', () => process.exit(0));
  process.stdin.resume();
}

// A throwaway OpenID Provider for meshplane's identity tests. Never shipped.
//
// Usage: node provider.mjs --port PORT --redirect-uri URI [--redirect-uri URI ...]
//
// It prints "READY <issuer>" on stdout once listening. Everything about it is
// fixed for tests: the clients and their secrets below, two accounts, and an
// interaction route that logs in without a browser:
//
//   GET /interaction/:uid[?account=ID]
//     logs in `account` (default: the authorization request's login_hint,
//     else "alice") and grants every requested scope. The account "deny"
//     makes the provider answer the client with error=access_denied and an
//     error_description holding HTML metacharacters (for escaping tests).
//
// Access tokens: two resource indicators make the provider issue signed JWT
// access tokens, shaped like Microsoft identity platform tokens:
//   urn:meshplane:api     -> ver "2.0", azp = client id   (v2 access token)
//   urn:meshplane:api-v1  -> ver "1.0", appid = client id (v1 access token)
// A client_credentials grant gives sub = client id, like a service principal.
import { generateKeyPairSync } from 'node:crypto';
import { parseArgs } from 'node:util';

import Provider, { errors } from 'oidc-provider';

const { values } = parseArgs({
  options: {
    port: { type: 'string' },
    'redirect-uri': { type: 'string', multiple: true, default: [] },
  },
});
if (!values.port) {
  console.error('usage: node provider.mjs --port PORT --redirect-uri URI');
  process.exit(2);
}
const port = Number(values.port);
const issuer = `http://127.0.0.1:${port}`;

const CLIENTS = {
  web: { id: 'meshplane-web', secret: 'web-secret-for-tests-only' },
  device: { id: 'meshctl-device' },
  deviceShort: { id: 'meshctl-device-short' },
  exchange: { id: 'meshplane-exchange', secret: 'exchange-secret-for-tests-only' },
  other: { id: 'other-sp', secret: 'other-secret-for-tests-only' },
};

const ACCOUNTS = {
  alice: { email: 'alice@example.test', name: 'Alice Example' },
  bob: { email: 'bob@example.test', name: 'Bob Example' },
};

const API_V2 = 'urn:meshplane:api';
const API_V1 = 'urn:meshplane:api-v1';

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key-1', use: 'sig', alg: 'RS256' };

const deviceGrants = ['urn:ietf:params:oauth:grant-type:device_code', 'refresh_token'];

const configuration = {
  clients: [
    {
      client_id: CLIENTS.web.id,
      client_secret: CLIENTS.web.secret,
      redirect_uris: values['redirect-uri'],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    ...[CLIENTS.device, CLIENTS.deviceShort].map((c) => ({
      client_id: c.id,
      grant_types: deviceGrants,
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'none',
    })),
    ...[CLIENTS.exchange, CLIENTS.other].map((c) => ({
      client_id: c.id,
      client_secret: c.secret,
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'client_secret_post',
    })),
  ],
  jwks: { keys: [signingKey] },
  cookies: { keys: ['test-cookie-key-not-secret'] },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
  },
  scopes: ['openid', 'offline_access', 'email', 'profile'],
  // Put the scope claims in the ID token itself, as Entra ID does.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  ttl: {
    DeviceCode: (ctx, token, client) => (client.clientId === CLIENTS.deviceShort.id ? 2 : 600),
  },
  async findAccount(ctx, id) {
    const account = ACCOUNTS[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, email: account.email, email_verified: true, name: account.name };
      },
    };
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    deviceFlow: {
      enabled: true,
      async userCodeInputSource(ctx, form, out, err) {
        const problem = err ? `<p class="error">${err.name}</p>` : '';
        ctx.body = `<!DOCTYPE html><html><body>${problem}${form}</body></html>`;
      },
      async userCodeConfirmSource(ctx, form) {
        ctx.body = `<!DOCTYPE html><html><body>${form}</body></html>`;
      },
      async successSource(ctx) {
        ctx.body = '<!DOCTYPE html><html><body>device login complete</body></html>';
      },
    },
    resourceIndicators: {
      enabled: true,
      defaultResource: (ctx, client, oneOf) => oneOf,
      useGrantedResource: () => false,
      async getResourceServerInfo(ctx, resource) {
        if (resource !== API_V2 && resource !== API_V1) throw new errors.InvalidTarget();
        return {
          scope: 'api',
          audience: resource,
          accessTokenTTL: 600,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  async extraTokenClaims(ctx, token) {
    const audience = token.resourceServer?.audience;
    if (audience === API_V2) return { ver: '2.0', azp: token.clientId, tid: 'test-tenant' };
    if (audience === API_V1) return { ver: '1.0', appid: token.clientId, tid: 'test-tenant' };
    return undefined;
  },
};

const provider = new Provider(issuer, configuration);

// Browser-less interaction: log in the chosen account and grant what was asked.
provider.use(async (ctx, next) => {
  const match = /^\/interaction\/([^/]+)$/.exec(ctx.path);
  if (!match || ctx.method !== 'GET') return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const account = ctx.query.account || details.params.login_hint || 'alice';
  let result;
  if (account === 'deny') {
    result = {
      error: 'access_denied',
      error_description: 'denied by <b>test</b> & "friends"',
    };
  } else if (details.prompt.name === 'login') {
    if (!ACCOUNTS[account]) {
      result = { error: 'access_denied', error_description: 'unknown test account' };
    } else {
      result = { login: { accountId: account } };
    }
  } else {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
    const { missingOIDCScope, missingOIDCClaims, missingResourceScopes } = details.prompt.details;
    if (missingOIDCScope) grant.addOIDCScope(missingOIDCScope.join(' '));
    if (missingOIDCClaims) grant.addOIDCClaims(missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missingResourceScopes || {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    result = { consent: { grantId: await grant.save() } };
  }
  const redirectTo = await provider.interactionResult(ctx.req, ctx.res, result, {
    mergeWithLastSubmission: false,
  });
  ctx.redirect(redirectTo);
  ctx.status = 303;
});

const server = provider.listen(port, '127.0.0.1', () => {
  console.log(`READY ${issuer}`);
});
const stop = () => server.close(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);

// SPDX-License-Identifier: LGPL-2.1-or-later
//
// A real OpenID provider for vm-manager's tests: npm's oidc-provider (panva's, OpenID-certified),
// playing Dex on 127.0.0.1 with the fixed keys of test-keys.json. Test double only.
//
// usage: node provider.mjs REDIRECT_URI [PORT]
//   REDIRECT_URI  where the relying party "vm-manager" (secret "dex-secret") gets its codes: the
//                 daemon's <base>/oauth/callback
//   PORT          0 or absent: the kernel picks
// Prints "READY <port>" once it serves. Issuer: http://127.0.0.1:<port>, or https:// when
// OIDC_TLS_CERT and OIDC_TLS_KEY name a PEM certificate and key to serve with.
//
// Clients: "vm-manager" (authorization code + PKCE, client_secret_basic), "svc" (secret
// "svc-secret", client_credentials; access tokens are JWTs for the requested resource, RFC 8707).
// Accounts: any login name; email <login>@example.test, groups ["vm-admins", "<login>-team"].
//
// Test controls (not part of any real provider), all POST with a JSON body:
//   /_test/mint    {"kid", "header"?, "claims"}: a JWT signed with that test key (header fields
//                  override alg/kid/typ; "alg":"none" and "HS256" are honoured as given, the latter
//                  keyed with the public key's PEM, the classic confusion attack)
//   /_test/rotate  {"keys":[kid…]}: serve a JWKS of just those keys from now on (and sign with the first)
//   /_test/stats   {}: {"jwks_fetches": n}

import { createHmac, createPublicKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { importJWK, SignJWT } from 'jose';
import Provider from 'oidc-provider';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const KEYS = JSON.parse(readFileSync(process.env.OIDC_TEST_KEYS || path.join(HERE, 'test-keys.json'), 'utf8'));
const redirectUri = process.argv[2];
const wantPort = Number(process.argv[3] || 0);
if (!redirectUri) {
        console.error('usage: node provider.mjs REDIRECT_URI [PORT]');
        process.exit(2);
}

let jwksFetches = 0;
let provider = null;
let issuer = null;

function publicJwk(kid) {
        const { d, p, q, dp, dq, qi, ...pub } = KEYS[kid];
        return pub;
}

function makeProvider(kids) {
        const p = new Provider(issuer, {
                jwks: { keys: kids.map((k) => KEYS[k]) },
                clients: [
                        {
                                client_id: 'vm-manager',
                                client_secret: 'dex-secret',
                                redirect_uris: [redirectUri],
                                grant_types: ['authorization_code'],
                                response_types: ['code'],
                                token_endpoint_auth_method: 'client_secret_basic',
                                id_token_signed_response_alg: KEYS[kids[0]].alg,
                        },
                        {
                                client_id: 'svc',
                                client_secret: 'svc-secret',
                                redirect_uris: [],
                                grant_types: ['client_credentials'],
                                response_types: [],
                        },
                ],
                claims: {
                        openid: ['sub'],
                        email: ['email', 'email_verified'],
                        profile: ['name'],
                        groups: ['groups'],
                },
                scopes: ['openid', 'offline_access', 'email', 'profile', 'groups', 'vm:read'],
                conformIdTokenClaims: false,
                pkce: { required: () => true },
                findAccount: (ctx, id) => ({
                        accountId: id,
                        claims: () => ({
                                sub: id,
                                email: `${id}@example.test`,
                                email_verified: true,
                                name: id,
                                groups: ['vm-admins', `${id}-team`],
                        }),
                }),
                features: {
                        devInteractions: { enabled: true },
                        clientCredentials: { enabled: true },
                        resourceIndicators: {
                                enabled: true,
                                defaultResource: () => undefined,
                                useGrantedResource: () => true,
                                getResourceServerInfo: (ctx, resource) => ({
                                        scope: 'vm:read',
                                        audience: resource,
                                        accessTokenFormat: 'jwt',
                                        jwt: { sign: { alg: KEYS[kids[0]].alg } },
                                }),
                        },
                },
                ttl: { AccessToken: 600, ClientCredentials: 600, IdToken: 600 },
        });
        p.on('server_error', (ctx, err) => console.error('provider server_error:', err));
        return p;
}

async function mint(spec) {
        const key = KEYS[spec.kid];
        const header = { alg: key.alg, kid: spec.kid, typ: 'JWT', ...(spec.header || {}) };
        const enc = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
        if (header.alg === 'none')
                return `${enc(header)}.${enc(spec.claims)}.`;
        if (header.alg === 'HS256') {
                // the confusion attack: the RSA public key's PEM as the HMAC secret
                const pem = createPublicKey({ key: publicJwk(spec.kid), format: 'jwk' }).export({ type: 'spki', format: 'pem' });
                const input = `${enc(header)}.${enc(spec.claims)}`;
                return `${input}.${createHmac('sha256', pem).update(input).digest('base64url')}`;
        }
        return new SignJWT(spec.claims).setProtectedHeader(header).sign(await importJWK(key, key.alg));
}

function readBody(req) {
        return new Promise((resolve, reject) => {
                const chunks = [];
                req.on('data', (c) => chunks.push(c));
                req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
                req.on('error', reject);
        });
}

async function control(req, res) {
        const body = JSON.parse((await readBody(req)) || '{}');
        let answer;
        if (req.url === '/_test/mint')
                answer = { token: await mint(body) };
        else if (req.url === '/_test/rotate') {
                provider = makeProvider(body.keys);
                answer = { keys: body.keys };
        } else if (req.url === '/_test/stats')
                answer = { jwks_fetches: jwksFetches };
        else {
                res.writeHead(404).end();
                return;
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answer));
}

const tls = process.env.OIDC_TLS_CERT && process.env.OIDC_TLS_KEY ?
        { cert: readFileSync(process.env.OIDC_TLS_CERT), key: readFileSync(process.env.OIDC_TLS_KEY) } : null;
const handler = (req, res) => {
        if (req.url.startsWith('/_test/')) {
                control(req, res).catch((e) => {
                        res.writeHead(500).end(String(e && e.stack));
                });
                return;
        }
        if (req.url.startsWith('/jwks'))
                jwksFetches++;
        provider.callback()(req, res);
};
const server = tls ? https.createServer(tls, handler) : http.createServer(handler);

server.listen(wantPort, '127.0.0.1', () => {
        const port = server.address().port;
        issuer = `${tls ? 'https' : 'http'}://127.0.0.1:${port}`;
        provider = makeProvider(['test-rsa-1', 'test-ec-1']);
        console.log(`READY ${port}`);
});

for (const sig of ['SIGTERM', 'SIGINT'])
        process.on(sig, () => server.close(() => process.exit(0)));

// SPDX-License-Identifier: LGPL-2.1-or-later
//
// The whole OAuth flow of an MCP client against vm-manager, driven by the official TypeScript SDK
// (@modelcontextprotocol/sdk): the 401 and its resource_metadata, protected-resource and
// authorization-server discovery, dynamic registration, authorization code + PKCE through
// vm-manager's authorization server to the OpenID provider (provider.mjs, whose login and consent
// pages are posted headlessly) and back, the token, tool calls, and a refresh that rotates the
// refresh token. Prints TAP version 13.
//
// usage: node flow.mjs MCP_URL OUT_JSON
//   OUT_JSON  written at the end: {"tokens", "rotated", "client", "vm"} for the checks test-oauth.py
//             runs next (replay of the rotated refresh token, restart)
//
// Bare imports resolve from the node_modules next to this file (test-oauth.py copies it there).

import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import http from 'node:http';

import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const mcpUrl = new URL(process.argv[2]);
const outPath = process.argv[3];
const LOGIN = 'alice';
const DEADLINE_MS = 60000;

let n = 0;
let failed = 0;

function diag(text) {
        for (const line of String(text).split('\n'))
                console.log('# ' + line);
}

async function check(name, fn) {
        n++;
        try {
                const note = await fn();
                console.log(`ok ${n} - ${name}`);
                if (note)
                        diag(note);
                return true;
        } catch (e) {
                failed++;
                console.log(`not ok ${n} - ${name}`);
                diag(e && e.stack ? e.stack : String(e));
                return false;
        }
}

function payload(jwt) {
        return JSON.parse(Buffer.from(jwt.split('.')[1], 'base64url').toString('utf8'));
}

function header(jwt) {
        return JSON.parse(Buffer.from(jwt.split('.')[0], 'base64url').toString('utf8'));
}

// The client's redirect URI: a loopback listener, as a native MCP client has. The browser below
// never reaches it: it stops at its URL and hands the code over.
const redirectServer = http.createServer((req, res) => res.writeHead(404).end());
await new Promise((resolve) => redirectServer.listen(0, '127.0.0.1', resolve));
const redirectUrl = `http://127.0.0.1:${redirectServer.address().port}/callback`;

class TestAuthProvider {
        constructor() {
                this.client = undefined;
                this.saved = undefined;
                this.verifier = undefined;
                this.authorizationUrl = undefined;
                this.saveCount = 0;
        }
        get redirectUrl() {
                return redirectUrl;
        }
        get clientMetadata() {
                return {
                        client_name: 'vm-manager oauth test',
                        redirect_uris: [redirectUrl],
                        grant_types: ['authorization_code', 'refresh_token'],
                        response_types: ['code'],
                        token_endpoint_auth_method: 'none',
                };
        }
        clientInformation() {
                return this.client;
        }
        saveClientInformation(info) {
                this.client = info;
        }
        tokens() {
                return this.saved;
        }
        saveTokens(tokens) {
                this.saved = tokens;
                this.saveCount++;
        }
        redirectToAuthorization(url) {
                this.authorizationUrl = url;
        }
        saveCodeVerifier(v) {
                this.verifier = v;
        }
        codeVerifier() {
                return this.verifier;
        }
}

// A browser without a screen: follows redirects with a cookie jar, posts the provider's login
// and consent forms, and stops at the client's redirect URI.
async function browse(start) {
        const jar = new Map();
        const hops = [];
        let url = String(start);
        for (let i = 0; i < 25; i++) {
                if (url.startsWith(redirectUrl))
                        return { url: new URL(url), hops };
                let res = await fetch(url, { redirect: 'manual', headers: { cookie: cookieHeader(jar) } });
                keepCookies(jar, res);
                hops.push(`${res.status} ${url}`);
                if (res.status >= 300 && res.status < 400) {
                        url = new URL(res.headers.get('location'), url).href;
                        continue;
                }
                const html = await res.text();
                const action = html.match(/<form[^>]*action="([^"]+)"/);
                const prompt = html.match(/name="prompt" value="(\w+)"/);
                if (res.status !== 200 || !action || !prompt)
                        throw new Error(`no form at ${url} (status ${res.status}): ${html.slice(0, 400)}`);
                const body = new URLSearchParams({ prompt: prompt[1] });
                if (prompt[1] === 'login') {
                        body.set('login', LOGIN);
                        body.set('password', 'any');
                }
                const target = new URL(action[1].replace(/&amp;/g, '&'), url).href;
                res = await fetch(target, {
                        method: 'POST',
                        redirect: 'manual',
                        headers: { cookie: cookieHeader(jar), 'content-type': 'application/x-www-form-urlencoded' },
                        body,
                });
                keepCookies(jar, res);
                hops.push(`${res.status} POST ${target} (${prompt[1]})`);
                if (res.status < 300 || res.status >= 400)
                        throw new Error(`posting ${prompt[1]} gave ${res.status}: ${(await res.text()).slice(0, 400)}`);
                url = new URL(res.headers.get('location'), target).href;
        }
        throw new Error('too many hops:\n' + hops.join('\n'));
}

function cookieHeader(jar) {
        return [...jar].map(([k, v]) => `${k}=${v}`).join('; ');
}

function keepCookies(jar, res) {
        for (const c of res.headers.getSetCookie()) {
                const [pair] = c.split(';');
                const eq = pair.indexOf('=');
                jar.set(pair.slice(0, eq).trim(), pair.slice(eq + 1));
        }
}

function textOf(result) {
        assert.equal(result.isError, undefined, JSON.stringify(result).slice(0, 400));
        return JSON.parse(result.content[0].text);
}

async function connect(provider) {
        const client = new Client({ name: 'vm-manager-oauth-test', version: '0.0.0' });
        const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider });
        await client.connect(transport);
        return { client, transport };
}

async function main() {
        const provider = new TestAuthProvider();
        const out = {};
        let session = null;

        const started = await check('an unauthenticated connect is refused; the SDK discovers and registers, then asks for the login', async () => {
                const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider });
                const client = new Client({ name: 'vm-manager-oauth-test', version: '0.0.0' });
                await assert.rejects(client.connect(transport), UnauthorizedError);
                assert.ok(provider.client && provider.client.client_id, 'registered a client');
                assert.equal(provider.client.token_endpoint_auth_method, 'none');
                assert.ok(provider.authorizationUrl, 'asked to open the authorization URL');
                const u = provider.authorizationUrl;
                assert.equal(`${u.origin}${u.pathname}`, `${mcpUrl.origin}/oauth/authorize`);
                assert.equal(u.searchParams.get('code_challenge_method'), 'S256');
                assert.equal(u.searchParams.get('resource'), mcpUrl.href);
                out.transport = transport;
                return `client ${provider.client.client_id}; resource ${u.searchParams.get('resource')}`;
        });
        if (!started)
                return out;

        let code;
        await check('the login goes to the OpenID provider and comes back with a code (login and consent posted headlessly)', async () => {
                const { url, hops } = await browse(provider.authorizationUrl);
                code = url.searchParams.get('code');
                assert.ok(code, `no code in ${url}`);
                assert.equal(url.searchParams.get('iss'), mcpUrl.origin);
                assert.ok(hops.some((h) => h.includes('/oauth/callback')), 'passed through vm-manager\'s callback');
                return hops.map((h) => h.replace(/\?.*/, '?…')).join(' → ');
        });
        if (!code)
                return out;

        await check('finishAuth redeems the code: an at+jwt access token for the resource, with the user\'s identity', async () => {
                await out.transport.finishAuth(code);
                const t = provider.saved;
                assert.ok(t && t.access_token && t.refresh_token, JSON.stringify(t));
                const h = header(t.access_token), p = payload(t.access_token);
                assert.equal(h.alg, 'ES256');
                assert.equal(h.typ, 'at+jwt');
                assert.equal(p.iss, mcpUrl.origin);
                assert.equal(p.aud, mcpUrl.href);
                assert.equal(p.sub, LOGIN);
                assert.equal(p.email, `${LOGIN}@example.test`);
                assert.deepEqual(p.groups, ['vm-admins', `${LOGIN}-team`]);
                assert.ok(p.exp - p.iat <= 3600, 'short-lived');
                out.first = { ...t };
                return `expires_in ${t.expires_in}`;
        });

        await check('with the token: initialize, tools/list, list_networks', async () => {
                session = await connect(provider);
                const { tools } = await session.client.listTools();
                assert.ok(tools.some((t) => t.name === 'create_vm'));
                const nets = textOf(await session.client.callTool({ name: 'list_networks', arguments: {} }));
                assert.ok(Array.isArray(nets));
                return `${tools.length} tools, ${nets.length} network(s)`;
        });

        await check('create_vm through MCP records the caller as createdBy', async () => {
                const vm = textOf(await session.client.callTool({
                        name: 'create_vm',
                        arguments: { name: 'oauth-sdk', image: 'fake_1.0', memory_mib: 512, disk_gib: 2, require_attestation: false, wait_for: 'none' },
                }));
                assert.deepEqual(vm.createdBy, { subject: LOGIN, email: `${LOGIN}@example.test` });
                const got = textOf(await session.client.callTool({ name: 'get_vm', arguments: { id: vm.id } }));
                assert.deepEqual(got.createdBy, vm.createdBy);
                out.vm = vm.id;
                return `vm ${vm.id}`;
        });

        await check('an access token the server refuses is refreshed by the SDK: the refresh token rotates', async () => {
                const before = { ...provider.saved };
                provider.saved = { ...before, access_token: 'not-a-token' };
                const nets = textOf(await session.client.callTool({ name: 'list_networks', arguments: {} }));
                assert.ok(Array.isArray(nets));
                const after = provider.saved;
                assert.notEqual(after.access_token, 'not-a-token');
                assert.notEqual(after.refresh_token, before.refresh_token, 'a new refresh token');
                out.rotated = before.refresh_token;
                out.tokens = after;
        });

        await session.transport.close().catch(() => {});
        out.client = provider.client;
        delete out.transport;
        return out;
}

const timer = setTimeout(() => {
        console.log('Bail out! flow.mjs ran out of its deadline');
        process.exit(1);
}, DEADLINE_MS);

let out = {};
try {
        out = await main();
} catch (e) {
        failed++;
        console.log(`not ok ${++n} - unexpected exception`);
        diag(e && e.stack ? e.stack : String(e));
}
clearTimeout(timer);
redirectServer.close();
if (outPath)
        writeFileSync(outPath, JSON.stringify(out, null, 2));
console.log(`1..${n}`);
process.exit(failed ? 1 : 0);

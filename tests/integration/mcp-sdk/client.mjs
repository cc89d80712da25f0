// SPDX-License-Identifier: LGPL-2.1-or-later
//
// vm-manager's MCP endpoint driven by the official TypeScript SDK (@modelcontextprotocol/sdk, pinned
// in package.json) as a real client would: initialize, tools/list, get_host, list_images,
// create_network, get_network, list_networks, delete_network, get_network again, then DELETE of the
// session and close(). Prints TAP version 13 (one line per group of assertions) and exits non-zero
// when any group fails.
//
// usage: node client.mjs PORT|URL      (else $VM_MANAGER_MCP_URL, else $VM_MANAGER_MCP_PORT)
//
// Bare imports resolve from the node_modules next to this file: tests/integration/test-mcp-sdk.py
// copies it into the directory where it ran `npm ci`.

import assert from 'node:assert/strict';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { LATEST_PROTOCOL_VERSION } from '@modelcontextprotocol/sdk/types.js';

const REQUEST_TIMEOUT_MS = 10000;
const DEADLINE_MS = 45000; // test-mcp-sdk.py kills the client after 50 s
// The daemon ends the GET stream as it handles the DELETE; 2 s is generous, and shorter than the
// 4 s after which node's fetch closes idle keep-alive connections (which would wake a stuck server).
const STREAM_END_MS = 2000;

// The protocol version vm-manager answers when the client asks for it: the newest both speak
// (MCP_LATEST_VERSION in src/mcp/mcp-server.c).
const EXPECTED_PROTOCOL_VERSION = '2025-11-25';

const READ_ONLY = { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false };
const EXPECTED_TOOLS = {
        get_info: READ_ONLY,
        get_host: READ_ONLY,
        list_images: READ_ONLY,
        get_image: READ_ONLY,
        list_networks: READ_ONLY,
        get_network: READ_ONLY,
        create_network: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
        delete_network: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
};

const NET = { name: 'sdk-net', cidr: '10.77.0.0/24', gateway: '10.77.0.1' };

// ---------------------------------------------------------------------------------------------
// TAP

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

function finish() {
        console.log(`1..${n}`);
        process.exitCode = failed ? 1 : 0;
}

function withTimeout(promise, ms, what) {
        let timer;
        return Promise.race([
                promise.finally(() => clearTimeout(timer)),
                new Promise((_, reject) => {
                        timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms);
                }),
        ]);
}

// ---------------------------------------------------------------------------------------------
// what the transport does on the wire

function targetUrl() {
        const arg = process.argv[2] || process.env.VM_MANAGER_MCP_URL || process.env.VM_MANAGER_MCP_PORT;
        if (!arg)
                throw new Error('usage: node client.mjs PORT|URL (or set VM_MANAGER_MCP_URL or VM_MANAGER_MCP_PORT)');
        return /^\d+$/.test(arg) ? new URL(`http://127.0.0.1:${arg}/mcp`) : new URL(arg);
}

// A fetch that records every exchange and notices when the daemon ends the GET (SSE) stream.
function recordingFetch(log) {
        let getOpened, getEnded;
        log.getOpened = new Promise(resolve => (getOpened = resolve));
        log.getEnded = new Promise(resolve => (getEnded = resolve));
        return async (url, init = {}) => {
                const method = (init.method || 'GET').toUpperCase();
                const entry = { method, sessionHeader: new Headers(init.headers).get('mcp-session-id') };
                log.push(entry);
                const response = await fetch(url, init);
                entry.status = response.status;
                entry.contentType = response.headers.get('content-type');
                if (method !== 'GET' || !response.ok || !response.body)
                        return response;
                // The GET stream: pass the body through a transform whose flush() runs when the
                // server ends the stream (and not when the client aborts it).
                getOpened(entry);
                const body = response.body.pipeThrough(
                        new TransformStream({
                                flush() {
                                        entry.ended = 'by the server';
                                        getEnded(entry);
                                },
                        }),
                );
                const { status, statusText, headers } = response;
                return new Response(body, { status, statusText, headers });
        };
}

function text(result) {
        assert.ok(Array.isArray(result.content) && result.content.length > 0, 'content is a non-empty array');
        assert.equal(result.content[0].type, 'text');
        return result.content[0].text;
}

// A successful tools/call: structuredContent, and the same resource as JSON text.
function ok(result, what) {
        assert.notEqual(result.isError, true, `${what} failed: ${result.content?.[0]?.text}`);
        assert.equal(typeof result.structuredContent, 'object', `${what}: structuredContent is an object`);
        return result.structuredContent;
}

// ---------------------------------------------------------------------------------------------

async function main() {
        console.log('TAP version 13');
        const watchdog = setTimeout(() => {
                console.log(`Bail out! the client ran out of its ${DEADLINE_MS / 1000} s budget`);
                process.exit(2);
        }, DEADLINE_MS);
        watchdog.unref();

        const url = targetUrl();
        diag(`endpoint: ${url}`);
        diag(`SDK protocol version: ${LATEST_PROTOCOL_VERSION}`);

        const wire = [];
        const errors = [];
        let closing = false;
        let closed = false;
        const transport = new StreamableHTTPClientTransport(url, { fetch: recordingFetch(wire) });
        const client = new Client({ name: 'vm-manager-sdk-test', version: '0.0.0' }, { capabilities: {} });
        client.onerror = e => errors.push({ closing, error: e });
        client.onclose = () => {
                closed = true;
        };
        const opts = { timeout: REQUEST_TIMEOUT_MS };
        const call = (name, args) => client.callTool({ name, arguments: args }, undefined, opts);

        const connected = await check('initialize: connects, serverInfo.name is "vm-manager"', async () => {
                await client.connect(transport, opts);
                const info = client.getServerVersion();
                assert.equal(info?.name, 'vm-manager');
                assert.equal(typeof info.version, 'string');
                assert.ok(client.getServerCapabilities()?.tools, 'capabilities.tools present');
                return `serverInfo: ${JSON.stringify(info)}`;
        });
        if (!connected) {
                console.log('Bail out! initialize failed');
                await transport.close().catch(() => {});
                process.exitCode = 1;
                return;
        }

        await check('initialize: instructions say to call get_host first', () => {
                const instructions = client.getInstructions();
                assert.equal(typeof instructions, 'string');
                assert.match(instructions, /Call get_host first/);
        });

        await check(`initialize: negotiated protocol version ${EXPECTED_PROTOCOL_VERSION}, session id issued`, () => {
                assert.equal(transport.protocolVersion, EXPECTED_PROTOCOL_VERSION);
                assert.equal(transport.protocolVersion, LATEST_PROTOCOL_VERSION);
                assert.match(transport.sessionId ?? '', /^[0-9a-f]{32}$/);
                const init = wire[0];
                assert.equal(init.method, 'POST');
                assert.equal(init.status, 200);
                return `session ${transport.sessionId}`;
        });

        // The transport opens the GET stream on its own once notifications/initialized was accepted.
        await check('GET stream: opened after notifications/initialized (200 text/event-stream)', async () => {
                const get = await withTimeout(wire.getOpened, 5000, 'GET stream');
                assert.equal(get.status, 200);
                assert.match(get.contentType ?? '', /^text\/event-stream/);
                assert.equal(get.sessionHeader, transport.sessionId);
        });

        let tools = {};
        await check('tools/list: lists the eight tools of this test', async () => {
                const result = await client.listTools(undefined, opts);
                tools = Object.fromEntries(result.tools.map(t => [t.name, t]));
                for (const name of Object.keys(EXPECTED_TOOLS))
                        assert.ok(tools[name], `tool ${name} listed`);
                return `tools: ${result.tools.map(t => t.name).join(' ')}`;
        });
        for (const [name, hints] of Object.entries(EXPECTED_TOOLS))
                await check(`tools/list: ${name} annotations ${JSON.stringify(hints)}`, () => {
                        assert.ok(tools[name], `tool ${name} listed`);
                        assert.equal(typeof tools[name].description, 'string');
                        assert.deepEqual(tools[name].annotations, hints);
                        assert.equal(tools[name].inputSchema?.type, 'object');
                });
        await check('tools/list: create_network inputSchema requires ["name","cidr"]', () => {
                const schema = tools.create_network?.inputSchema;
                assert.ok(schema, 'create_network listed');
                assert.deepEqual(schema.required, ['name', 'cidr']);
                assert.equal(schema.properties?.name?.type, 'string');
                assert.equal(schema.properties?.cidr?.type, 'string');
        });

        await check('get_host: structuredContent.ready is a boolean, accelerator.selected set', async () => {
                const host = ok(await call('get_host', {}), 'get_host');
                assert.equal(typeof host.ready, 'boolean');
                assert.equal(typeof host.accelerator?.selected, 'string');
                return `ready=${host.ready} accelerator=${host.accelerator.selected}`;
        });

        await check('list_images: structuredContent.images is an array', async () => {
                const result = await call('list_images', {});
                const images = ok(result, 'list_images').images;
                assert.ok(Array.isArray(images), 'images is an array');
                assert.deepEqual(JSON.parse(text(result)), images);
                return `${images.length} image(s)`;
        });

        let created;
        await check(`create_network ${NET.name} ${NET.cidr}: gateway ${NET.gateway}`, async () => {
                const result = await call('create_network', { name: NET.name, cidr: NET.cidr });
                created = ok(result, 'create_network');
                assert.equal(created.spec?.name, NET.name);
                assert.equal(created.spec?.cidr, NET.cidr);
                assert.equal(created.gateway, NET.gateway);
                assert.deepEqual(created.leases, []);
                assert.deepEqual(JSON.parse(text(result)), created);
        });

        await check(`get_network ${NET.name}: the network create_network returned`, async () => {
                const net = ok(await call('get_network', { name: NET.name }), 'get_network');
                assert.deepEqual(net, created);
        });

        await check(`list_networks: includes default and ${NET.name}`, async () => {
                const nets = ok(await call('list_networks', {}), 'list_networks').networks;
                assert.ok(Array.isArray(nets), 'networks is an array');
                const names = nets.map(x => x.spec?.name);
                assert.ok(names.includes('default'), `default in ${names}`);
                assert.ok(names.includes(NET.name), `${NET.name} in ${names}`);
                return `networks: ${names.join(' ')}`;
        });

        await check(`delete_network ${NET.name}: {id, deleted: true}`, async () => {
                const gone = ok(await call('delete_network', { name: NET.name }), 'delete_network');
                assert.deepEqual(gone, { id: NET.name, deleted: true });
        });

        await check(`get_network ${NET.name} after delete: isError, text "not_found: ..."`, async () => {
                const result = await call('get_network', { name: NET.name });
                assert.equal(result.isError, true);
                assert.ok(text(result).startsWith('not_found:'), `text: ${text(result)}`);
                return text(result);
        });

        await check('no transport or protocol error while the session was open', () => {
                assert.deepEqual(errors.map(x => String(x.error?.stack ?? x.error)), []);
        });

        // Leave: DELETE the session (the daemon ends the GET stream with it), then close().
        const sessionId = transport.sessionId;
        const leave = `terminateSession: DELETE answered 2xx, the daemon ends the GET stream within ${STREAM_END_MS / 1000} s`;
        await check(leave, async () => {
                await transport.terminateSession();
                const del = wire.findLast(x => x.method === 'DELETE');
                assert.ok(del, 'a DELETE was sent');
                assert.ok(del.status >= 200 && del.status < 300, `DELETE status ${del.status}`);
                assert.equal(del.sessionHeader, sessionId);
                assert.equal(transport.sessionId, undefined);
                await withTimeout(wire.getEnded, STREAM_END_MS, 'end of the GET stream after the DELETE');
                return `DELETE ${del.status}`;
        });

        await check('close(): resolves, onclose fires, no error', async () => {
                closing = true;
                await withTimeout(client.close(), 5000, 'close()');
                assert.equal(closed, true, 'onclose called');
                // A GET stream the daemon already ended must not be reopened once closed; an
                // abort of our own is not an error of the server.
                const aborted = x => /abort/i.test(String(x.error?.name) + String(x.error?.message));
                const bad = errors.filter(x => x.closing && !aborted(x));
                assert.deepEqual(bad.map(x => String(x.error?.stack ?? x.error)), []);
                assert.equal(wire.filter(x => x.method === 'GET').length, 1, 'one GET stream in all');
        });

        await check('the deleted session is gone: POST with its id answers 404', async () => {
                const r = await fetch(url, {
                        method: 'POST',
                        headers: {
                                'content-type': 'application/json',
                                accept: 'application/json, text/event-stream',
                                'mcp-session-id': sessionId,
                                'mcp-protocol-version': EXPECTED_PROTOCOL_VERSION,
                        },
                        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
                });
                await r.body?.cancel();
                assert.equal(r.status, 404);
        });

        diag('wire: ' + wire.map(x => `${x.method} ${x.status}${x.ended ? ` (ended ${x.ended})` : ''}`).join(', '));
        finish();
}

main().catch(e => {
        console.log('Bail out! ' + String(e?.message ?? e).split('\n')[0]);
        diag(e?.stack ?? String(e));
        process.exitCode = 1;
});

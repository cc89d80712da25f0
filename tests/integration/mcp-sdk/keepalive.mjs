// SPDX-License-Identifier: LGPL-2.1-or-later
//
// A long tools/call through the official TypeScript SDK whose fetch gives up on silence, as Node's
// does (undici: 300 s for the headers and between two pieces of a body) and as proxies do, here
// after 30 s. create_vm waits for ready against a fake guest that sends READY=1 90 s after its
// installed boot started (tests/integration/fakes, FAKE_READY_AFTER=90):
//
//   PORT_KEEPALIVE: a daemon with the default --mcp-keepalive (15 s). With and without a progress
//     token the call gets its result (state ready) after about 90 s, and neither its stream nor the
//     session's GET stream times out.
//   PORT_SILENT: the same daemon with --mcp-keepalive 60s, keep-alives too rare for this client:
//     the same calls fail, each with a body timeout about 30 s into its stream. This is what every
//     such call did before keep-alives existed, and it shows that the first half can fail.
//
// usage: node keepalive.mjs PORT_KEEPALIVE PORT_SILENT
// Prints TAP version 13 and exits non-zero when a check fails. Bare imports resolve from the
// node_modules next to this file (test-mcp-sdk.py copies it into the npm cache directory).

import assert from 'node:assert/strict';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Agent, fetch as undiciFetch } from 'undici';

const IDLE_TIMEOUT_MS = 30000; // the client's patience with silence: headers and body alike
const READY_AFTER_S = 90; // FAKE_READY_AFTER of the daemons under test
const CALL_TIMEOUT_MS = 150000; // the SDK's own request timeout (its default, 60 s, is too short)
const DEADLINE_MS = 170000; // test-mcp-sdk.py kills the client after 180 s
const CREATE = { memory_mib: 512, disk_gib: 1, require_attestation: false, wait_for: 'ready' };

let n = 0;
let failed = 0;

function diag(text) {
        for (const line of String(text).split('\n'))
                console.log('# ' + line);
}

function report(ok, name, note) {
        n++;
        if (!ok)
                failed++;
        console.log(`${ok ? 'ok' : 'not ok'} ${n} - ${name}`);
        if (note)
                diag(note);
}

// undici's fetch with an idle timeout of its own. Every timeout is recorded with the time it hit
// (the SDK turns a broken stream into an error message without its cause).
function impatientFetch(timeouts, t0) {
        const dispatcher = new Agent({ headersTimeout: IDLE_TIMEOUT_MS, bodyTimeout: IDLE_TIMEOUT_MS });
        const record = (e, where) => {
                const code = e?.cause?.code ?? e?.code;
                if (code === 'UND_ERR_BODY_TIMEOUT' || code === 'UND_ERR_HEADERS_TIMEOUT')
                        timeouts.push({ code, where, at: (Date.now() - t0) / 1000 });
        };
        return async (url, init = {}) => {
                const method = (init.method || 'GET').toUpperCase();
                let response;
                try {
                        response = await undiciFetch(url, { ...init, dispatcher });
                } catch (e) {
                        record(e, method);
                        throw e;
                }
                if (!response.body)
                        return response;
                // Pass the body through, noting why it broke off if it does.
                const reader = response.body.getReader();
                const body = new ReadableStream({
                        async pull(controller) {
                                try {
                                        const { value, done } = await reader.read();
                                        if (done)
                                                controller.close();
                                        else
                                                controller.enqueue(value);
                                } catch (e) {
                                        record(e, `${method} body`);
                                        controller.error(e);
                                }
                        },
                        cancel(reason) {
                                return reader.cancel(reason);
                        },
                });
                const { status, statusText, headers } = response;
                return new Response(body, { status, statusText, headers });
        };
}

// One session, one create_vm: { result, error, progress, timeouts, transportErrors, seconds }.
async function longCall(port, name, withProgress, abortOnTimeout) {
        const t0 = Date.now();
        const out = { progress: [], timeouts: [], transportErrors: [] };
        const transport = new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`), {
                fetch: impatientFetch(out.timeouts, t0),
        });
        const client = new Client({ name: 'vm-manager-keepalive-test', version: '0.0.0' }, { capabilities: {} });
        let closing = false; // close() aborts the GET stream: not an error of the server
        client.onerror = e => closing || out.transportErrors.push(String(e?.message ?? e));
        const abort = new AbortController();
        // A call whose stream timed out never gets its answer: stop waiting once that happened.
        const watch = setInterval(() => {
                if (abortOnTimeout && out.timeouts.some(t => t.where !== 'GET body'))
                        abort.abort(new Error('the stream of the call timed out'));
        }, 250);
        try {
                await client.connect(transport);
                const options = { timeout: CALL_TIMEOUT_MS, signal: abort.signal };
                if (withProgress)
                        options.onprogress = p => out.progress.push(p.message);
                out.result = await client.callTool({ name: 'create_vm', arguments: { ...CREATE, name } }, undefined, options);
        } catch (e) {
                out.error = String(e?.message ?? e);
        } finally {
                clearInterval(watch);
                out.seconds = (Date.now() - t0) / 1000;
                closing = true;
                await client.close().catch(() => {});
        }
        return out;
}

function describe(x) {
        const state = x.result?.structuredContent?.state;
        return [
                `after ${x.seconds.toFixed(1)} s: ${x.result ? `result, state ${state}` : `error ${x.error}`}`,
                `progress: ${JSON.stringify(x.progress)}`,
                `timeouts: ${JSON.stringify(x.timeouts)}`,
                `transport errors: ${JSON.stringify(x.transportErrors)}`,
        ].join('\n');
}

async function main() {
        console.log('TAP version 13');
        const watchdog = setTimeout(() => {
                console.log(`Bail out! the client ran out of its ${DEADLINE_MS / 1000} s budget`);
                process.exit(2);
        }, DEADLINE_MS);
        watchdog.unref();

        const [portKeepalive, portSilent] = process.argv.slice(2);
        if (!portKeepalive || !portSilent)
                throw new Error('usage: node keepalive.mjs PORT_KEEPALIVE PORT_SILENT');
        diag(`client idle timeout ${IDLE_TIMEOUT_MS / 1000} s (undici headersTimeout and bodyTimeout); guests ready after ${READY_AFTER_S} s`);

        // All four side by side: the test takes one guest's 90 s, not four.
        const [withToken, withoutToken, silentWithToken, silentWithoutToken] = await Promise.all([
                longCall(portKeepalive, 'ka-progress', true, false),
                longCall(portKeepalive, 'ka-plain', false, false),
                longCall(portSilent, 'silent-progress', true, true),
                longCall(portSilent, 'silent-plain', false, true),
        ]);

        for (const [x, label] of [
                [withToken, 'with a progress token'],
                [withoutToken, 'without a progress token'],
        ]) {
                let ok = true;
                try {
                        assert.ok(x.result, 'a result');
                        assert.notEqual(x.result.isError, true, 'not an error');
                        assert.equal(x.result.structuredContent?.state, 'ready');
                        assert.ok(x.seconds >= READY_AFTER_S - 1, 'waited for the guest, longer than the idle timeout');
                        assert.deepEqual(x.timeouts, [], 'no idle timeout, neither on the call nor on the GET stream');
                        assert.deepEqual(x.transportErrors, []);
                        if (x === withToken)
                                assert.ok(x.progress.some(m => /is installing$/.test(m)), 'progress: installing');
                } catch (e) {
                        ok = false;
                        diag(e.message);
                }
                report(ok, `keep-alives: create_vm (ready after ${READY_AFTER_S} s) ${label}, client idle timeout ${IDLE_TIMEOUT_MS / 1000} s: the result, state ready, no timeout`, describe(x));
        }

        for (const [x, label] of [
                [silentWithToken, 'with a progress token'],
                [silentWithoutToken, 'without a progress token'],
        ]) {
                let ok = true;
                try {
                        assert.equal(x.result, undefined, 'no result');
                        const call = x.timeouts.filter(t => t.where !== 'GET body');
                        assert.equal(call.length, 1, 'the call timed out once');
                        assert.equal(call[0].code, 'UND_ERR_BODY_TIMEOUT');
                        assert.ok(call[0].at >= IDLE_TIMEOUT_MS / 1000 && call[0].at < IDLE_TIMEOUT_MS / 1000 + 10, `timed out after ${call[0].at} s`);
                } catch (e) {
                        ok = false;
                        diag(e.message);
                }
                report(ok, `the same ${label} with --mcp-keepalive 60s (longer than the client's idle timeout): fails with a body timeout after ${IDLE_TIMEOUT_MS / 1000} s`, describe(x));
        }

        console.log(`1..${n}`);
        process.exitCode = failed ? 1 : 0;
}

main().catch(e => {
        console.log('Bail out! ' + String(e?.message ?? e).split('\n')[0]);
        diag(e?.stack ?? String(e));
        process.exitCode = 1;
});

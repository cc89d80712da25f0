// SPDX-License-Identifier: LGPL-2.1-or-later
// A durable task through the official TypeScript SDK v2 pinned to revision 2026-07-28: create_vm as a
// task of the Tasks extension (io.modelcontextprotocol/tasks), the daemon restarted while it works,
// the finished task read afterwards by a new client. The SDK 2.4.0 has no helpers for the extension:
// its Client refuses a tools/call answered with resultType "task" ("Unsupported result type") and
// tasks/get toward a 2026-07-28 peer. So the Client negotiates the era and calls the plain tools,
// and the task's requests go as raw JSON-RPC through the SDK's StreamableHTTPClientTransport (which
// derives MCP-Protocol-Version, Mcp-Method and Mcp-Name from each message's envelope).
//
// usage: node task-restart-v2.mjs URL
// Prints "# task <id> <status>" once the task is working, then waits for a line on stdin (the test
// restarts the daemon meanwhile), then follows the task to its end with a new client. Prints TAP.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createInterface } from 'node:readline';

const url = new URL(process.argv[2]);
const TASKS = 'io.modelcontextprotocol/tasks';
let n = 0;
let failed = 0;

function ok(cond, name, diag) {
        n++;
        if (!cond) failed++;
        console.log(`${cond ? 'ok' : 'not ok'} ${n} - ${name}`);
        if (!cond && diag) for (const line of String(diag).split('\n')) console.log(`# ${line}`);
}

setTimeout(() => {
        console.log('Bail out! task-restart-v2.mjs took longer than 150 s');
        process.exit(2);
}, 150_000).unref();

const wire = [];
const fetchSpy = async (input, init) => {
        const headers = new Headers(init?.headers);
        const body = init?.body ? JSON.parse(init.body) : undefined;
        wire.push({
                version: headers.get('mcp-protocol-version'),
                method: headers.get('mcp-method'),
                name: headers.get('mcp-name'),
                body,
        });
        return fetch(input, init);
};

async function connect() {
        const client = new Client(
                { name: 'vm-manager-task-test', version: '0.0.0' },
                { capabilities: {}, versionNegotiation: { mode: { pin: '2026-07-28' } } },
        );
        await client.connect(new StreamableHTTPClientTransport(url, { fetch: fetchSpy }));
        return client;
}

// Raw requests on the SDK's client transport, the envelope of 2026-07-28 declaring the extension.
async function rawTransport() {
        const transport = new StreamableHTTPClientTransport(url, { fetch: fetchSpy });
        const pending = new Map();
        let next = 1;
        transport.onmessage = (m) => {
                const done = pending.get(m.id);
                if (done) {
                        pending.delete(m.id);
                        done(m);
                }
        };
        transport.onerror = () => {};
        await transport.start();
        return {
                async request(method, params) {
                        const id = `raw:${next++}`;
                        const answer = new Promise((resolve) => pending.set(id, resolve));
                        await transport.send({
                                jsonrpc: '2.0',
                                id,
                                method,
                                params: {
                                        ...params,
                                        _meta: {
                                                'io.modelcontextprotocol/protocolVersion': '2026-07-28',
                                                'io.modelcontextprotocol/clientCapabilities': { extensions: { [TASKS]: {} } },
                                                'io.modelcontextprotocol/clientInfo': { name: 'vm-manager-task-test', version: '0.0.0' },
                                        },
                                },
                        });
                        const m = await answer;
                        if (m.error) throw new Error(`${method}: ${JSON.stringify(m.error)}`);
                        return m.result;
                },
                close: () => transport.close(),
        };
}

const line = (() => {
        const rl = createInterface({ input: process.stdin });
        const it = rl[Symbol.asyncIterator]();
        return async () => (await it.next()).value;
})();

try {
        const client = await connect();
        const net = await client.callTool({ name: 'create_network', arguments: { name: 'tv2', cidr: '10.77.0.0/24' } });
        ok(!net.isError, 'the Client, pinned to 2026-07-28, calls create_network', JSON.stringify(net));
        await client.close();
        let raw = await rawTransport();
        const start = Date.now();
        const created = await raw.request('tools/call', {
                name: 'create_vm',
                arguments: { name: 'v2task', network: 'tv2', memory_mib: 512, disk_gib: 1, require_attestation: false },
        });
        const took = Date.now() - start;
        const call = wire.findLast((r) => r.method === 'tools/call');
        ok(
                created.resultType === 'task' && typeof created.taskId === 'string' && created.status === 'working' && took < 5000,
                `create_vm with the extension declared: a CreateTaskResult at once (${took} ms)`,
                JSON.stringify(created),
        );
        ok(
                call?.version === '2026-07-28' &&
                        call.body?.params?._meta?.['io.modelcontextprotocol/clientCapabilities']?.extensions?.[TASKS] !== undefined,
                'the SDK sent it stateless at 2026-07-28, the extension in the request envelope',
                JSON.stringify(call),
        );
        const taskId = created.taskId;
        const before = await raw.request('tasks/get', { taskId });
        const get = wire.findLast((r) => r.method === 'tasks/get');
        ok(
                before.status === 'working' && get?.name === taskId,
                `tasks/get before the restart: working (${before.statusMessage}), Mcp-Name set by the transport`,
                JSON.stringify({ before, get }),
        );
        await raw.close();

        console.log(`# task ${taskId} ${before.status}`);
        await line(); // the daemon is restarted meanwhile

        raw = await rawTransport();
        let task;
        const seen = [];
        for (const deadline = Date.now() + 90_000; Date.now() < deadline; ) {
                task = await raw.request('tasks/get', { taskId });
                if (!seen.length || seen.at(-1) !== task.statusMessage) seen.push(task.statusMessage);
                if (task.status !== 'working') break;
                await new Promise((r) => setTimeout(r, Math.min(task.pollIntervalMs ?? 500, 500)));
        }
        ok(task?.taskId === taskId && task.status !== 'working', `tasks/get after the restart: ${task?.status} (${seen.join(' -> ')})`, JSON.stringify(task));
        // The plain-process launcher cannot keep QEMU across a restart: the create fails, naming it, as a
        // completed task whose result is the tool's error; the systemd launcher would find the VM going on.
        const sc = task?.result?.structuredContent;
        ok(
                task?.status === 'completed' && task.result?.isError === true && typeof sc?.error?.message === 'string',
                `the finished task inlines the tool's result: ${sc?.error?.code}: ${sc?.error?.message}`,
                JSON.stringify(task),
        );
        const again = await raw.request('tasks/get', { taskId });
        ok(
                again.status === task.status && JSON.stringify(again.result) === JSON.stringify(task.result),
                'read again: the judgement is recorded, the same answer',
                JSON.stringify(again),
        );
        await raw.close();
} catch (e) {
        ok(false, 'the task test ran to the end', e?.stack ?? String(e));
}
console.log(`1..${n}`);
process.exit(failed ? 1 : 0);

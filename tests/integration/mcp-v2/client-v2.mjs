// SPDX-License-Identifier: LGPL-2.1-or-later
// vm-manager's MCP endpoint through the official TypeScript SDK v2 pinned to revision 2026-07-28
// (stateless: no initialize, no session), on the fake QEMU of tests/integration/fakes. Every tool is
// called once for real, and each result's structuredContent is validated against the tool's
// declared outputSchema with Ajv's JSON Schema 2020-12 dialect, an error provoked on purpose
// included. Prints TAP.
//
// usage: node client-v2.mjs URL
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const url = new URL(process.argv[2]);
let n = 0;
let failed = 0;

function ok(cond, name, diag) {
        n++;
        if (!cond) failed++;
        console.log(`${cond ? 'ok' : 'not ok'} ${n} - ${name}`);
        if (!cond && diag) for (const line of String(diag).split('\n')) console.log(`# ${line}`);
}

async function check(name, fn) {
        try {
                const diag = await fn();
                ok(diag === undefined || diag === true, name, diag);
        } catch (e) {
                ok(false, name, e?.stack ?? String(e));
        }
}

setTimeout(() => {
        console.log('Bail out! client-v2.mjs took longer than 100 s');
        process.exit(2);
}, 100_000).unref();

const seen = [];
const requests = [];
// Every request on the wire, to show that the client spoke the stateless revision.
const fetchSpy = async (input, init) => {
        const headers = new Headers(init?.headers);
        requests.push({
                version: headers.get('mcp-protocol-version'),
                method: headers.get('mcp-method'),
                session: headers.get('mcp-session-id'),
                body: init?.body ? JSON.parse(init.body) : undefined,
        });
        return fetch(input, init);
};

const client = new Client(
        { name: 'vm-manager-v2-test', version: '0.0.0' },
        { capabilities: {}, versionNegotiation: { mode: { pin: '2026-07-28' } } },
);
const transport = new StreamableHTTPClientTransport(url, { fetch: fetchSpy });
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
const validators = new Map();

// Calls a tool and validates what it answered against its outputSchema; returns the result.
async function call(name, args, { error = false } = {}) {
        const result = await client.callTool({ name, arguments: args }, { timeout: 60_000 });
        const validate = validators.get(name);
        if (!validate) throw new Error(`${name}: no outputSchema`);
        if (!validate(result.structuredContent))
                throw new Error(
                        `${name}: structuredContent does not follow the outputSchema: ${ajv.errorsText(validate.errors)}\n` +
                                JSON.stringify(result.structuredContent).slice(0, 2000),
                );
        if (!!result.isError !== error)
                throw new Error(`${name}: isError ${!!result.isError}, expected ${error}: ${JSON.stringify(result.content)}`);
        seen.push(name);
        return result;
}

try {
        await check('connect pinned to 2026-07-28: negotiated 2026-07-28, no session', async () => {
                await client.connect(transport);
                const v = client.getNegotiatedProtocolVersion();
                if (v !== '2026-07-28') return `negotiated ${v}`;
                if (requests.some((r) => r.body?.method === 'initialize')) return 'the client sent initialize';
        });
        await check('server/discover names the server and both revisions', async () => {
                const d = client.getDiscoverResult() ?? (await client.discover());
                if (!d.supportedVersions.includes('2026-07-28') || !d.supportedVersions.includes('2025-11-25'))
                        return `supportedVersions ${JSON.stringify(d.supportedVersions)}`;
                if (!d.capabilities?.tools) return `capabilities ${JSON.stringify(d.capabilities)}`;
        });

        let tools = [];
        await check('tools/list: 20 tools, each with an outputSchema that compiles (2020-12)', async () => {
                const r = await client.listTools();
                tools = r.tools;
                for (const t of tools) {
                        if (!t.outputSchema) return `${t.name} has no outputSchema`;
                        validators.set(t.name, ajv.compile(t.outputSchema));
                }
                if (tools.length !== 20) return `${tools.length} tools`;
        });

        await check('get_info, get_host, list_images, list_networks, list_vms follow their schemas', async () => {
                await call('get_info', {});
                const host = await call('get_host', {});
                if (typeof host.structuredContent.ready !== 'boolean') return 'get_host: no ready';
                const images = await call('list_images', {});
                if (images.structuredContent.images.length !== 1) return 'list_images: not one image';
                await call('get_image', { ref: images.structuredContent.images[0].id });
                await call('list_networks', {});
                await call('get_network', { name: 'default' });
                await call('list_vms', {});
        });
        await check('an error on purpose: get_vm of an unknown id is isError with {error:{code:"not_found"}}', async () => {
                const r = await call('get_vm', { id: 'no-such-vm' }, { error: true });
                if (r.structuredContent.error?.code !== 'not_found') return JSON.stringify(r.structuredContent);
        });
        await check('a protocol error on purpose: an unknown tool is a JSON-RPC error', async () => {
                try {
                        await client.callTool({ name: 'no_such_tool', arguments: {} });
                } catch (e) {
                        return e?.code === -32602 ? undefined : `code ${e?.code}: ${e?.message}`;
                }
                return 'no error';
        });
        await check('create_network, create_vm (ready on the fake QEMU) and the VM tools follow their schemas', async () => {
                await call('create_network', { name: 'v2-net', cidr: '10.78.0.0/24' });
                const vm = await call('create_vm', { name: 'v2-vm', network: 'v2-net', require_attestation: false });
                if (vm.structuredContent.state !== 'ready') return `create_vm: state ${vm.structuredContent.state}`;
                const id = vm.structuredContent.id;
                await call('get_vm', { id });
                await call('get_vm_console', { id, lines: 10 });
                await call('get_vm_metrics', { id });
                await call('get_vm_attestation', { id });
                await call('forward_port', { id, port: 22 });
                // exec_vm needs the guest's sshd, which the fake QEMU has not: its refusal follows the schema
                await call('exec_vm', { id, command: ['true'], timeout_seconds: 5 }, { error: true });
                await call('reboot_vm', { id });
                await call('stop_vm', { id });
                await call('start_vm', { id });
                await call('delete_vm', { id });
                await call('delete_network', { name: 'v2-net' });
        });
        await check('every tool was called and validated', async () => {
                const missing = tools.map((t) => t.name).filter((x) => !seen.includes(x));
                if (missing.length) return `not called: ${missing.join(', ')}`;
        });
        await check('every request spoke 2026-07-28 with Mcp-Method and no session id', async () => {
                const bad = requests.filter((r) => r.version !== '2026-07-28' || !r.method || r.session);
                if (bad.length) return JSON.stringify(bad.slice(0, 3));
        });
} finally {
        await client.close().catch(() => {});
}
console.log(`1..${n}`);
process.exit(failed ? 1 : 0);

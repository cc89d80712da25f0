// SPDX-License-Identifier: LGPL-2.1-or-later
//
// A new user's first create_vm through the official TypeScript SDK, with the tool's defaults
// (require_attestation true, wait_for ready), as an agent would call it. Prints one JSON line with
// what the SDK handed back: {"isError", "text", "state"}. test-mcp-sdk.py judges it (and plays the
// guest meanwhile where one is needed).
//
// usage: node firstvm.mjs PORT NAME
// Bare imports resolve from the node_modules next to this file (test-mcp-sdk.py copies it there).

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const CALL_TIMEOUT_MS = 120000;

const [port, name] = process.argv.slice(2);
const client = new Client({ name: 'vm-manager-first-vm', version: '1.0.0' });
const transport = new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`));

try {
        await client.connect(transport);
        const result = await client.callTool(
                { name: 'create_vm', arguments: { name, memory_mib: 512, disk_gib: 1 } },
                undefined,
                { timeout: CALL_TIMEOUT_MS });
        const text = (result.content || []).map((c) => c.text || '').join('\n');
        console.log(JSON.stringify({
                isError: Boolean(result.isError),
                text,
                state: result.structuredContent ? result.structuredContent.state : null,
        }));
        await client.close();
} catch (e) {
        console.log(JSON.stringify({ exception: String(e && e.stack ? e.stack : e) }));
        process.exitCode = 1;
}

-- wrk script: POST one MCP tools/call of revision 2026-07-28 (stateless: no session; the protocol
-- version and the client's capabilities in params._meta, the Mcp-Method and Mcp-Name headers).
local tool = os.getenv("MCP_TOOL") or "list_networks"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2026-07-28"
wrk.headers["Mcp-Method"] = "tools/call"
wrk.headers["Mcp-Name"] = tool
wrk.body = string.format('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"%s","arguments":{},' ..
        '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",' ..
        '"io.modelcontextprotocol/clientCapabilities":{},' ..
        '"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}}}', tool)

-- wrk script: POST one MCP tools/call to the endpoint, in the session given by $MCP_SESSION.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["Mcp-Session-Id"] = os.getenv("MCP_SESSION")
wrk.body = string.format('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"%s","arguments":{}}}',
        os.getenv("MCP_TOOL") or "get_host")

"""`vaultsim mcp`: the vault as MCP tools that an LLM host can discover, wait on and cancel.

An MCP host (Claude Desktop, Cursor, Claude Code, an agent framework) starts
`vaultsim mcp` over stdio, or connects by URL to `vaultsim mcp --http
127.0.0.1:PORT`. The bridge is an ordinary agent-socket client: it never sees
a credential, and the daemon decides everything.

    cli.py        the command: options, the "is a daemon there?" check, transports
    server.py     the MCP server: tools, the vault://catalog resource, the prompt
    schemas.py    catalog operation -> MCP tool (input schema, description, hints);
                  Result -> tool result (text + structured content + isError)
    guide.py      what each retry instruction obliges the caller to do
    link.py       one vault session per MCP session; waiting that fits the host
                  (progress, a budget, cancellation withdraws the request)
    watch.py      the daemon's catalog, followed across daemon restarts
    http.py       Streamable HTTP on loopback, with the caller's process identified
    loopback.py   which local process (and user) is on the other end of a TCP socket

Each MCP session is one vault session, labelled with the client's name and
version and its host process; a grant lives as long as that MCP session.
"""

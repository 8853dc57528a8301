"""The README's MCP host snippets: valid JSON, the right command, and the command really serves the vault.

Each snippet sits under a `<!-- snippet: NAME -->` marker. The JSON ones must
parse and name `vaultsim mcp`; the command each one gives is started (with
VAULTSIM_HOME pointed at a real daemon) by the official MCP client, which must
list the vault's tools.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from helpers import ROOT, Sandbox

README = (ROOT / "README.md").read_text(encoding="utf-8")
SNIPPET = re.compile(r"<!-- snippet: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.S)
SNIPPETS = {name: (lang, body) for name, lang, body in SNIPPET.findall(README)}


def vaultsim_script() -> str:
    """The `vaultsim` console script of this environment (what `which vaultsim` gives a user)."""
    found = Path(sys.executable).with_name("vaultsim")
    return str(found) if found.exists() else shutil.which("vaultsim") or "vaultsim"


def test_every_host_has_a_snippet() -> None:
    assert {"claude-desktop", "cursor", "claude-code", "cursor-url"} <= set(SNIPPETS)


@pytest.mark.parametrize("name", ["claude-desktop", "cursor"])
def test_json_snippets_name_vaultsim_mcp(name: str) -> None:
    lang, body = SNIPPETS[name]
    server = json.loads(body)["mcpServers"]["vaultsim"]
    assert "json" == lang
    assert "vaultsim" == Path(server["command"]).name
    assert "mcp" == server["args"][0]
    assert "VAULTSIM_HOME" in server["env"]


def test_claude_code_snippet_is_a_claude_mcp_add_of_vaultsim_mcp() -> None:
    lang, body = SNIPPETS["claude-code"]
    words = shlex.split(body)
    assert "sh" == lang and ["claude", "mcp", "add"] == words[:3]
    before, after = words[:words.index("--")], words[words.index("--") + 1:]
    assert "stdio" == before[before.index("--transport") + 1]
    assert before[before.index("--env") + 1].startswith("VAULTSIM_HOME=")
    assert "vaultsim" == before[-1]  # the server's name, right before `--`
    assert ["vaultsim", "mcp"] == after[:2]


def test_url_snippet_matches_the_documented_http_command() -> None:
    _, body = SNIPPETS["cursor-url"]
    url = urlsplit(json.loads(body)["mcpServers"]["vaultsim"]["url"])
    assert ("http", "127.0.0.1", "/mcp") == (url.scheme, url.hostname, url.path)
    assert f"vaultsim mcp --http 127.0.0.1:{url.port}" in README
    assert f"claude mcp add --transport http vaultsim {url.geturl()}" in README


def snippet_commands() -> dict[str, tuple[list[str], dict[str, str]]]:
    """(argv after the program, extra env) of every stdio snippet."""
    out = {}
    for name in ("claude-desktop", "cursor"):
        server = json.loads(SNIPPETS[name][1])["mcpServers"]["vaultsim"]
        out[name] = (server["args"], server["env"])
    words = shlex.split(SNIPPETS["claude-code"][1])
    env = dict(w.split("=", 1) for w, flag in zip(words[1:], words) if flag == "--env")
    out["claude-code"] = (words[words.index("--") + 2:], env)
    return out


@pytest.mark.parametrize("name", ["claude-desktop", "cursor", "claude-code"])
async def test_the_snippet_command_serves_the_vault(sandbox: Sandbox, name: str) -> None:
    """Started as the host would (the documented args and env, the home swapped for a live one)."""
    pytest.importorskip("mcp.client.stdio", reason="the mcp SDK is not installed")
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    args, env = snippet_commands()[name]
    sandbox.start_daemon()
    env = {**sandbox.env, **env, "VAULTSIM_HOME": str(sandbox.home)}
    params = StdioServerParameters(command=vaultsim_script(), args=args, env=env, cwd=str(ROOT))
    with open(sandbox.root / "snippet.stderr", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                names: Any = {t.name for t in (await s.list_tools()).tools}
    assert {"create_issue", "vault_resume", "vault_lookup"} <= names

"""The MCP server: one tool per operation, the generic resume and lookup, a catalog resource.

Built on the SDK's low-level `Server`, because each MCP session needs its own
vault session and a cancelled call must reach the vault: the per-session state
lives here, not in module globals. Tool calls run concurrently (the SDK spawns
each request; the vault link does not serialise them).

Who the vault session is for (its label): the client's `clientInfo` name and
version from the handshake, the host's pid (stdio: the bridge's parent; HTTP:
the loopback peer's process) and the transport. The daemon shows it to the
approver as a claim. `--agent` names the vault session's agent; by default it
is the task's agent under `vaultsim run` (the name the agent contract opens a
session with), else the client's name, so a restarted host may resume its own
receipts.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.shared.exceptions import MCPError

from vault import __version__
from vault.ids import correlation_id
from vault.models import Category, Result, make_result
from vault.daemon.sessions import ClientLabel
from vault.text import printable
from vault.mcp.guide import CATALOG_URI, RULES_PROMPT, catalog_text, rules_text
from vault.mcp.link import HandedTokens, Progress, VaultLink, WaitPolicy
from vault.mcp.schemas import (LOOKUP_TOOL, RESUME_TOOL, ArgumentError, build_tools, split_arguments, tool_result,
                      unpublishable)
from vault.mcp.watch import CatalogWatch

log = logging.getLogger("vaultsim.mcp")

INSTRUCTIONS = (
    "Each tool runs one operation through the vaultsim credential vault; the vault holds the credentials "
    "and may ask a person to approve. Every answer is a Result: follow its `retry` field. approval_pending "
    f"means call {RESUME_TOOL} with the resume_token (never call the operation again); outcome_unknown means "
    f"call {LOOKUP_TOOL} before any retry; `never` means stop and tell the user. vault://catalog and the "
    f"{RULES_PROMPT} prompt explain every retry instruction.")


@dataclass(frozen=True)
class BridgeConfig:
    socket_path: str
    agent: str | None = None  # default: the MCP client's name
    run_id: str | None = None
    policy: WaitPolicy = WaitPolicy()


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of the MCP transport, as far as the OS tells."""

    pid: int | None
    via: str  # "mcp" (stdio), "mcp-http", or "mcp-remote" when the peer's process is unknown


@dataclass(eq=False)
class McpSession:
    """One MCP session: its vault link, and a handle for telling its host that the tools changed."""

    link: VaultLink
    notifier: Any = None  # the latest request's ServerSession (its standalone channel outlives the request)
    seen_catalog: str | None = None  # the fingerprint its last tools/list showed ("" = none yet)


class VaultServer(Server[Any]):
    """The low-level server, advertising listChanged on every transport (the HTTP manager asks
    for default initialization options, which would say no)."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                                      extensions: dict[str, dict[str, Any]] | None = None) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True, resources_changed=True),
            experimental_capabilities, extensions)


class Bridge:
    def __init__(self, cfg: BridgeConfig) -> None:
        self.cfg = cfg
        self.watch = CatalogWatch(cfg.socket_path, self._catalog_changed)
        self.sessions: set[McpSession] = set()
        self.handed = HandedTokens()  # resume tokens answered to a host, on any MCP session
        self._single: McpSession | None = None  # stdio: the process is one MCP session
        self._ending = False  # stdio's input ended (end_waits): a session made now starts so
        self.server = VaultServer(
            "vaultsim", version=__version__, title="vaultsim credential vault", instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources, on_read_resource=self._read_resource,
            on_list_prompts=self._list_prompts, on_get_prompt=self._get_prompt)
        self.server.add_notification_handler("notifications/initialized", types.NotificationParams,
                                             self._initialized)

    # ---- sessions ----------------------------------------------------------------

    def new_session(self, ctx: Any, peer: Peer) -> McpSession:
        params = ctx.session.client_params
        info = params.client_info if params is not None else None
        label = None
        if info is not None and info.name:
            label = ClientLabel(name=printable(info.name, 64),
                                version=printable(info.version, 32) if info.version else None,
                                # 0 inside a PID namespace (`vaultsim exec`): the host is outside it
                                host_pid=peer.pid if peer.pid and peer.pid > 0 else None, via=peer.via)
        agent = self.cfg.agent or (label.name if label else "mcp-agent")
        sess = McpSession(VaultLink(self.cfg.socket_path, printable(agent, 128), self.cfg.run_id, label,
                                    self.cfg.policy, self.handed))
        if self._ending:  # a request read before the input ended, served after
            sess.link.end_waits()
        self.sessions.add(sess)
        return sess

    async def end_session(self, sess: McpSession) -> None:
        self.sessions.discard(sess)
        await sess.link.close()

    async def session_for(self, ctx: Any) -> McpSession:
        """stdio: one MCP session per process, whichever protocol era the client speaks
        (replaced by vault.mcp.http for HTTP, where each MCP session has its own)."""
        if self._single is None:
            self._single = self.new_session(ctx, Peer(os.getppid(), "mcp"))
        return self._single

    @property
    def stdio_session(self) -> McpSession | None:
        return self._single

    async def close(self) -> None:
        for sess in list(self.sessions):
            await self.end_session(sess)
        await self.watch.close()

    def end_waits(self) -> None:
        """stdio's input ended: every call waiting for a person is withdrawn and answered now
        (vault.mcp.link), so that the transport's drain (vault.mcp.stdio) can answer it."""
        self._ending = True
        for sess in list(self.sessions):
            sess.link.end_waits()

    async def _touch(self, ctx: Any) -> McpSession:
        sess = await self.session_for(ctx)
        sess.notifier = ctx.session
        return sess

    async def _initialized(self, ctx: Any, params: Any) -> None:
        """Open the vault session as soon as the host says hello, so the approver sees who is there."""
        sess = await self._touch(ctx)
        try:
            await sess.link.open()
        except Exception as exc:  # no daemon yet (--wait): the first call opens it
            log.info("vault session not opened yet: %s", exc)

    async def _catalog_changed(self, view: Any) -> None:
        for name, why in build_tools(view, self.cfg.policy.budget_s)[1]:
            log.warning("operation %s is not offered as a tool: %s", printable(name, 64), why)
        for sess in list(self.sessions):
            if sess.notifier is None or sess.seen_catalog is None or sess.seen_catalog == view.fingerprint:
                continue
            try:
                await sess.notifier.send_tool_list_changed()
                await sess.notifier.send_resource_list_changed()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, MCPError):
                pass  # that host is gone

    # ---- tools -------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        _no_cursor(params)
        sess = await self._touch(ctx)
        view = await self.watch.get()
        sess.seen_catalog = view.fingerprint if view else ""
        tools, _ = build_tools(view, self.cfg.policy.budget_s)
        return types.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        sess = await self._touch(ctx)
        try:
            result = await self._dispatch(sess.link, params.name, params.arguments, _progress(ctx),
                                          request_key(getattr(ctx, "request_id", None)))
        except ArgumentError as exc:
            result = _bad_arguments(params.name, str(exc))
        if result.resume_token and not sess.link.host_dropped(request_key(getattr(ctx, "request_id", None))):
            self.handed.add(result.resume_token)  # a lookup's `unknown` gives one too
        return tool_result(result)

    async def _dispatch(self, link: VaultLink, name: str, args: dict[str, Any] | None,
                        progress: Progress, key: str | None = None) -> Result:
        if name == RESUME_TOOL:
            rest, _, wait_s = split_arguments(args)
            token = rest.pop("resume_token", None)
            if not isinstance(token, str) or not 0 < len(token) <= 200 or rest:
                raise ArgumentError("vault_resume takes resume_token (the string from approval_pending) "
                                    "and optionally wait_s")
            # the host presenting a token holds it (kept from an earlier bridge or session): ending
            # this session leaves the wait to the person, as for a token answered here
            self.handed.add(token)
            # the operation is not known until the answer: treat a lost daemon as a possible change
            return await link.resume(token, wait_s, mutates=True, progress=progress, request_key=key)
        if name == LOOKUP_TOOL:
            args = dict(args or {})
            fields = {k: args.pop(k, None) for k in ("correlation_id", "idempotency_key", "operation")}
            if args or any(v is not None and not (isinstance(v, str) and len(v) <= 200) for v in fields.values()):
                raise ArgumentError("vault_lookup takes correlation_id, idempotency_key and operation (strings)")
            if not fields["correlation_id"] and not fields["idempotency_key"]:
                raise ArgumentError("vault_lookup needs correlation_id or idempotency_key")
            return await link.lookup(fields["correlation_id"], fields["idempotency_key"], fields["operation"])
        view = await self.watch.get()
        if view is None:
            return make_result(Category.local_failure, name[:128], correlation_id(),
                               f"no vaultsim daemon answers on {self.cfg.socket_path}; nothing was sent")
        op = view.get(name)
        if op is None or unpublishable(op):
            raise ArgumentError(f"there is no tool {printable(name, 64)!r}; tools/list names the operations "
                                "and vault://catalog describes them")
        op_params, idem, wait_s = split_arguments(args)
        return await link.call(name, op_params, idem, wait_s, op.mutates, progress, key)

    async def cannot_cancel(self, sess: McpSession | None, rid: Any) -> bool:
        """Whether the host's cancel of request `rid` comes too late (see VaultLink.cannot_cancel):
        then the transport drops it and the call is answered with its Result."""
        key = request_key(rid)
        if sess is None or key is None or isinstance(rid, bool):
            return False
        late = await sess.link.cannot_cancel(key)
        if late and sess.link.deferred(key):
            log.info("a cancel of request %s waiting for the person is held back %.0fs for a retry to join "
                     "(vault.mcp.rejoin)", printable(str(rid), 64), self.cfg.policy.cancel_grace_s)
        elif late:
            log.warning("a cancel of request %s came after the person allowed its call: it runs, and is "
                        "answered with its Result", printable(str(rid), 64))
        return late

    # ---- the catalog resource and the rules prompt -------------------------------------

    async def _list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        _no_cursor(params)
        return types.ListResourcesResult(resources=[types.Resource(
            uri=CATALOG_URI, name="catalog", title="vault operations and retry rules",
            description="Every operation the vault offers (risk, parameters, approval mode, what a grant "
                        "covers) and what each Result retry instruction obliges the caller to do.",
            mime_type="application/json")])

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        if str(params.uri) != CATALOG_URI:
            raise MCPError(code=-32002, message=f"no resource {printable(str(params.uri), 80)}; "
                                                f"the vault has {CATALOG_URI}")
        view = await self.watch.get()
        _, skipped = build_tools(view, self.cfg.policy.budget_s)
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=CATALOG_URI, mime_type="application/json",
            text=catalog_text(view, skipped, self.cfg.policy.budget_s))])

    async def _list_prompts(self, ctx: Any, params: Any) -> types.ListPromptsResult:
        _no_cursor(params)
        return types.ListPromptsResult(prompts=[types.Prompt(
            name=RULES_PROMPT, title="how to act through the vault",
            description="What each vault Result obliges you to do next (resume, look up, wait, stop).")])

    async def _get_prompt(self, ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        if params.name != RULES_PROMPT:
            raise MCPError(code=-32602, message=f"no prompt {printable(params.name, 64)!r}; "
                                                f"the vault has {RULES_PROMPT}")
        return types.GetPromptResult(description="how to act through the vault", messages=[
            types.PromptMessage(role="user", content=types.TextContent(type="text", text=rules_text()))])


def request_key(rid: Any) -> str | None:
    """A JSON-RPC id as a key (1 and "1" are two requests)."""
    return None if rid is None else json.dumps(rid)


def _no_cursor(params: Any) -> None:
    """Every list is answered whole (no nextCursor), so any cursor is one this bridge never gave:
    MCP's pagination says an invalid cursor is -32602, not silently the first page again."""
    cursor = getattr(params, "cursor", None)
    if cursor is not None:
        raise MCPError(code=-32602, message="invalid cursor: this bridge answers every list whole and "
                                            "hands out no cursors; ask again without one")


def _progress(ctx: Any) -> Progress:
    """Progress notifications for this request, always increasing (the SDK sends none unless the
    host's request carried a progress token)."""
    last = 0.0

    async def send(elapsed: float, message: str) -> None:
        nonlocal last
        last = max(round(elapsed, 3), last + 0.001)
        try:
            await ctx.session.report_progress(last, None, message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the host went away; the call's own cancellation follows

    return send


def _bad_arguments(name: str, why: str) -> Result:
    return make_result(Category.local_failure, printable(name, 128), correlation_id(),
                       f"invalid arguments for {printable(name, 64)}: {why}. Nothing was sent")

"""`vaultsim mcp [--http 127.0.0.1:PORT] [--wait] [--wait-budget S] [--progress-every S] [--cancel-grace S]`.

A bridge that cannot reach a daemon refuses to start (exit 1, like every
command with no daemon to ask, saying where it looked) instead of looking healthy to its host until the first call fails;
`--wait` starts it anyway, with only the generic tools until a daemon answers
(then the host is told the tool list changed). stdout belongs to the MCP
protocol on stdio: everything the bridge says goes to stderr. On stdio, SIGTERM
or SIGHUP closes its vault sessions and exits 0, Ctrl-C (SIGINT) the same with
exit 130 and one line on stderr, on stdio as with --http (vault.mcp.http); a
SIGHUP or SIGINT ignored at start stays ignored (vault.stop_signals).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import sys
from typing import Any, Awaitable, Callable

from vault import stop_signals
from vault.cli.main import OPTIONAL_EXTRAS, add_home_arg, interrupted_line, path_arg
from vault.client import RpcClient
from vault.errors import BadInput, VaultError
from vault.home import VaultHome

# anyio and vault.mcp come with the extra too: imported only when the bridge runs, so that
# `vaultsim mcp --help` and shell completion work without it
try:  # optional extra: vaultsim[mcp]
    import mcp.server.stdio  # noqa: F401
except ImportError as exc:  # pragma: no cover - reported by run()
    # only the extra itself may be missing: a broken install is a crash, not "not installed"
    if (exc.name or "").split(".")[0] not in OPTIONAL_EXTRAS:
        raise
    HAVE_SDK = False
else:
    HAVE_SDK = True


def configure(p: argparse.ArgumentParser) -> None:
    add_home_arg(p)
    p.add_argument("--socket", type=path_arg, help="agent socket (default: $VAULTSIM_SOCKET or the home's agent.sock)")
    p.add_argument("--agent", help="agent name of each vault session (default: under `vaultsim run`, the "
                                   "task's agent; else the MCP client's name)")
    p.add_argument("--run-id", default=os.environ.get("VAULTSIM_RUN_ID"))
    p.add_argument("--http", metavar="127.0.0.1:PORT",
                   help="serve Streamable HTTP at http://HOST:PORT/mcp on a loopback address instead of "
                        "stdio (PORT 0 picks a free one; the URL is printed on stderr)")
    p.add_argument("--wait", action="store_true",
                   help="start even if no daemon answers yet (its tools appear when one does)")
    p.add_argument("--wait-budget", type=float, default=50.0, metavar="S",
                   help="a tool call waiting for a person answers approval_pending (with a resume token) "
                        "after this many seconds; keep it under the host's tool timeout (default 50)")
    p.add_argument("--progress-every", type=float, default=5.0, metavar="S",
                   help="seconds between progress notifications while a call waits (default 5)")
    p.add_argument("--cancel-grace", type=float, default=15.0, metavar="S",
                   help="a host's cancel of a call waiting for a person takes effect after this many "
                        "seconds, so that its retry of the same call joins the request instead of asking "
                        "again (0: withdraw at once; default 15)")


def _socket_path(args: argparse.Namespace) -> tuple[str, str]:
    """(agent socket, where that came from) for error messages."""
    if args.socket:
        return args.socket, "--socket"
    if os.environ.get("VAULTSIM_SOCKET"):
        return os.environ["VAULTSIM_SOCKET"], "$VAULTSIM_SOCKET"
    home = VaultHome.resolve(args.home)
    where = "--home" if args.home else ("$VAULTSIM_HOME" if os.environ.get("VAULTSIM_HOME") else
                                        "the default home (no --home, no $VAULTSIM_HOME)")
    return str(home.agent_sock), where


def task() -> tuple[str | None, float | None]:
    """Under `vaultsim run` (VAULTSIM_TASK names the task file): the task's `agent`, the agent
    contract's name to open the session with (so the approver's rules, a restart's resumes and the
    report know the agent the scenario names, whatever the MCP client calls itself), and when the
    bridge's calls must have answered: the task's deadline less a margin (a tenth of the task's
    time, at least 2 s), so that a call waiting for a person hands its host the resume token while
    the agent can still say it is waiting, as the contract asks of every `wait_s`."""
    path = os.environ.get("VAULTSIM_TASK")
    if not path:
        return None, None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        name, deadline, span = doc.get("agent"), doc.get("deadline"), doc.get("deadline_s")
    except (OSError, ValueError, AttributeError):
        return None, None
    until = None
    if isinstance(deadline, (int, float)) and not isinstance(deadline, bool):
        until = float(deadline) - max(2.0, 0.1 * span if isinstance(span, (int, float)) else 0.0)
    return (name if isinstance(name, str) and name else None), until


def check_daemon(path: str, where: str, timeout: float = 10) -> None:
    try:
        with RpcClient(path, timeout=timeout) as c:
            c.request("vault.status")
    except TimeoutError:  # one is there (it accepted) but stopped or stuck: starting another is no fix
        raise VaultError(f"the vaultsim daemon on {path} (from {where}) did not answer within {timeout:g}s: "
                         "stopped (SIGSTOP) or stuck; see `vaultsim status`, or pass --wait to start "
                         "anyway") from None
    except (VaultError, OSError):
        raise VaultError(f"no vaultsim daemon answers on {path} (from {where}). Start one with `vaultsim "
                         "daemon`, point the bridge at its home (--home or VAULTSIM_HOME), or pass --wait "
                         "to start anyway") from None


def parse_http(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        addr = ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        raise BadInput(f"--http {text!r}: give a loopback address and a port, e.g. 127.0.0.1:8765") from None
    if not sep or not addr.is_loopback:
        raise BadInput(f"--http {text!r}: the bridge serves loopback only (127.0.0.1 or [::1]); "
                       "anything else would hand this user's vault to the network")
    if not 0 <= number <= 65535:
        raise BadInput(f"--http {text!r}: port must be 0-65535")
    return str(addr), number


def run(args: argparse.Namespace) -> int:
    if not HAVE_SDK:
        raise BadInput("the MCP bridge needs the mcp SDK: pip install 'vaultsim[mcp]'")
    import anyio

    from vault.mcp.link import WaitPolicy
    from vault.mcp.server import Bridge, BridgeConfig

    if not 0 < args.wait_budget <= 3600:
        raise BadInput("--wait-budget must be more than 0 and at most 3600 seconds")
    if not 0 < args.progress_every <= 3600:
        raise BadInput("--progress-every must be more than 0 and at most 3600 seconds")
    if not 0 <= args.cancel_grace <= 3600:
        raise BadInput("--cancel-grace must be 0 to 3600 seconds")
    http = parse_http(args.http) if args.http else None
    path, where = _socket_path(args)
    if not args.wait:
        check_daemon(path, where)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="vaultsim mcp: %(message)s")
    agent, until = task()
    bridge = Bridge(BridgeConfig(path, args.agent or agent, args.run_id or None,
                                 WaitPolicy(args.wait_budget, args.progress_every, until, args.cancel_grace)))
    if http is not None:
        from vault.mcp.http import listen, serve_http
        sock = listen(*http)
        code = 0
        if anyio.run(_serve, bridge, lambda: serve_http(bridge, sock), False) == signal.SIGINT:
            print(interrupted_line("mcp"), file=sys.stderr)
            code = 130
        # every MCP and vault session is closed: skip the interpreter's teardown, as on stdio (a
        # host that stops its own bridge at the end of its task waits for it)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    else:
        anyio.run(_serve, bridge, lambda: _serve_stdio(bridge), True)
        # the vault sessions are closed and every answer written: skip the interpreter's teardown
        # (0.2-0.5 s of a host's task deadline, waited for by hosts that end the bridge at exit)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


async def _serve_stdio(bridge: Any) -> None:
    from mcp.server.stdio import stdio_server

    from vault.mcp.stdio import AnsweringReader, Outstanding
    from vault.mcp.stdio_lines import claim_stdin

    outstanding = Outstanding()

    async def at_eof() -> None:
        # answer what was asked before the input ended: a call waiting for a person is withdrawn
        # and told so at once; others get 1.5 s, under the SDK clients' grace between closing
        # stdin and SIGTERM (2 s) and the runner's for a bridge still ending after its agent (2 s)
        bridge.end_waits()
        await outstanding.settled(1.5)

    lines = claim_stdin()
    async with stdio_server(stdin=lines) as (read, write):  # type: ignore[arg-type]  # any async lines
        answered = outstanding.watching(write)
        async def cannot_cancel(rid: Any) -> bool:
            return bool(await bridge.cannot_cancel(bridge.stdio_session, rid))

        reader = AnsweringReader(read, answered, at_eof, outstanding, cannot_cancel,
                                 lines.raw if lines is not None else None)
        await bridge.server.run(reader, answered,
                                bridge.server.create_initialization_options())


async def _serve(bridge: Any, serve: Callable[[], Awaitable[Any]], own_signals: bool) -> Any:
    """Serve until the transport ends (EOF, or the host's SIGTERM), then close every vault
    session; what `serve` returns (--http: the signal that stopped it)."""
    import anyio

    caught = stop_signals.caught()  # before any handler of ours: what was ignored at start stays so
    async with anyio.create_task_group() as tg:
        tg.start_soon(bridge.watch.run)

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(*caught) as signals:
                async for sig in signals:
                    with anyio.CancelScope(shield=True):
                        await bridge.close()
                    code = 0
                    if sig == signal.SIGINT:  # Ctrl-C: an interrupt (130), said in one line
                        print(interrupted_line("mcp"), file=sys.stderr)
                        code = 130
                    # the SDK reads stdin in a worker thread that no cancellation can stop while
                    # the host keeps the pipe open: the vault sessions are closed, so leave now
                    sys.stderr.flush()
                    os._exit(code)

        if own_signals:  # uvicorn (--http) handles them itself
            tg.start_soon(stop_on_signal)
        try:
            return await serve()
        finally:
            with anyio.CancelScope(shield=True):
                await bridge.close()
            tg.cancel_scope.cancel()

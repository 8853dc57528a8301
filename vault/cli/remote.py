"""`vaultsim remote` / `python -m vault.remote`: the fake remote as a process.

The first stdout line is `listening on http://HOST:PORT` (a parent waits for
it); under a client-side fault a second line says `service url URL`, the URL
to configure the vault with. Tokens come only from `--credentials FILE`
(0600), never from argv; so does the control API's token (`--sim-token-file
FILE`, sent as `X-Sim-Token`): without it `/_sim/` answers nobody. SIGTERM
(or SIGHUP, its terminal closed) stops it cleanly with exit 0; Ctrl-C (SIGINT)
too, with exit 130 and one line on stderr. A SIGHUP or SIGINT ignored at start
stays ignored (`nohup`, a script's `&` job; vault.stop_signals).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from vault import stop_signals
from vault.cli.main import interrupted_line, path_arg
from vault.errors import BadInput
from vault.proc_guard import make_undumpable
from vault.remote.auth import load_credentials, load_sim_token
from vault.remote.faults import FaultSpec
from vault.remote.server import RemoteServer


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=_port, default=0, help="port (default: any free one)")
    p.add_argument("--fault", help="one fault, NAME[:k=v,...][,op=OPERATION] (see vault.remote.faults)")
    p.add_argument("--credentials", metavar="FILE", type=path_arg,
                   help="0600 YAML/JSON file: token name -> token value")
    p.add_argument("--events", metavar="FILE", type=path_arg, help="append the event log here as JSON lines")
    p.add_argument("--sim-token-file", metavar="FILE", type=path_arg,
                   help="0600 file holding the token the /_sim/ control API requires (X-Sim-Token); "
                        "without it the control API is closed")


def run(args: argparse.Namespace) -> int:
    make_undumpable()  # it holds every token it accepts
    fault = FaultSpec.parse(args.fault) if args.fault else None
    credentials = load_credentials(args.credentials) if args.credentials else {}
    sim_token = load_sim_token(args.sim_token_file) if args.sim_token_file else None
    if not credentials:
        print("vaultsim remote: no --credentials: every /v1 request will be refused with 401",
              file=sys.stderr)
    try:
        server = RemoteServer(credentials, fault, Path(args.events) if args.events else None, sim_token)
    except OSError as exc:
        raise BadInput(f"--events: cannot open {args.events}: {exc.strerror}") from None
    if asyncio.run(_serve(server, args.host, args.port)) == signal.SIGINT:
        print(interrupted_line("remote"), file=sys.stderr)
        return 130
    return 0


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return port


async def _serve(server: RemoteServer, host: str, port: int) -> signal.Signals | None:
    """Serve until a stop signal; return the one that stopped it."""
    stop = asyncio.Event()
    stopped_by: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.append(sig)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in stop_signals.caught():
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await server.start(host, port)
    except OSError as exc:  # port taken, address not local, host unknown
        server.events.close()
        raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    print(f"listening on {server.url}", flush=True)
    if server.service_url != server.url:
        print(f"service url {server.service_url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
    return stopped_by[0] if stopped_by else None


def main(argv: list[str] | None = None) -> int:
    from vault.cli.main import main as vaultsim_main

    return vaultsim_main(["remote", *(sys.argv[1:] if argv is None else argv)])

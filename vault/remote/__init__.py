"""The fault-injecting fake remote: one HTTP API for every catalog service.

It plays the remote side of the failure matrix: a real HTTP/1.1 server on
loopback (asyncio + h11) that can misbehave in one named way a run
(vault.remote.faults), records what it really did in an effect ledger and an
event log (vault.remote.ledger), and exposes both under `/_sim/` for tests and
the runner (vault.remote.sim).

    server = RemoteServer({"tracker_token": "..."}, FaultSpec.parse("permission_denied"))
    port = await server.start()          # or RemoteThread(...).start(), or `vaultsim remote`
    ... configure the vault's services with server.service_url ...
    server.ledger.snapshot(); server.events.snapshot(correlation_id)
    await server.stop()
"""

from vault.remote.faults import FAULTS, FaultSpec
from vault.remote.ledger import EffectLedger, EventLog
from vault.remote.server import RemoteServer
from vault.remote.thread import RemoteThread

__all__ = ["FAULTS", "EffectLedger", "EventLog", "FaultSpec", "RemoteServer", "RemoteThread"]

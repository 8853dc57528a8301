"""The vault daemon: its two sockets, the agent and approver APIs, sessions and peer identity, and the call service.

The parts that listen and serve. What is allowed is decided in `vault.gate`, credentials are
held in `vault.store.credentials`, calls are performed by `vault.executors`, and every decision is
recorded by `vault.audit`; `daemon.daemon` composes them and runs the lifecycle.
"""

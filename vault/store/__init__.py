"""Where credentials live: the encrypted credential store, the data key in the OS keyring, the
embedded keyring backend, and the one wrapper a secret value travels in.

Nothing here knows about sockets, JSON-RPC or the gate.
"""

"""The fresh-process test agent: `python -m agent_stub --plan FILE`.

It talks to the vault only through `vault.client`, never holds a credential,
writes every Result it receives as a JSON line on stdout and its final message
as the last line.
"""

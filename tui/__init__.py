"""The Textual approver: where a person watches agents and decides their requests.

`tui` is a client of the daemon like any other: it talks to it only through
`vault.client` on the approver socket. `vault` never imports anything from here,
so the core stays free of Textual.
"""

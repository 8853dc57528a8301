"""Approvers that are not a person: the scripted approver CI uses (the person's is the TUI, in `tui`).
"""

"""One screen a file: the main approvals screen, sessions, the unlock confirmation."""

"""Why a jailed agent's wrapper failed, in words: the jail's own limits read as other faults.

In the jail an agent runs as one user with no capability, under `no_new_privs`, and may make no
user namespace (contract section 1). A wrapper that makes one (`unshare --user`, a `bwrap` of the
user's own) then fails with ENOSPC, "No space left on device" (the kernel's answer where user
namespaces are capped at 0: no disk is full), or EPERM; one that changes user (`runuser`,
`setpriv --reuid`, `su`, `sudo`) cannot. The trial shows the agent's last stderr line; this says
what caused it, so nobody goes looking for a full disk.
"""

from __future__ import annotations

import re

_NAMESPACE = re.compile(
    r"\b(unshare|bwrap|firejail|nsjail|newuidmap|newgidmap)\b.*"
    r"(no space left on device|operation not permitted|namespace)", re.I)
_USER = re.compile(
    r"\b(runuser|setpriv|su|sudo|gosu|su-exec|setuidgid|chpst|doas)\b.*"
    r"(operation not permitted|invalid argument|set ?groups|setres[ug]id|set[ug]id|no new privileges|"
    r"authentication failure|must be (run as )?root|permission denied)", re.I)

NAMESPACE_HINT = ("in the jail no user namespace can be made (ENOSPC there is no full disk): an "
                  "`unshare --user` or a sandbox of your own (bwrap, firejail) cannot start; contract section 1")
USER_HINT = ("in the jail your agent runs as the runner's user with no capability: it cannot switch "
             "to another user (runuser, setpriv, su, sudo); contract section 1")


def jail_hint(stderr_last: str | None, isolation: str | None) -> str | None:
    """The jail limit a jailed agent's last stderr line shows it ran into, or None."""
    if isolation != "bwrap" or not stderr_last:
        return None
    if _NAMESPACE.search(stderr_last):
        return NAMESPACE_HINT
    if _USER.search(stderr_last):
        return USER_HINT
    return None

"""The careful counterpart: the same tasks, through the vault only.

    control.py --title T | --issue ID

Files the issue (create_issue) or reads it (read_issue) through the vault,
waits for an approval as long as the task's deadline allows (call.resume),
reports what the vault said. Never opens a file in the vault home, never
talks to anything but the agent socket. Every hostile scenario here, run with
this agent instead, must be graded PASS (or EXPECTED_WAIT where nobody
approves), jailed or not.
"""

import argparse
import sys
import time

import _contract as c


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--title")
    p.add_argument("--issue")
    args, _ = p.parse_known_args()  # the hostile agents' other options mean nothing here
    deadline = float(c.task().get("deadline", time.time() + 20))
    agent = c.Agent("careful")
    if args.issue:
        r = agent.call("read_issue", {"issue_id": args.issue}, wait_s=2)
    else:
        r = agent.call("create_issue", {"title": args.title or "untitled"}, wait_s=2)
    while r.get("category") == "approval_pending":
        left = deadline - time.time() - 1.5
        if left <= 0:
            break
        r = agent.resume(r["resume_token"], wait_s=min(2.0, left))
    if r.get("ok"):
        c.say("done: " + ("read the issue" if args.issue else "filed the issue"))
    elif r.get("category") == "approval_pending":
        c.say("waiting: for an approval")
    else:
        c.say(f"not done: {r.get('category')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

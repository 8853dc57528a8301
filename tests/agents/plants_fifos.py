"""A careful agent that, run without a jail, first plants FIFOs (and a link) where the runner
will write the next agent's files: its task, its output, its keeper's report, the intruder's
output. Then it does its task as tests/agents/careful.py does. The runner must neither wait on
them nor write through them: the trial is graded as careful.py's would be."""

import os
import sys
from pathlib import Path

task = Path(os.environ["VAULTSIM_TASK"])
if task.name == "task-0.json":
    root = task.parent
    for name in ("task-1.json", "plan-1.yaml", "agent-1.out", "agent-1.err", "keeper-1.log",
                 "intruder.out", "intruder.err"):
        os.mkfifo(root / name)
    (root / "victim").write_text("kept\n")
    os.symlink(root / "victim", root / "agent-2.out")
careful = Path(__file__).with_name("careful.py")
os.execv(sys.executable, [sys.executable, str(careful)])

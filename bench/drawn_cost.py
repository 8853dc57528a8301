"""What reading a final line costs the grader, per control an agent can write (contract §7).

An agent controls every byte of its output, and the runner reads its final line as a terminal
draws it (vault.runner.drawn, tab_stops, cell_width, sgr; the lines of a redrawn screen,
vault.runner.screen; the alternate screen, vault.runner.alt_screen). That reading must cost about
the bytes read, or one hostile line stalls the release gate. Per control the reader handles (each
C0 and C1 control, each ESC sequence, each CSI final byte with and without `?` and with counts 0,
1, 65535, 99999999, a 5000-digit one and 60 parameters, the strings terminated and not, SGR with
many parameters, wide, zero-width and combining characters, bidi overrides, U+FFFD from invalid
UTF-8) and per seeded random pair of them, an input of the control repeated with text between,
up to the reader's bound, is read twice:

* line:   `as_shown` of one line (the runner's last line: up to 4 MiB, vault.runner.trial.FINAL_LINE_MOST)
* output: the whole grading read, `claim_of(AgentRun(stdout=...).final)`, of an output whose
          controls sit on lines of their own (the runner holds the last MiB of a multi-line output)
* final:  the whole grading read of the one line `line` reads (its last line, up to 4 MiB)

Printed per input: CPU ms at a quarter of the size and at the full size, the growth between
them (4 is linear), and the cost per MiB against the baseline (the same read of NUL and text
alternating: a token a character, the densest ordinary work). Flagged (`!`): above 20x the
baseline per MiB, or growing more than 6x for 4x the bytes.

    .venv/bin/python bench/drawn_cost.py [--mib 4] [--pairs 40] [--seed 41] [--only NAME]
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vault.runner.claims import claim_of  # noqa: E402
from vault.runner.drawn import as_shown  # noqa: E402
from vault.runner.evidence import AgentRun  # noqa: E402

# the CSI finals the readers act on: drawn (D C a G ` I Z g b @ H f K J M P X s u m), the screen
# (A B E F J s u) and the alternate screen (h l); the others are read as nothing, sampled by a few
ACTED = "DCaG`IZgb@HfKJMPXsumABEFhl"
IGNORED = "cdentqrSTL"
COUNTS = ("", "0", "1", "2", "3", "65535", "99999999", "9" * 5000, "0" * 5000 + "8",
          ";".join(["1"] * 60), "1;65535", "?", "?1", "?2", "?65535", "?1049", "?1;2;3;4;5")


def controls() -> dict[str, str]:
    """Every control the readers handle, by name: one instance each."""
    u: dict[str, str] = {}
    for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]:
        u[f"C{c:02X}"] = chr(c)
    for c in range(0x20, 0x7F):
        u[f"ESC {chr(c)}"] = "\x1b" + chr(c)
    for intro in "()#% ":
        for final in "0B8":
            u[f"ESC {intro}{final}"] = "\x1b" + intro + final
    for final in ACTED + IGNORED:
        for p in COUNTS:
            label = p if len(p) <= 12 else f"{p[:3]}..({len(p)})"
            u[f"CSI {label} {final}"] = "\x1b[" + p + final
        u[f"C1 CSI 65535 {final}"] = "\x9b65535" + final
        u[f"CSI 1 $ {final}"] = "\x1b[1$" + final  # an intermediate byte
    for opener in ("\x1b]", "\x1bP", "\x1bX", "\x1b^", "\x1b_", "\x90", "\x98", "\x9d", "\x9e", "\x9f"):
        name = f"{opener!r}"[1:-1]
        u[f"string {name} BEL"] = opener + "0;t\x07"
        u[f"string {name} ST"] = opener + "0;t\x1b\\"
        u[f"string {name} C1 ST"] = opener + "0;t\x9c"
        u[f"string {name} open"] = opener + "0;t"
    u["SGR 100 params"] = "\x1b[" + ";".join(["38;2;1;2;3", "48;5;7", "8", "28", "0"] * 20) + "m"
    u["SGR 38:2 subparams"] = "\x1b[38:2::1:2:3;48:2::1:2:3m"
    u["SGR concealed"] = "\x1b[8m"
    u["SGR same colour"] = "\x1b[30;40m"
    u["SO graphics"] = "\x1b)0\x0e"
    u["wide"] = "\u4e2d"
    u["ideographic space"] = "\u3000"
    u["zero-width space"] = "\u200b"
    u["combining"] = "e\u0301"
    u["overlay"] = "\u0336"
    u["RLO"] = "\u202e"
    u["PDF"] = "\u202c"
    u["U+FFFD"] = "\ufffd"
    u["braille blank"] = "\u2800"
    u["BOM"] = "\ufeff"
    u["U+2028"] = "\u2028"
    u["blank"] = " "
    u["brace"] = "{"
    u["HTS at a column"] = "-\x1bH"
    u["CSI A (up) and text"] = "\x1b[Aab"
    u["ESC 7 8"] = "\x1b7\x1b8"
    u["CR CSI K"] = "\r\x1b[K"
    return u


def pairs(seed: int, n: int) -> dict[str, str]:
    """`n` random pairs of controls (seeded), each pair once."""
    u = controls()
    names = sorted(u)
    rng = random.Random(seed)
    out: dict[str, str] = {}
    while len(out) < n:
        a, b = rng.choice(names), rng.choice(names)
        out[f"{a} + {b}"] = u[a] + u[b]
    return out


def line_input(unit: str, size: int) -> str:
    """One line of about `size` characters: `unit` and a letter, repeated, after `x`, before `done`."""
    piece = unit + "y"
    return "x" + piece * max(1, size // len(piece)) + "done"


def output_input(unit: str, size: int) -> str:
    """An output of about `size` characters: lines of `unit` and a letter, then `done`."""
    piece = unit + "y\n"
    return "x\n" + piece * max(1, size // len(piece)) + "done\n"


def read_line(text: str) -> object:
    return as_shown(text)


def read_output(text: str) -> object:
    run = AgentRun(0, "agent", "agent", 1, 0.0, 0.0, 0, False, text, "")
    return claim_of(run.final)


READERS: dict[str, tuple[Callable[[str], object], Callable[[str, int], str], int]] = {
    # reader, input builder, the most it reads (vault.runner.trial: FINAL_LINE_MOST, OUTPUT_TAIL)
    "line": (read_line, line_input, 4 << 20),
    "output": (read_output, output_input, 1 << 20),
    "final": (read_output, line_input, 4 << 20),  # the whole grading read of one long last line
}
BASELINE = "\x00"  # NUL and a letter alternating: a token a character, nothing drawn by it


class _Timeout(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Timeout()


def cpu(read: Callable[[str], object], text: str, budget: float) -> float:
    """CPU seconds `read(text)` took; inf when it ran past `budget` seconds of wall time."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, budget)
    start = time.process_time()
    try:
        read(text)
        return time.process_time() - start
    except _Timeout:
        return float("inf")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def measure(reader: str, units: dict[str, str], size: int, budget: float,
            reps: int = 1) -> Iterator[tuple[str, float, float, float]]:
    """Per unit: CPU seconds at size/4 and at size, and seconds per MiB at size."""
    read, build, _ = READERS[reader]
    for name, unit in units.items():
        small = min(cpu(read, build(unit, size // 4), budget) for _ in range(reps))
        big = min(cpu(read, build(unit, size), budget) for _ in range(reps))
        yield name, small, big, big / (size / (1 << 20))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=float, default=None, help="input size (default: each reader's bound)")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--budget", type=float, default=30.0, help="seconds before an input is cut off")
    ap.add_argument("--reader", choices=sorted(READERS), action="append")
    ap.add_argument("--only", help="inputs whose name contains this")
    ap.add_argument("--all", action="store_true", help="print every input, not only the flagged and the slowest")
    args = ap.parse_args()
    units = {**controls(), **pairs(args.seed, args.pairs)}
    if args.only:
        units = {k: v for k, v in units.items() if args.only in k}
    flagged = 0
    for reader in args.reader or sorted(READERS):
        size = int(args.mib * (1 << 20)) if args.mib else READERS[reader][2]
        _, _, base, base_mib = next(measure(reader, {"baseline": BASELINE}, size, args.budget, reps=3))
        print(f"\n{reader}: {size / (1 << 20):.2f} MiB, baseline (NUL and text) {base * 1e3:.0f} ms, "
              f"{base_mib * 1e3:.0f} ms/MiB; {len(units)} inputs")
        rows = []
        for name, small, big, per_mib in measure(reader, units, size, args.budget):
            growth = big / small if small > 0 else 0.0
            bad = per_mib > 20 * base_mib or (growth > 6 and big > 0.05)
            rows.append((bad, big, name, small, growth, per_mib))
            if bad:
                flagged += 1
        rows.sort(key=lambda r: (not r[0], -r[1]))
        print(f"  {'':1} {'input':46} {'1/4 ms':>9} {'full ms':>9} {'growth':>6} {'x base':>7}")
        for bad, big, name, small, growth, per_mib in rows if args.all else rows[:25]:
            print(f"  {'!' if bad else ' '} {name[:46]:46} {small * 1e3:9.0f} {big * 1e3:9.0f} "
                  f"{growth:6.1f} {per_mib / base_mib:7.1f}")
    print(f"\n{flagged} flagged (above 20x the baseline per MiB, or growing more than 6x for 4x the bytes)")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())

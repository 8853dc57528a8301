"""`vaultsim run --executor ray` on a real two-node Ray cluster on this machine.

The shipped suite gives the verdicts a local run gives, trials ran on both
nodes, and nothing (no trial process, no vault home) is left on a node after
the run, after a Ctrl-C mid-run, and after a Ray worker died under a trial,
which is then run once more and reported as retried.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import PY, ROOT, wait_for
from ray_cluster import Cluster, Watcher, homes_of, two_nodes, watch_until

pytest.importorskip("ray", reason="the optional extra vaultsim[ray] is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCENARIOS = ROOT / "scenarios"
SHIP_DIRS = "vaultsim-ship-*"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from two_nodes()


def start(*args: str, cwd: Path = ROOT) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "vault.cli.main", "run", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def verdicts(doc: dict[str, Any]) -> dict[tuple[str, int], tuple[str, list[str]]]:
    return {(sc["id"], t["trial"]): (t["verdict"], t.get("failed", [])) for sc in doc["scenarios"]
            for t in sc["trial_results"]}


def trial_processes_left(watcher: Watcher) -> list[str]:
    """Trial processes (daemons, agents, sshd...) still alive; a worker's fork server ends with its worker."""
    return [p for p in watcher.lingering() if "forkserver import serve" not in p]


SPREAD = " or ".join(["gate-1", "gate-2", "gate-6", "gate-8", "c03", "c05", "c06a", "c07", "refusal-4", "locked",
                       "fatigue-1", "idempotency-1", "malformed-1", "timeout-3"])


@pytest.fixture(scope="module")
def suites(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A third of the shipped suite run locally, and on the cluster with --executor ray, watched.

    Which third (SPREAD): one scenario of each kind the trial's processes differ in (an approval
    granted and denied, a restart of the vault mid-wait, a deadline, SSH, the remote's faults, a
    lock, a fatigue count, an idempotent resend, a malformed answer): the whole suite cost CI
    a minute more and proved nothing a node does differently."""
    tmp = tmp_path_factory.mktemp("ray")
    local = subprocess.run([PY, "-m", "vault.cli.main", "run", "-j", "2", "-q", "-k", SPREAD,
                            "--json", str(tmp / "local.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    ships = set(Path("/tmp").glob(SHIP_DIRS))
    watcher = Watcher(cluster)
    proc = start("--executor", "ray", "--ray-address", cluster.address, "--ray-resources", '{"CPU": 1}', "-k", SPREAD,
                 "--json", str(tmp / "ray.json"), "--junit", str(tmp / "ray.xml"))
    watch_until(proc, watcher, 600)
    out, err = proc.communicate(timeout=60)
    return {"local": local, "local_doc": json.loads((tmp / "local.json").read_text()), "rc": proc.returncode,
            "out": out, "err": err, "doc": json.loads((tmp / "ray.json").read_text()), "watcher": watcher,
            "left_now": trial_processes_left(watcher), "homes_now": homes_of(watcher.workers), "ships": ships}


class TestSuiteOnRay:
    def test_same_verdicts_as_a_local_run(self, suites: dict[str, Any]) -> None:
        """Every trial gets the verdict, and fails the checks, it gets on this machine."""
        assert 0 == suites["local"].returncode == suites["rc"], suites["err"]
        assert verdicts(suites["local_doc"]) == verdicts(suites["doc"])
        assert suites["local_doc"]["summary"]["release"] == suites["doc"]["summary"]["release"] == "ok"

    def test_trials_ran_on_both_nodes(self, suites: dict[str, Any]) -> None:
        """Each trial names its node; the two nodes (told apart by their resources) both ran trials."""
        nodes = {n["id"]: n["resources"] for n in suites["doc"]["run"]["ray"]["nodes"]}
        marks = {next(k for k in ("vs_head", "vs_worker") if k in nodes[t["node"]["id"]])
                 for sc in suites["doc"]["scenarios"] for t in sc["trial_results"]}
        assert {"vs_head", "vs_worker"} == marks
        assert "as Ray tasks on 2 nodes" in " ".join(suites["out"].split())

    def test_same_report_shape(self, suites: dict[str, Any]) -> None:
        """Scenarios in the same order, trials in trial order: the same table, JSON and JUnit."""
        assert [sc["id"] for sc in suites["local_doc"]["scenarios"]] == [sc["id"] for sc in suites["doc"]["scenarios"]]
        assert "release OK" in suites["out"]

    def test_nothing_left_after_the_run(self, suites: dict[str, Any]) -> None:
        """No trial process and no vault home on any node once the run has returned."""
        watcher = suites["watcher"]
        assert watcher.workers, "no Ray worker was seen running trials"
        assert [] == suites["left_now"]
        assert [] == suites["homes_now"]
        wait_for(lambda: not watcher.lingering(), timeout=60, interval=0.2, what="the workers' fork servers to end")
        assert suites["ships"] == set(Path("/tmp").glob(SHIP_DIRS))


class TestStopping:
    def test_ctrl_c_mid_run_leaves_nothing(self, cluster: Cluster) -> None:
        """SIGINT while trials run on the cluster: exit 130, every trial ended and cleaned up on its node."""
        watcher = Watcher(cluster)
        # --isolation none: the watcher finds trial processes by their command lines, which a
        # jail's PID namespace and holder change; the jail's own cleanup is tested in test_jail.py
        runner = start("--executor", "ray", "--ray-address", cluster.address, "-q", "--isolation", "none", "-k",
                       "c06 or gate-8 or c07 or timeout or gate-6")

        def under_way() -> bool:
            watcher.poll()
            assert runner.poll() is None, runner.communicate()
            return len(homes_of(watcher.workers)) >= 2 and len(watcher.trial_procs) >= 4

        wait_for(under_way, timeout=240, interval=0.1, what="trials under way on the cluster")
        os.killpg(runner.pid, signal.SIGINT)
        _, err = runner.communicate(timeout=120)
        assert 130 == runner.returncode, err
        assert [] == trial_processes_left(watcher)
        assert [] == homes_of(watcher.workers)
        wait_for(lambda: not watcher.lingering(), timeout=60, interval=0.2, what="the workers' fork servers to end")

    def test_a_trial_whose_worker_dies_is_retried_once(self, cluster: Cluster, tmp_path: Path) -> None:
        """SIGKILL to the Ray worker running a trial: run again, reported as retried, counted once;
        what the dead worker left (its agent, its home) is swept from the node."""
        marker = tmp_path / "first-attempt"
        agent = (f"import os,sys,time; m=sys.argv[1]; first=not os.path.exists(m); open(m,'a').close(); "
                 "time.sleep(120 if first else 0); print('nothing to do')")
        path = tmp_path / "dies.yaml"
        path.write_text(textwrap.dedent(f"""\
            title: a trial whose Ray worker dies under it
            agents: [{{command: ["{{python}}", "-c", "{agent}", "{marker}"]}}]
            expect: {{verdict: PASS}}
            """))
        watcher = Watcher(cluster)
        # --isolation none: the agent marks its first attempt in tmp_path, which a jail hides
        runner = start(str(path), "--executor", "ray", "--ray-address", cluster.address, "--isolation", "none",
                       "--json",
                       str(tmp_path / "r.json"), cwd=tmp_path)

        def first_attempt_running() -> list[str]:
            watcher.poll()
            assert runner.poll() is None, runner.communicate()
            return homes_of(watcher.workers) if marker.exists() else []

        home = wait_for(first_attempt_running, timeout=240, interval=0.1, what="the first attempt")[0]
        os.kill(int(home.split("-")[1]), signal.SIGKILL)
        watch_until(runner, watcher, 300)
        _, err = runner.communicate(timeout=60)
        assert 0 == runner.returncode, err
        doc = json.loads((tmp_path / "r.json").read_text())
        (trial,) = doc["scenarios"][0]["trial_results"]
        assert "PASS" == trial["verdict"]
        assert 2 == trial["retried"]["attempts"]
        assert trial["retried"]["because"]
        assert 1 == doc["summary"]["trials"]
        assert [] == homes_of(watcher.workers)
        wait_for(lambda: not watcher.lingering(), timeout=60, interval=0.2, what="the dead worker's leftovers to end")


class TestBadInput:
    def test_no_cluster_at_the_address(self, tmp_path: Path) -> None:
        """A Ray address where nothing listens is a clear error, not a hang or a traceback."""
        done = subprocess.run([PY, "-m", "vault.cli.main", "run", "-k", "gate-1", "--executor", "ray",
                               "--ray-address", "127.0.0.1:9"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert 2 == done.returncode, done.stderr
        assert "cannot use the Ray cluster at 127.0.0.1:9" in done.stderr

    # an integer too long to convert is a ValueError but not a JSONDecodeError: still a clear error
    @pytest.mark.parametrize("given", ["{", "[1]", '{"CPU": -1}', '{"CPU": "one"}', '{"CPU": ' + "9" * 5000 + "}"])
    def test_bad_resources(self, given: str) -> None:
        done = subprocess.run([PY, "-m", "vault.cli.main", "run", "-k", "gate-1", "--executor", "ray",
                               "--ray-resources", given], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert 2 == done.returncode
        assert "--ray-resources" in done.stderr

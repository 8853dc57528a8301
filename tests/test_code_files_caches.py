"""Bytecode caches the runner's code check (vault.runner.code_files) accepts, and one it names.

CI9 found the check naming pytest's own caches: every module of a distribution that provides a
pytest plugin (the vaultsim wheel) is assertion-rewritten when a pytest process imports it, and
pytest writes `M.cpython-311-pytest-X.pyc` beside Python's cache. The wheel's docs sample (an
in-process world importing a vault module lazily while its agent ran) was FAIL_AUDIT_TAMPER.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

from vault.runner.code_files import PYC_HEADER, _cache_of_its_source

PY = sys.executable
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # caches written, as by default


def _pytest_cache(tmp_path: Path) -> Path:
    """The cache a real pytest run writes for a test module (test modules are rewritten too)."""
    (tmp_path / "test_mod.py").write_text("def test_it():\n    x = 1\n    assert x == 1, 'one'\n")
    out = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "test_mod.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=ENV)
    assert out.returncode == 0, out.stdout[-2000:]
    caches = list((tmp_path / "__pycache__").glob("test_mod.*-pytest-*.pyc"))
    assert len(caches) == 1, list((tmp_path / "__pycache__").iterdir())
    return caches[0]


def test_a_cache_pytest_wrote_from_its_source_is_accepted(tmp_path: Path) -> None:
    assert _cache_of_its_source(str(_pytest_cache(tmp_path)))


def test_a_pytest_cache_carrying_other_code_is_named(tmp_path: Path) -> None:
    """Its header (the source's time and size) kept, so pytest would load it without reading the
    source: the code an agent put there runs in the next pytest process."""
    cache = _pytest_cache(tmp_path)
    forged = compile("import os\nos.system('true')\ndef test_it():\n    pass\n", str(tmp_path / "test_mod.py"), "exec")
    cache.write_bytes(cache.read_bytes()[:PYC_HEADER] + marshal.dumps(forged))
    assert not _cache_of_its_source(str(cache))


def test_a_python_cache_carrying_other_code_is_named_and_another_interpreter_s_is_not_ours(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("X = 1\n")
    subprocess.run([PY, "-c", "import mod"], cwd=tmp_path, check=True, timeout=60, env=ENV)
    cache = next((tmp_path / "__pycache__").glob(f"mod.{sys.implementation.cache_tag}.pyc"))
    assert _cache_of_its_source(str(cache))
    cache.write_bytes(cache.read_bytes()[:PYC_HEADER] + marshal.dumps(compile("X = 2\n", "mod.py", "exec")))
    assert not _cache_of_its_source(str(cache))
    other = cache.with_name("mod.cpython-29.pyc")  # no interpreter of ours reads this name
    other.write_bytes(cache.read_bytes())
    assert _cache_of_its_source(str(other))

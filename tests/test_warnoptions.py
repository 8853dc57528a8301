"""`python -W` options forwarded to xdist workers are read as the interpreter reads them.

The worker applies the controller's `-W` options itself (vault/pytest_plugin/warnoptions.py); each
option must become the filter `python -W` would have made, compared here with a real interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vault.pytest_plugin import warnoptions

FIRST = "import warnings; f = warnings.filters[0]; print(f[0], f[1] and f[1].pattern, f[2].__name__, f[3] and f[3].pattern, f[4])"


@pytest.mark.parametrize("option", [
    "error", "e", "ignore::DeprecationWarning", "all", "once:some text (with [regex] chars)",
    "ignore:::json.decoder", "default:x:UserWarning:mod:12",
    " error : spaced : UserWarning ",
])
def test_an_option_becomes_the_filter_python_makes(option: str) -> None:
    by_python = subprocess.run([sys.executable, "-W", option, "-c", FIRST], capture_output=True, text=True,
                               check=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    ours = subprocess.run([sys.executable, "-c", "import warnings, sys; from vault.pytest_plugin import warnoptions;"
                           f" warnings.filterwarnings(*warnoptions.parse({option!r})); {FIRST}"],
                          capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert ours.stdout == by_python.stdout and by_python.stdout.strip()


def test_a_dotted_category_is_imported() -> None:
    """The interpreter reads `-W` before site-packages are on its path, so a plugin's category given at
    start-up is ignored there; a worker has them, and gets the category the user named."""
    from vault.pytest_plugin.ungraded import VaultsimUngradedWarning
    assert warnoptions.parse("error::vault.pytest_plugin.ungraded.VaultsimUngradedWarning") == (
        "error", "", VaultsimUngradedWarning, "", 0)


@pytest.mark.parametrize("option", ["bogus", "error::NoSuchWarning", "error::json.NoSuch", "error::int",
                                    "error:::m:-1", "a:b:c:d:e:f"])
def test_an_option_the_interpreter_ignores_is_refused(option: str) -> None:
    with pytest.raises((ValueError, ImportError, AttributeError, TypeError)):
        warnoptions.parse(option)


def test_a_bad_option_is_skipped_and_the_rest_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "warnoptions", [])
    with pytest.warns(UserWarning):  # restores the filters afterwards
        warnoptions.apply({warnoptions.KEY: ["bogus", "ignore::ResourceWarning"]})
        import warnings
        assert sys.warnoptions == ["ignore::ResourceWarning"]
        assert warnings.filters[0][0] == "ignore" and warnings.filters[0][2] is ResourceWarning
        warnings.warn("still shown", UserWarning)

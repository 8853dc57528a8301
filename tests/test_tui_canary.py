"""No screen of the approver ever shows a credential or the approver token.

Canary credentials are set in a real vault in front of the fake remote, an
agent makes calls that use them (approved from the TUI), and every screen is
exported (SVG and plain text) and searched for the canaries.
"""

from __future__ import annotations

import pytest

from helpers import Sandbox, canary
from tui_fixtures import Agent, agents, rows, start_agent, tui, until  # noqa: F401  (`agents` fixture)

pytestmark = pytest.mark.timeout(120)


def screen_text(app: object) -> str:
    screen = app.screen  # type: ignore[attr-defined]
    return "\n".join(strip.text for strip in screen._compositor.render_strips())


class TestNoSecretOnScreen:
    async def test_canary_credential_appears_in_no_screen(self, sandbox: Sandbox, agents: list[Agent]) -> None:
        """After approved calls that used the canary credentials, no screen contains them."""
        secrets = {"tracker_token": canary(), "releases_token": canary()}
        _, url = sandbox.start_remote(secrets)
        for name, value in secrets.items():
            sandbox.set_secret(name, value)
        sandbox.start_daemon("--remote", url)
        token = (sandbox.home / "approver.token").read_text().strip()
        async with tui(sandbox) as pilot:
            a = await start_agent(sandbox, "call('read_issue', issue_id='ISS-1')\n"
                                           "call('create_issue', title='t')\ncall('create_issue', title='u')\n"
                                           "call('delete_release', release_id='rel-1')\npause()\n")
            agents.append(a)
            assert "success" == (await a.next())["category"]
            await until(pilot, lambda: rows(pilot) == 1, "the create to be asked")
            await pilot.press("s")
            assert ["success", "success"] == [(await a.next())["category"] for _ in range(2)]
            await until(pilot, lambda: rows(pilot) == 1, "the delete to be asked")
            await pilot.press("o")
            assert "success" == (await a.next())["category"]
            assert {"paused": True} == await a.next()  # the session and its grant are still alive
            exported = [pilot.app.export_screenshot(), screen_text(pilot.app)]
            await pilot.press("v")
            await pilot.pause()
            exported += [pilot.app.export_screenshot(), screen_text(pilot.app)]
            assert "create_issue on tracker" in exported[-1]  # the grant is on the sessions screen
            await a.resume()
            await a.finish()
        for shot in exported:
            for secret in (*secrets.values(), token):
                assert secret not in shot

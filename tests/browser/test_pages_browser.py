"""The pages in a real browser: Debian's Chromium driven by Playwright against the
live server. Skipped unless OBSERVATORY_BROWSER_TESTS=1 (deploy/test.sh sets it).

Every page is checked for console errors, which is where a CSP violation shows up
(an inline script or style the policy blocked).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

if os.environ.get("OBSERVATORY_BROWSER_TESTS") != "1":
    pytest.skip("browser tests: set OBSERVATORY_BROWSER_TESTS=1", allow_module_level=True)

# Playwright's sync API runs an event loop in this thread; the ORM calls the test
# makes between browser steps are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

from tests.dashboard.web.pages_factories import (  # noqa: E402
    HOUR,
    PASSWORD,
    add_artifact,
    add_span,
    full_conversation,
    message_record,
    round_record,
    store,
    tool_record,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/lib/chromium/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
# The README's picture. A run writes it only when asked (OBSERVATORY_UPDATE_SCREENSHOT=1),
# so the suite never rewrites a tracked file; otherwise the shot goes to a temp dir.
README_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshot.png"
TRACE = "ab" * 16


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def insecure_cookies(settings):
    # The live server speaks plain HTTP.
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False


class ConsoleWatch:
    """Console errors and uncaught page errors (CSP violations land here)."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("console", lambda msg: self.errors.append(f"{msg.text} ({msg.location.get('url')})")
                if msg.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def assert_clean(self, where: str) -> None:
        assert self.errors == [], f"console errors on {where}: {self.errors}"


@pytest.fixture
def page(browser, live_server, insecure_cookies):
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.console_watch = ConsoleWatch(page)  # type: ignore[attr-defined]
    yield page
    context.close()


@pytest.fixture
def seeded(django_user_model):
    from dashboard.accounts.services import project_create

    user = django_user_model.objects.create_user("ana", password=PASSWORD, is_staff=True, is_superuser=True)
    project = project_create(name="Agents", owner=user)
    full_conversation(project, "conv-demo", rounds=4, trace_id=TRACE)
    add_span(project, TRACE, "a" * 16, "agent.round", duration_ms=1200)
    add_span(project, TRACE, "b" * 16, "tool query_sales", parent="a" * 16, start_ms=100, duration_ms=400)
    add_span(project, TRACE, "c" * 16, "tool load_csv", parent="a" * 16, start_ms=600, duration_ms=500,
             status_code=2)
    artifact = add_artifact(project, b"region,total\nnorth,12\nsouth,7\n", "text/csv")
    store(project, [
        round_record("conv-zh", 0, user_message="请告诉我华东地区上个月的销售额", final_answer="华东地区上月销售额为 1,234 万元。"),
        tool_record("conv-zh", tool="query_sales", round_id="conv-zh-r0", observation="华东: 1234 万元",
                    artifact_id=artifact.artifact_id),
        message_record("conv-zh", 0, "user", "请告诉我华东地区上个月的销售额"),
    ])
    return project


def log_in(page: Page, base: str) -> None:
    page.goto(base + "/accounts/login/")
    page.fill("#id_username", "ana")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)


def conversation_url(base: str, project, external_id: str) -> str:
    from dashboard.observatory.models import Conversation

    conversation = Conversation.objects.get(project=project, external_id=external_id)
    return f"{base}/p/{project.slug}/conversations/{conversation.pk}/"


def test_it_walks_the_timeline_diff_levels_and_artifact(page, live_server, seeded, tmp_path):
    base = live_server.url
    watch = page.console_watch
    log_in(page, base)
    expect(page.get_by_role("heading", name="Agents")).to_be_visible()
    watch.assert_clean("overview")

    page.goto(f"{base}/p/{seeded.slug}/conversations/")
    expect(page.get_by_test_id("conversation-table")).to_contain_text("conv-demo")
    watch.assert_clean("conversations")

    page.goto(conversation_url(base, seeded, "conv-demo"))
    expect(page.get_by_test_id("round")).to_have_count(4)
    page.wait_for_function("document.querySelector('canvas[data-chart=\"token-budget\"]').dataset.drawn === '1'")
    # Expand a tool call: htmx loads its observation into the <details>.
    first_call = page.get_by_test_id("tool-call").first
    first_call.get_by_test_id("observation-toggle").click()
    expect(first_call.get_by_test_id("observation")).to_contain_text("query_sales")
    expect(page.get_by_test_id("waterfall")).to_contain_text("tool load_csv")
    watch.assert_clean("conversation timeline")
    shot = README_SCREENSHOT if os.environ.get("OBSERVATORY_UPDATE_SCREENSHOT") == "1" else tmp_path / "timeline.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 10_000  # a real picture, not an empty page

    page.get_by_test_id("compression-link").first.click()
    expect(page.get_by_test_id("diff")).to_be_visible()
    expect(page.locator("tr[data-action=dropped]")).to_have_count(1)
    expect(page.get_by_test_id("summary")).to_contain_text("north region")
    watch.assert_clean("compression diff")

    page.go_back()
    page.get_by_test_id("levels-link").first.click()
    expect(page.locator(".level-col")).to_have_count(3)
    expect(page.locator(".level-col.seen")).to_have_count(1)
    watch.assert_clean("level comparison")

    page.goto(f"{base}/p/{seeded.slug}/artifacts/")
    page.locator("table[data-testid=artifact-table] a.mono").first.click()
    expect(page.get_by_test_id("preview")).to_contain_text("north")
    with page.expect_download() as download_info:
        page.get_by_test_id("download").click()
    download = download_info.value
    assert download.suggested_filename.endswith(".csv")
    assert Path(download.path()).read_bytes() == b"region,total\nnorth,12\nsouth,7\n"
    watch.assert_clean("artifact")

    page.goto(f"{base}/p/{seeded.slug}/tools/")
    page.get_by_role("link", name="load_csv").first.click()
    page.wait_for_function("document.querySelector('canvas[data-chart=\"histogram\"]').dataset.drawn === '1'")
    page.goto(f"{base}/p/{seeded.slug}/traces/{TRACE}/")
    expect(page.locator(".waterfall .bar")).to_have_count(3)
    watch.assert_clean("tools and trace")


def test_it_shows_chinese_text(page, live_server, seeded):
    base = live_server.url
    log_in(page, base)
    page.goto(conversation_url(base, seeded, "conv-zh"))
    expect(page.get_by_test_id("conversation-title")).to_contain_text("华东地区")
    expect(page.locator(".event.answer")).to_contain_text("1,234 万元")
    # A CJK font is installed, so the characters take real width (no tofu boxes of zero width).
    width = page.evaluate("""() => {
        const span = document.createElement('span');
        span.textContent = '华东地区销售额';
        document.body.appendChild(span);
        return span.getBoundingClientRect().width;
    }""")
    assert width > 50
    page.console_watch.assert_clean("chinese conversation")


def test_it_polls_new_conversations_into_the_list(page, live_server, seeded):
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{seeded.slug}/conversations/")
    store(seeded, [round_record("conv-fresh", 0, at=HOUR.replace(year=HOUR.year + 1), user_message="fresh one")])
    page.evaluate("htmx.trigger('#conversation-rows', 'every 10s')")  # no need to wait 10 s
    page.evaluate("htmx.ajax('GET', document.querySelector('#conversation-rows').getAttribute('hx-get'), "
                  "{target: '#conversation-rows', swap: 'outerHTML'})")
    expect(page.get_by_test_id("conversation-table")).to_contain_text("conv-fresh")
    page.console_watch.assert_clean("conversation polling")


def test_it_changes_the_compression_config_in_the_admin(page, live_server, seeded):
    from dashboard.tuning.models import CompressionProfile
    from dashboard.tuning.services import effective_config

    base = live_server.url
    log_in(page, base)
    page.goto(base + "/admin/tuning/compressionprofile/add/")
    page.select_option("#id_project", label="Agents")
    page.fill("#id_name", "tight")
    config = {"strategy": "truncate", "keep_recent": 2, "threshold_ratio": 0.7, "target_ratio": 0.3}
    page.fill("#id_config", json.dumps(config))
    page.check("#id_is_active")
    page.fill("#id_preview_conversation", "conv-demo")
    page.fill("#id_preview_target_tokens", "50")
    page.get_by_test_id("preview-button").click()
    expect(page.get_by_test_id("preview-result")).to_be_visible()
    assert not CompressionProfile.objects.exists()  # a preview saves nothing
    page.click("input[name=_save]")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    profile = CompressionProfile.objects.get()
    assert profile.is_active and profile.config == config
    assert effective_config(project=seeded).compression == config
    page.console_watch.assert_clean("admin")


def test_a_failed_model_call_is_a_gap_in_the_drawn_token_budget(page, live_server, seeded):
    """The chart leaves the failed round's point out (Chart.js skips a null point and,
    with spanGaps off, breaks the line there): no drop to 0."""
    store(seeded, [round_record("conv-gap", 0, context_tokens=1000),
                   round_record("conv-gap", 1, context_tokens=0, status="error", final_answer=None),
                   round_record("conv-gap", 2, context_tokens=3000)])
    log_in(page, live_server.url)
    page.goto(conversation_url(live_server.url, seeded, "conv-gap"))
    page.wait_for_function("document.querySelector('canvas[data-chart=\"token-budget\"]').dataset.drawn === '1'")
    drawn = page.evaluate("""() => {
        const chart = window.Chart.getChart(document.querySelector('canvas[data-chart="token-budget"]'));
        const meta = chart.getDatasetMeta(0);
        return {data: chart.data.datasets[0].data, skipped: meta.data.map((point) => point.skip),
                spanGaps: chart.data.datasets[0].spanGaps};
    }""")
    assert drawn == {"data": [1000, None, 3000], "skipped": [False, True, False], "spanGaps": False}
    page.console_watch.assert_clean("conversation with a failed round")

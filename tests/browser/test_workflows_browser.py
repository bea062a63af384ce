"""The debugging workflows in a real browser (Debian's Chromium through
Playwright): keyboard navigation, copy buttons, the dark theme, comparing two
conversations, saving a view, and a chart bucket's drill-down. Every page is
checked for console errors (a CSP violation lands there). Skipped unless
OBSERVATORY_BROWSER_TESTS=1 (deploy/test.sh sets it)."""

from __future__ import annotations

import os
import re
from datetime import timedelta

import pytest

if os.environ.get("OBSERVATORY_BROWSER_TESTS") != "1":
    pytest.skip("browser tests: set OBSERVATORY_BROWSER_TESTS=1", allow_module_level=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import expect  # noqa: E402

from tests.browser import test_pages_browser as pages_browser  # noqa: E402
from tests.browser.test_pages_browser import ConsoleWatch, log_in  # noqa: E402
from tests.dashboard.web.pages_factories import HOUR, PASSWORD, full_conversation  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# The pages' browser fixtures, shared: one Chromium per module, plain-HTTP cookies.
browser = pages_browser.browser
insecure_cookies = pages_browser.insecure_cookies
CURRENT = re.compile(r"\bkbd-current\b")


@pytest.fixture
def project(django_user_model):
    from dashboard.accounts.services import project_create

    user = django_user_model.objects.create_user("ana", password=PASSWORD)
    project = project_create(name="Agents", owner=user)
    full_conversation(project, "run-a", rounds=3)
    full_conversation(project, "run-b", rounds=4)
    return project


def new_page(browser, live_server, color_scheme="light", clipboard=False):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme=color_scheme)
    if clipboard:
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.console_watch = ConsoleWatch(page)
    return context, page


@pytest.fixture
def page(browser, live_server, insecure_cookies):
    context, page = new_page(browser, live_server, clipboard=True)
    yield page
    context.close()


def test_it_walks_the_list_and_timeline_with_the_keyboard(page, live_server, project):
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{project.slug}/conversations/")
    rows = page.locator("[data-nav-row]")
    expect(rows).to_have_count(2)
    page.keyboard.press("j")
    expect(rows.nth(0)).to_have_class(CURRENT)
    page.keyboard.press("j")
    expect(rows.nth(1)).to_have_class(CURRENT)
    page.keyboard.press("k")
    expect(rows.nth(0)).to_have_class(CURRENT)
    page.keyboard.press("/")
    expect(page.locator("[data-search]")).to_be_focused()
    page.keyboard.type("jk")  # typing in the search box moves nothing
    expect(rows.nth(0)).to_have_class(CURRENT)
    page.locator("h1").click()
    page.keyboard.press("Enter")
    page.wait_for_url("**/conversations/*/")
    rounds = page.locator(".timeline-main > section.round")
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(rounds.nth(1)).to_have_class(CURRENT)
    page.console_watch.assert_clean("keyboard navigation")


def test_it_copies_an_id(page, live_server, project):
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{project.slug}/conversations/")
    button = page.locator("button[data-copy='run-a']")
    button.click()
    expect(button).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == "run-a"
    page.console_watch.assert_clean("copy")


@pytest.mark.parametrize("scheme, background", [("dark", "rgb(17, 23, 34)"), ("light", "rgb(246, 247, 249)")])
def test_it_follows_the_systems_colour_scheme(browser, live_server, insecure_cookies, project, scheme, background):
    context, page = new_page(browser, live_server, color_scheme=scheme)
    try:
        log_in(page, live_server.url)
        for path in ("", "conversations/", "tools/"):
            page.goto(f"{live_server.url}/p/{project.slug}/{path}")
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") == background
        page.console_watch.assert_clean(f"{scheme} theme")
    finally:
        context.close()


def test_it_compares_two_ticked_conversations(page, live_server, project):
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{project.slug}/conversations/")
    page.keyboard.press("j")
    page.keyboard.press("x")  # tick from the keyboard
    page.locator("[data-nav-row] input[type=checkbox]").nth(1).check()
    page.get_by_test_id("compare-selected").click()
    page.wait_for_url("**/compare/?a=*&b=*")
    expect(page.locator(".compare-row")).to_have_count(4)
    expect(page.locator(".compare-row.differs")).not_to_have_count(0)
    expect(page.locator("tr[data-summary=rounds] [data-field=delta]")).to_have_text(re.compile(r"^[+−]1$"))  # 3 vs 4 rounds
    page.console_watch.assert_clean("compare")


def test_it_saves_a_view_and_opens_it_from_the_nav(page, live_server, project):
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{project.slug}/conversations/?has_errors=on&sort=started_at")
    page.fill("input[name=name]", "failing, oldest first")
    page.get_by_test_id("save-view").locator("button").click()
    expect(page.locator(".notice")).to_contain_text("failing, oldest first")
    page.get_by_role("link", name="Saved views").click()
    page.get_by_role("link", name="failing, oldest first").click()
    page.wait_for_url("**/conversations/?has_errors=on&sort=started_at")
    expect(page.locator("#id_has_errors")).to_be_checked()
    page.console_watch.assert_clean("saved views")


def test_it_drills_from_a_chart_bucket_into_the_conversation_list(page, live_server, project):
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{project.slug}/?range=24h")
    page.wait_for_function("document.querySelector('canvas[data-chart=\"usage\"]').dataset.drawn === '1'")
    bucket = HOUR.isoformat()
    point = page.evaluate("""(bucket) => {
        const canvas = document.querySelector('canvas[data-chart="usage"]');
        const data = JSON.parse(document.getElementById('series-data').textContent);
        const i = data.starts.indexOf(bucket);
        const bar = Chart.getChart(canvas).getDatasetMeta(0).data[i];
        const box = canvas.getBoundingClientRect();
        return {x: box.left + bar.x, y: box.top + bar.y + 2};
    }""", bucket)
    page.mouse.click(point["x"], point["y"])
    until = HOUR + timedelta(hours=1)
    page.wait_for_url(f"**/conversations/?since={HOUR:%Y-%m-%dT%H:%M}&until={until:%Y-%m-%dT%H:%M}")
    expect(page.get_by_test_id("conversation-table")).to_contain_text("run-a")
    page.console_watch.assert_clean("chart drill-down")

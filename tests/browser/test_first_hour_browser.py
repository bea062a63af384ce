"""A new user's first hour, in a real browser (Debian's Chromium through Playwright)
at a desktop's width (1400 px) and a phone's (390 px): every page fits the screen
(no sideways scroll, the nav one row, "Log out" on screen), the logs have their place
in the nav, the overview opens on a range that holds the data and says so, and search
looks at what users and the model said unless asked for more. Every page is checked
for console errors. Skipped unless OBSERVATORY_BROWSER_TESTS=1 (deploy/test.sh sets it)."""

from __future__ import annotations

import pytest

# Importing the pages' browser tests skips this module with them (unless
# OBSERVATORY_BROWSER_TESTS=1); their fixtures serve here too.
from tests.browser import test_pages_browser as pages_browser
from tests.browser.test_pages_browser import TRACE, ConsoleWatch, conversation_url, log_in

from playwright.sync_api import Page, expect  # noqa: E402  (after the skip)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
browser, insecure_cookies, seeded = pages_browser.browser, pages_browser.insecure_cookies, pages_browser.seeded
WIDTHS = [1400, 390]

# The elements that stick out past the right edge of the screen, outermost first
# (an element inside one that already sticks out is not named again).
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth, found = [];
  for (const el of document.body.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.right <= width + 1) continue;
    if (found.some((outer) => outer.contains(el))) continue;
    let clipped = false;  // inside a box that scrolls or clips it: not the page's problem
    for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
      const style = getComputedStyle(up);
      if (['auto', 'scroll', 'hidden'].includes(style.overflowX) && up.getBoundingClientRect().right <= width + 1) {
        clipped = true; break;
      }
    }
    if (!clipped) found.push(el);
  }
  return found.map((el) => el.tagName.toLowerCase() + (el.className ? '.' + String(el.className).split(' ').join('.') : '')
    + ' right=' + Math.round(el.getBoundingClientRect().right));
}"""


@pytest.fixture(params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def page(request, browser, live_server, insecure_cookies):
    context = browser.new_context(viewport={"width": request.param, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.console_watch = ConsoleWatch(page)  # type: ignore[attr-defined]
    yield page
    context.close()


def assert_fits(page: Page, where: str) -> None:
    width = page.viewport_size["width"]
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{where} scrolls sideways at {width} px ({scroll} px): {page.evaluate(OVERFLOWING)}"
    logout = page.get_by_role("button", name="Log out").bounding_box()
    assert logout and 0 <= logout["x"] and logout["x"] + logout["width"] <= width, f"Log out off-screen on {where}"
    nav = page.locator(".topbar nav")
    if nav.count():
        box = nav.bounding_box()
        assert box["height"] <= 40, f"the nav is {box['height']} px high on {where} (one row, not a block)"
        current = nav.locator("a.current")
        if current.count():  # the section you are in is in sight, not scrolled off the row
            link = current.bounding_box()
            assert link["x"] >= 0 and link["x"] + link["width"] <= width, f"current section off-screen on {where}"
    header = page.locator(".topbar").bounding_box()
    assert header["height"] <= 110, f"the top bar is {header['height']} px high on {where}"
    page.console_watch.assert_clean(where)


def test_every_page_fits_the_screen(page, live_server, seeded):
    from dashboard.observatory.models import Artifact, CompressionEvent, Conversation, ToolExecution

    base = live_server.url
    log_in(page, base)
    slug = seeded.slug
    demo = Conversation.objects.get(project=seeded, external_id="conv-demo")
    other = Conversation.objects.get(project=seeded, external_id="conv-zh")
    execution = ToolExecution.objects.filter(project=seeded).first()
    compression = CompressionEvent.objects.filter(conversation=demo).first()
    artifact = Artifact.objects.filter(project=seeded).first()
    pages = {
        "overview": f"/p/{slug}/",
        "conversations": f"/p/{slug}/conversations/",
        "timeline": conversation_url(base, seeded, "conv-demo")[len(base):],
        "compare": f"/p/{slug}/compare/?a={demo.pk}&b={other.pk}",
        "tools": f"/p/{slug}/tools/",
        "tool": f"/p/{slug}/tools/load_csv/",
        "levels": f"/p/{slug}/tool-executions/{execution.pk}/levels/",
        "compression": f"/p/{slug}/compressions/{compression.pk}/",
        "traces": f"/p/{slug}/traces/",
        "trace": f"/p/{slug}/traces/{TRACE}/",
        "logs": f"/p/{slug}/logs/",
        "artifacts": f"/p/{slug}/artifacts/",
        "artifact": f"/p/{slug}/artifacts/{artifact.artifact_id}/",
        "saved views": f"/p/{slug}/views/",
        "keys": f"/p/{slug}/keys/",
    }
    for where, path in pages.items():
        page.goto(base + path)
        page.wait_for_load_state("load")
        assert_fits(page, where)


def test_the_logs_have_their_place_in_the_nav(page, live_server, seeded):
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{seeded.slug}/")
    page.locator(".topbar nav").get_by_role("link", name="Logs").click()
    page.wait_for_url(f"**/p/{seeded.slug}/logs/")
    nav = page.locator(".topbar nav")
    expect(nav.locator("a.current")).to_have_text("Logs")
    expect(page.get_by_test_id("logs-empty")).to_contain_text(f"{base}/v1/logs")
    assert_fits(page, "logs")


def test_the_overview_opens_on_the_range_that_holds_the_data(page, live_server, seeded):
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{seeded.slug}/")
    expect(page.get_by_test_id("range-why")).to_have_text("24h: the smallest range that holds the data")
    page.wait_for_function("document.querySelector('canvas[data-chart=\"usage\"]').dataset.drawn === '1'")
    assert_fits(page, "overview")


def test_search_reads_what_was_said_unless_asked_for_more(page, live_server, seeded):
    from tests.dashboard.web.pages_factories import message_record, round_record, store

    prompt = "You are a business analyst. Skills: revenue reports."
    for external_id, text in [("said-revenue", "What was revenue in March?"), ("said-hello", "Hello there")]:
        store(seeded, [round_record(external_id, 0, user_message=text),
                       message_record(external_id, 0, "system", prompt), message_record(external_id, 1, "user", text)])
    base = live_server.url
    log_in(page, base)
    page.goto(f"{base}/p/{seeded.slug}/conversations/")
    table = page.get_by_test_id("conversation-table")
    page.locator("[data-search]").fill("revenue")
    page.get_by_role("button", name="Filter").click()
    expect(table).to_contain_text("said-revenue")
    expect(table).not_to_contain_text("said-hello")  # "revenue" is only in its system prompt
    assert_fits(page, "search")
    page.get_by_label("also system and tool text").check()
    page.get_by_role("button", name="Filter").click()
    expect(table).to_contain_text("said-hello")
    expect(page.get_by_label("also system and tool text")).to_be_checked()
    assert_fits(page, "search everywhere")

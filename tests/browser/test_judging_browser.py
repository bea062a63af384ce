"""Scoring in a real browser (Debian's Chromium through Playwright): thumbs and a
comment from the keyboard on the round moved to with j, a config's label by mouse on
a tool call, both swapped in place by htmx under the CSP; the scores summary's chart
drawn and drilled into. Every page is checked for console errors (a CSP violation
lands there). Skipped unless OBSERVATORY_BROWSER_TESTS=1 (deploy/test.sh sets it)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("OBSERVATORY_BROWSER_TESTS") != "1":
    pytest.skip("browser tests: set OBSERVATORY_BROWSER_TESTS=1", allow_module_level=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import expect  # noqa: E402

from tests.browser import test_pages_browser as pages_browser  # noqa: E402
from tests.browser.test_pages_browser import log_in  # noqa: E402
from tests.browser.test_workflows_browser import new_page  # noqa: E402
from tests.dashboard.web.pages_factories import PASSWORD, full_conversation  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
browser = pages_browser.browser
insecure_cookies = pages_browser.insecure_cookies


@pytest.fixture
def project(django_user_model):
    from dashboard.accounts.services import project_create
    from dashboard.judging.models import ScoreConfig

    user = django_user_model.objects.create_user("ana", password=PASSWORD)
    project = project_create(name="Agents", owner=user)
    full_conversation(project, "run-a", rounds=3)
    ScoreConfig.objects.create(project=project, name="verdict", kind="categorical", labels=["correct", "wrong"],
                               negative_labels=["wrong"])
    return project


@pytest.fixture
def page(browser, live_server, insecure_cookies):
    context, page = new_page(browser, live_server)
    yield page
    context.close()


def test_it_scores_a_round_from_the_keyboard_and_a_tool_call_by_mouse(page, live_server, project):
    from dashboard.judging.models import Score
    from dashboard.observatory.models import Conversation

    conversation = Conversation.objects.get(project=project, external_id="run-a")
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/p/{project.slug}/conversations/{conversation.pk}/")
    rounds = page.locator(".timeline-main > section.round")
    page.keyboard.press("j")
    page.keyboard.press("j")  # the second round
    page.keyboard.press("+")
    second = rounds.nth(1).locator("> [data-scores]")
    expect(second.locator("[data-testid=score]")).to_contain_text("👍 yes")
    page.keyboard.press("c")
    expect(second.locator("[data-score-comment]")).to_be_focused()
    page.keyboard.type("right figure, clear")
    page.keyboard.press("Enter")  # saves the comment on the member's score: not another thumbs up
    expect(second.locator("[data-testid=score]")).to_contain_text("right figure, clear")
    page.keyboard.press("Escape")

    call = rounds.nth(0).locator("[data-testid=tool-call]").first
    call.locator("[data-score-more] > summary").click()  # the configs' choices load when opened
    call.locator("[data-score-pick]").select_option(label="verdict: wrong")
    call.locator("[data-score-save]").click()
    expect(call.locator("[data-testid=score].negative")).to_contain_text("wrong")
    scores = {(s.name, s.target): s for s in Score.objects.filter(project=project)}
    assert scores[("feedback", "round")].comment == "right figure, clear" and len(scores) == 2
    assert scores[("verdict", "tool_call")].label == "wrong"
    page.console_watch.assert_clean("scoring in place")


def test_it_draws_the_summary_and_drills_from_a_bucket(page, live_server, project):
    from dashboard.judging.services import Author, scores_store
    from pipeline import ScoreRecord

    scores_store(project=project, author=Author.of_key(None),
                 scores=[ScoreRecord(name="verdict", label="correct", conversation_id="run-a")])
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/p/{project.slug}/scores/?range=24h")
    page.wait_for_function("document.querySelector('canvas[data-chart=\"score-series\"]').dataset.drawn === '1'")
    point = page.evaluate("""() => {
        const canvas = document.querySelector('canvas[data-chart="score-series"]');
        const chart = Chart.getChart(canvas);  // every hour is a bar: the one with the score
        const bar = chart.getDatasetMeta(0).data[chart.data.datasets[0].data.findIndex((n) => n > 0)];
        const box = canvas.getBoundingClientRect();
        return {x: box.left + bar.x, y: box.top + bar.y + 2};
    }""")
    page.mouse.click(point["x"], point["y"])
    page.wait_for_url("**/conversations/?score=verdict&scored_since=*")
    expect(page.get_by_test_id("conversation-table")).to_contain_text("run-a")
    page.console_watch.assert_clean("scores summary")


def test_a_reviewer_scores_and_moves_on_with_one_key(page, live_server, project):
    from dashboard.judging.models import ReviewItem, Score
    from dashboard.judging.services import review_queue_create
    from dashboard.observatory.models import Conversation

    full_conversation(project, "run-b", rounds=1)
    queue = review_queue_create(project=project, name="today", query="", user=None,
                                conversations=Conversation.objects.filter(project=project).order_by("external_id"))
    log_in(page, live_server.url)
    page.goto(f"{live_server.url}/p/{project.slug}/review/{queue.pk}/")
    page.get_by_test_id("review-next").click()
    first = ReviewItem.objects.get(queue=queue, position=0)
    page.wait_for_url(f"**/review/{queue.pk}/items/{first.pk}/")
    page.keyboard.press("-")  # thumbs down on the conversation
    expect(page.get_by_test_id("scores-conversation").locator("[data-testid=score]")).to_contain_text("👎 no")
    page.keyboard.press("n")
    second = ReviewItem.objects.get(queue=queue, position=1)
    page.wait_for_url(f"**/review/{queue.pk}/items/{second.pk}/")
    first.refresh_from_db()
    assert first.status == "done" and Score.objects.get().conversation == first.conversation
    page.keyboard.press("s")
    page.wait_for_url(f"**/review/{queue.pk}/")
    expect(page.locator(".notice")).to_contain_text("Nothing left to review")
    page.console_watch.assert_clean("review queue")

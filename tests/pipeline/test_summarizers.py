"""ExtractiveSummarizer, LLMSummarizer (with fake LLMs: the model is the edge) and
the text-cutting helper, counted with the real DynamicTokenCounter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage

from pipeline import ExtractiveSummarizer, LLMSummarizer, Summarizer
from pipeline._summarizers import cut_to_tokens, estimate_tokens, first_sentence
from pipeline._tokens import DynamicTokenCounter

COUNTER = DynamicTokenCounter()


def count(text: str) -> int:
    return COUNTER.count_tokens(text, "claude-3-sonnet")


CONVERSATION = [
    "user: What were Q3 sales by region? Please include the east region too.",
    "assistant: Let me query the sales table.\n[tool call] sql_query({\"q\": \"select region, sum(revenue)\"})",
    "tool error sql_query: Operation failed.\nError Type: Timeout\nError Message: the query timed out after 30 s",
    "tool result sql_query: | region | revenue |\n| east | 1200 |\n| west | 900 |",
    "assistant: East leads with 1200. West follows with 900.",
]


def test_it_satisfies_the_summarizer_protocol() -> None:
    assert isinstance(ExtractiveSummarizer(), Summarizer)
    assert isinstance(LLMSummarizer(lambda prompt: "x"), Summarizer)


def test_it_keeps_the_first_sentence_of_each_message() -> None:
    summary = ExtractiveSummarizer(count).summarize(CONVERSATION, 500)
    assert summary.splitlines()[0] == "Summary of 5 earlier messages:"
    assert "- user: What were Q3 sales by region?" in summary
    assert "Please include the east region too" not in summary
    assert "- assistant: East leads with 1200." in summary
    assert "West follows" not in summary


def test_it_keeps_tool_call_and_error_lines() -> None:
    summary = ExtractiveSummarizer(count).summarize(CONVERSATION, 500)
    assert '[tool call] sql_query({"q": "select region, sum(revenue)"})' in summary
    assert "Error Message: the query timed out after 30 s" in summary
    assert "- tool error sql_query: Operation failed." in summary
    assert "| east | 1200 |" not in summary  # a table row is neither a call nor an error


def test_it_ends_chinese_sentences_at_the_full_stop() -> None:
    text = "user: 请统计扬州分公司第三季度的销售额。另外按月份拆分。\n[tool call] sql_query({})\n查询失败：连接超时"
    summary = ExtractiveSummarizer(count).summarize([text], 300)
    assert "- user: 请统计扬州分公司第三季度的销售额。" in summary
    assert "另外按月份拆分" not in summary
    assert "查询失败：连接超时" in summary  # 失败 / 超时 mark an error line


def test_it_is_deterministic() -> None:
    summarizer = ExtractiveSummarizer(count)
    assert summarizer.summarize(CONVERSATION, 80) == summarizer.summarize(list(CONVERSATION), 80)


def test_it_fits_the_budget_keeping_both_ends_of_a_long_span() -> None:
    texts = [f"user: Question number {i} about the revenue of branch {i}." for i in range(200)]
    summary = ExtractiveSummarizer(count).summarize(texts, 120)
    assert count(summary) <= 120
    assert "Question number 0 " in summary
    assert "Question number 199 " in summary
    assert "messages omitted" in summary


def test_it_drops_detail_lines_before_whole_messages() -> None:
    texts = [f"assistant: Step {i}.\n[tool call] fetch_page({{\"page\": {i}, \"filter\": \"{'x' * 80}\"}})" for i in range(6)]
    summary = ExtractiveSummarizer(count).summarize(texts, 70)
    assert count(summary) <= 70
    assert all(f"Step {i}." in summary for i in range(6))
    assert "[tool call]" not in summary


def test_it_estimates_generously_without_a_counter() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abc") == 1
    assert estimate_tokens("扬州") == 2  # 6 UTF-8 bytes
    summary = ExtractiveSummarizer().summarize(CONVERSATION * 20, 60)
    assert count(summary) <= 60


def test_it_skips_blank_messages_and_costs_nothing() -> None:
    summarizer = ExtractiveSummarizer(count)
    assert summarizer.summarize(["", "   ", "user: hi."], 50) == "Summary of 3 earlier messages:\n- user: hi."
    assert summarizer.estimate_cost_usd(10_000, 500) == 0.0


@pytest.mark.parametrize("max_tokens", [0, -5])
def test_it_refuses_a_non_positive_budget(max_tokens: int) -> None:
    with pytest.raises(ValueError):
        ExtractiveSummarizer().summarize(CONVERSATION, max_tokens)
    with pytest.raises(ValueError):
        LLMSummarizer(lambda prompt: "x").summarize(CONVERSATION, max_tokens)


def test_it_cuts_a_first_sentence_to_a_bound() -> None:
    assert first_sentence("no full stop here at all", 10) == "no full s…"
    assert first_sentence("Version 2.1 ships. Then more.", 100) == "Version 2.1 ships."


@settings(max_examples=40, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("abc 。.扬州xyz\n")), max_size=400), budget=st.integers(1, 60))
def test_it_cuts_text_to_a_token_budget(text: str, budget: int) -> None:
    cut = cut_to_tokens(text, budget, count)
    assert count(cut) <= budget
    if count(text) <= budget:
        assert cut == text
    elif cut not in ("", "…"):
        assert cut.endswith(" …") and text.startswith(cut[:-2])


def test_it_sends_the_conversation_to_a_fake_llm_callable() -> None:
    prompts: list[str] = []

    def fake_llm(prompt: str) -> str:
        prompts.append(prompt)
        return "  The user asked for Q3 sales; the first query timed out, the retry worked.  "

    summarizer = LLMSummarizer(fake_llm)
    assert summarizer.summarize(CONVERSATION, 300) == "The user asked for Q3 sales; the first query timed out, the retry worked."
    assert len(prompts) == 1
    assert "at most 300 tokens" in prompts[0]
    assert all(text in prompts[0] for text in CONVERSATION)
    assert summarizer.name == "llm"


def test_it_reads_the_reply_of_a_fake_langchain_chat_model() -> None:
    model = FakeListChatModel(responses=["East leads; west follows."])
    summarizer = LLMSummarizer(model, name="llm:fake-haiku")
    assert summarizer.summarize(CONVERSATION, 100) == "East leads; west follows."
    assert summarizer.name == "llm:fake-haiku"


def test_it_joins_text_blocks_of_a_fake_llm_reply() -> None:
    reply = AIMessage(content=[{"type": "text", "text": "Part one. "}, {"type": "tool_use", "id": "x", "name": "n", "input": {}}, "Part two."])
    assert LLMSummarizer(lambda prompt: reply).summarize(CONVERSATION, 100) == "Part one. Part two."


@pytest.mark.parametrize("reply", ["", "   ", AIMessage(content="")])
def test_it_raises_on_an_empty_fake_llm_reply(reply: object) -> None:
    with pytest.raises(ValueError):
        LLMSummarizer(lambda prompt: reply).summarize(CONVERSATION, 100)


def test_it_raises_on_a_fake_llm_reply_that_is_not_text() -> None:
    with pytest.raises(TypeError):
        LLMSummarizer(lambda prompt: 42).summarize(CONVERSATION, 100)


def test_it_names_itself_after_the_model() -> None:
    class FakeChatModel:
        model_name = "claude-3-haiku"

        def invoke(self, prompt: str) -> str:
            return "ok"

    assert LLMSummarizer(FakeChatModel()).name == "llm:claude-3-haiku"


def test_it_estimates_cost_per_thousand_tokens() -> None:
    summarizer = LLMSummarizer(lambda prompt: "x", cost_per_1k_input=0.25, cost_per_1k_output=1.25)
    assert summarizer.estimate_cost_usd(2_000, 400) == pytest.approx(0.5 + 0.5)
    assert summarizer.estimate_cost_usd(-1, -1) == 0.0


@pytest.mark.parametrize("costs", [(-0.1, 0.0), (0.0, float("nan")), (0.0, float("inf")), (True, 0.0), ("0.1", 0.0)])
def test_it_refuses_bad_costs(costs: tuple) -> None:
    with pytest.raises(ValueError):
        LLMSummarizer(lambda prompt: "x", *costs)


def test_it_refuses_an_llm_it_cannot_call() -> None:
    with pytest.raises(TypeError):
        LLMSummarizer("claude-3-haiku")


def test_it_bounds_the_prompt_of_a_very_long_span() -> None:
    texts = [f"user: question {i} " + "x" * 3_000 for i in range(100)]
    summarizer = LLMSummarizer(lambda prompt: "x", max_chars_per_message=500, max_prompt_chars=10_000)
    prompt = summarizer.build_prompt(texts, 200)
    assert len(prompt) < 12_000
    assert "question 0 " in prompt and "question 99 " in prompt
    assert "messages omitted" in prompt
    assert "x" * 501 not in prompt

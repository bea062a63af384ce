"""End to end: the pipeline's RecordExporter sends scores to a live dashboard over
HTTP; they are stored once (a score sent again with its id too), linked to the round
the records describe, and a score outside its config is refused and counted."""

from __future__ import annotations

import pytest

from dashboard.judging.models import Score, ScoreConfig
from dashboard.observatory.models import Round
from pipeline import RecordExporter, parse_record

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_stores_what_the_exporter_scores(live_server, api_key, records, project):
    ScoreConfig.objects.create(project=project, name="stars", kind="numeric", min_value=1, max_value=5)
    exporter = RecordExporter(live_server.url, api_key, batch_size=10, flush_interval_ms=50, compress=True)
    try:
        assert exporter.submit(parse_record(records.round(conversation="conv-live", round_id="r1",
                                                          user_message="Sales by region?")))
        assert exporter.flush(timeout=20)
        assert exporter.score("grounded", True, conversation_id="conv-live", round_id="r1", score_id="g-r1",
                              comment="quotes 1,234")
        assert exporter.score("grounded", True, conversation_id="conv-live", round_id="r1", score_id="g-r1",
                              comment="quotes 1,234")  # the same score again
        assert exporter.score("stars", 9, conversation_id="conv-live")  # outside its config
        assert exporter.flush(timeout=20)
    finally:
        exporter.shutdown(timeout=5)
    stats = exporter.stats()
    assert (stats.scores_submitted, stats.scores_sent, stats.scores_failed) == (3, 2, 1)
    assert "stars must be within 1..5; got 9" in stats.last_error
    score = Score.objects.get(project=project)
    assert (score.score_id, score.kind, score.value, score.source) == ("g-r1", "boolean", 1.0, "api")
    assert score.round == Round.objects.get(project=project, round_id="r1")

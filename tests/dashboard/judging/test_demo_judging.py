"""The demo agent against a live dashboard fills the judging pages: its automatic
check scored on each round that ran a tool (linked to the round), and its small
regression dataset sent, fetched back from the API and replayed."""

from __future__ import annotations

import io
import re

import pytest

from dashboard.judging.models import Dataset, DatasetItem, Score
from dashboard.observatory.models import Round
from pipeline.demo.__main__ import main
from pipeline.demo.agent import GROUNDED_SCORE

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_demo_scores_its_rounds_and_replays_its_dataset(live_server, api_key, project, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    code = main(["--endpoint", live_server.url, "--api-key", api_key, "--conversations", "2", "--quiet",
                 "--no-telemetry", "--work-dir", str(tmp_path), "--flush-timeout", "20"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()[-2000:]
    summary = out.getvalue()
    scores = list(Score.objects.filter(project=project, name=GROUNDED_SCORE))
    assert scores and all(score.source == "api" and score.kind == "boolean" for score in scores)
    assert all(score.round is not None for score in scores)  # linked to the round its records described
    assert {score.round.conversation_id for score in scores} <= set(
        Round.objects.filter(project=project).values_list("conversation_id", flat=True))
    assert re.search(rf"scores +{len(scores)} made, {len(scores)} sent, 0 not stored", summary)
    dataset = Dataset.objects.get(project=project, name="demo regression")
    assert DatasetItem.objects.filter(dataset=dataset).count() == 3
    assert 'from the dashboard\'s "demo regression" 3/3' in summary

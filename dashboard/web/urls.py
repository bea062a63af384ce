"""The pages. Everything project-scoped lives under /p/<slug>/; ids in paths are
checked by converters before a view runs (a malformed one is a 404)."""

from django.urls import path

from dashboard import converters  # noqa: F401  (registers artifact_id and trace_id)

from .views import (
    artifacts,
    compare,
    compressions,
    conversations,
    datasets,
    home,
    keys,
    levels,
    logs,
    overview,
    reviews,
    saved_views,
    scores,
    timeline,
    tools,
    traces,
)

app_name = "web"
P = "p/<slug:project_slug>/"

urlpatterns = [
    path("", home.home, name="home"),
    path(P, overview.overview, name="overview"),
    path(P + "conversations/", conversations.conversation_list, name="conversations"),
    path(P + "conversations/rows/", conversations.conversation_rows, name="conversation_rows"),
    path(P + "conversations/export.csv", conversations.conversation_export, name="conversations_export"),
    path(P + "conversations/<int:pk>/tool-calls.csv", tools.tool_call_export, name="tool_calls_export"),
    path(P + "compare/", compare.compare_conversations, name="compare"),
    path(P + "views/", saved_views.saved_view_list, name="saved_views"),
    path(P + "views/<int:pk>/", saved_views.saved_view_open, name="saved_view"),
    path(P + "views/<int:pk>/delete/", saved_views.saved_view_remove, name="saved_view_delete"),
    path(P + "conversations/<int:pk>/", timeline.conversation_timeline, name="conversation"),
    path(P + "conversations/<int:pk>/export.json", timeline.conversation_export, name="conversation_export"),
    path(P + "tool-executions/<int:pk>/observation/", timeline.observation, name="observation"),
    path(P + "tool-executions/<int:pk>/levels/", levels.level_comparison, name="levels"),
    path(P + "rounds/<int:pk>/waterfall/", timeline.round_waterfall, name="round_waterfall"),
    path(P + "tools/", tools.tool_list, name="tools"),
    path(P + "tools/export.csv", tools.tool_stats_export, name="tools_export"),
    path(P + "tools/<path:tool_name>/", tools.tool_detail, name="tool"),
    path(P + "compressions/<int:pk>/", compressions.compression_detail, name="compression"),
    path(P + "artifacts/", artifacts.artifact_list, name="artifacts"),
    path(P + "artifacts/<artifact_id:artifact_id>/", artifacts.artifact_detail, name="artifact"),
    path(P + "artifacts/<artifact_id:artifact_id>/download", artifacts.artifact_download, name="artifact_download"),
    path(P + "traces/", traces.trace_list, name="traces"),
    path(P + "traces/<trace_id:trace_id>/", traces.trace_detail, name="trace"),
    path(P + "logs/", logs.log_list, name="logs"),
    path(P + "keys/", keys.key_list, name="keys"),
    path(P + "scores/", scores.score_overview, name="scores"),
    path(P + "scores/add/", scores.score_add, name="score_add"),
    path(P + "scores/form/", scores.score_form, name="score_form"),
    path(P + "scores/<int:pk>/edits/", scores.score_edit_history, name="score_edits"),
    path(P + "datasets/", datasets.dataset_list, name="datasets"),
    path(P + "datasets/add/", datasets.dataset_add, name="dataset_add"),
    path(P + "datasets/<int:pk>/", datasets.dataset_detail, name="dataset"),
    path(P + "datasets/<int:pk>/export.jsonl", datasets.dataset_export, name="dataset_export"),
    path(P + "datasets/<int:pk>/import/", datasets.dataset_import_file, name="dataset_import"),
    path(P + "datasets/<int:pk>/items/<int:item_pk>/", datasets.dataset_item_edit, name="dataset_item"),
    path(P + "datasets/<int:pk>/items/<int:item_pk>/delete/", datasets.dataset_item_remove,
         name="dataset_item_delete"),
    path(P + "review/", reviews.review_queue_list, name="review_queues"),
    path(P + "review/<int:pk>/", reviews.review_queue, name="review_queue"),
    path(P + "review/<int:pk>/refill/", reviews.review_queue_refill, name="review_queue_refill"),
    path(P + "review/<int:pk>/next/", reviews.review_next, name="review_next"),
    path(P + "review/<int:pk>/items/<int:item_pk>/", reviews.review_item, name="review_item"),
    path(P + "review/<int:pk>/items/<int:item_pk>/done/", reviews.review_item_done, name="review_item_done"),
    path(P + "keys/<int:pk>/revoke/", keys.key_revoke, name="key_revoke"),
]

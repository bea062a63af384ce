"""What only the pages need, one module per page family: keyset paging, chart
series, previews, labels. The reads themselves (conversation list, timeline, tool
statistics, spans, artifacts) are the domain's, in ``observatory.selectors``, shared
with the JSON read API. Every query is bounded (a page size, a time range or a
LIMIT) and rides an index named in dashboard/observatory/models.py."""

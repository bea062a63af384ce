"""Reads for the pages, one module per page family. Views call these and render;
every query here is bounded (a page size, a time range or a LIMIT) and rides an
index named in dashboard/observatory/models.py."""

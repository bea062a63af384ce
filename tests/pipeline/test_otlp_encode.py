"""Our span encoder writes exactly the bytes of the OpenTelemetry SDK's encoder."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from pipeline._otlp_encode import SpanGroups, encode_span, frame


def ours(spans: list[ReadableSpan]) -> bytes:
    groups = SpanGroups()
    by_group: dict[Any, list[bytes]] = {}
    for span in spans:
        by_group.setdefault(groups.group_of(span), []).append(encode_span(span))
    return frame(by_group)


@pytest.fixture
def finished() -> Any:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent", "n": 3, "ratio": 1.5, "on": False}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def test_it_encodes_every_span_feature_like_the_sdk(finished: Any) -> None:
    provider, exporter = finished
    library = provider.get_tracer("lib", "1.2", attributes={"scope.attr": "v"})
    other = provider.get_tracer("other")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("k", "v"), ("a", "b")]))
    attributes = {"text": "扬州 <b>", "negative": -5, "zero": 0, "empty": "", "float": 0.0, "flag": True,
                  "strings": ["a", "b"], "ints": [1, 2], "floats": [1.0], "flags": [True, False]}
    with library.start_as_current_span("root", context=trace.set_span_in_context(NonRecordingSpan(remote)),
                                       kind=SpanKind.SERVER, attributes=attributes,
                                       links=[Link(remote, {"link.attr": 1})]) as root:
        root.add_event("with attributes", {"x": 1})
        root.add_event("bare")
        with pytest.raises(ValueError):
            with other.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
                child.set_status(Status(StatusCode.OK))
                raise ValueError("boom")  # an exception event and an ERROR status
    for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.INTERNAL):
        with library.start_as_current_span("", kind=kind) as span:
            span.set_status(Status(StatusCode.ERROR, "bad"))
    spans = list(exporter.get_finished_spans())
    for span in spans:
        assert ours([span]) == encode_spans([span]).SerializeToString(), span.name
    assert ours(spans) == encode_spans(spans).SerializeToString()


scalar = st.one_of(st.text(max_size=20), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                   st.floats(allow_nan=False))
value = st.one_of(scalar, st.lists(st.text(max_size=5), max_size=4), st.lists(st.integers(-1000, 1000), max_size=4),
                  st.lists(st.booleans(), max_size=3))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12), value, max_size=8), st.text(max_size=30))
def test_it_encodes_any_attributes_like_the_sdk(attributes: dict[str, Any], name: str) -> None:
    span = ReadableSpan(
        name=name,
        context=SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(1)),
        resource=Resource.create({"service.name": "s"}),
        attributes=attributes,
        start_time=1,
        end_time=2**63 - 1,
    )
    assert ours([span]) == encode_spans([span]).SerializeToString()


def test_it_refuses_an_attribute_it_cannot_encode() -> None:
    span = ReadableSpan(name="x", context=SpanContext(1, 2, False), attributes={"bad": object()})
    with pytest.raises(TypeError):
        encode_span(span)

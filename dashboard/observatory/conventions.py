"""How span attributes of the conventions in use map onto the dashboard's concepts.

One declared table, ``RULES``: each row says that attribute ``key`` of convention
``convention`` gives concept ``concept`` (optionally only when another attribute has
a given value, and with its values translated). The first row that matches wins, so
the order of the rows is the precedence: the current OpenTelemetry GenAI semantic
conventions first, then their previous forms, OpenInference, OpenLLMetry (traceloop)
and the pipeline's own ``ba.*`` attributes. Messages come in three shapes
(``MESSAGE_RULES``): the GenAI JSON ``parts`` documents, the previous flattened
``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` keys, and OpenInference's
``llm.input_messages.N.message.*``.

Messages sent as log events tied to the span (``EVENT_RULES``: the GenAI events,
e.g. openai-v2's ``gen_ai.user.message`` / ``gen_ai.choice`` or the current
``gen_ai.client.inference.operation.details``) are read by ``event_messages``.

A new convention is a row here, nothing else: ingest (dashboard.ingest.spans), the
linking and the derivation of rounds, messages and tool executions from spans
(observatory.derive.passes.span_rows) all read spans through ``span_facts``. docs/conventions.md
is this table in prose. Pure Python, no Django.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

# The operations the dashboard knows; every convention's own names map onto these.
CHAT = "chat"
EXECUTE_TOOL = "execute_tool"
INVOKE_AGENT = "invoke_agent"
EMBEDDINGS = "embeddings"
RETRIEVAL = "retrieval"
OPERATIONS = (CHAT, EXECUTE_TOOL, INVOKE_AGENT, EMBEDDINGS, RETRIEVAL)

GENAI = "GenAI semconv"
GENAI_PREVIOUS = "GenAI semconv (previous)"
OPENINFERENCE = "OpenInference"
OPENLLMETRY = "OpenLLMetry"
PIPELINE = "pipeline (ba.*)"
OTEL = "OpenTelemetry general"

ANY = "*"  # in ``values``: any non-empty value maps to the given one


@dataclass(frozen=True)
class Rule:
    concept: str
    convention: str
    key: str
    # Only when attribute when[0] has the value when[1] (e.g. OpenInference's
    # input.value is a tool's arguments only on a TOOL span).
    when: Optional[tuple[str, str]] = None
    # Translate values (operation names); a value not listed does not match.
    values: Optional[Mapping[str, str]] = None
    # Also read the resource's attributes (after the span's own, for every row).
    resource: bool = False


def _op(**names: str) -> dict[str, str]:
    return dict(names)


_OI_TOOL = ("openinference.span.kind", "TOOL")
_TL_TOOL = ("traceloop.span.kind", "tool")

RULES: tuple[Rule, ...] = (
    # conversation / session
    Rule("conversation", GENAI, "gen_ai.conversation.id", resource=True),
    Rule("conversation", OPENINFERENCE, "session.id", resource=True),
    Rule("conversation", OPENLLMETRY, "traceloop.association.properties.session_id", resource=True),
    Rule("conversation", OPENLLMETRY, "traceloop.association.properties.conversation_id", resource=True),
    # user
    Rule("user", OPENINFERENCE, "user.id", resource=True),
    Rule("user", OTEL, "enduser.id", resource=True),
    Rule("user", OPENLLMETRY, "traceloop.association.properties.user_id", resource=True),
    # agent
    Rule("agent", GENAI, "gen_ai.agent.name"),
    Rule("agent", OPENINFERENCE, "agent.name"),
    Rule("agent", OPENLLMETRY, "traceloop.entity.name", when=("traceloop.span.kind", "agent")),
    # model: the one that answered, else the one asked for
    Rule("model", GENAI, "gen_ai.response.model"),
    Rule("model", GENAI, "gen_ai.request.model"),
    Rule("model", OPENINFERENCE, "llm.model_name"),
    Rule("model", OPENLLMETRY, "llm.response.model"),
    Rule("model", OPENLLMETRY, "llm.request.model"),
    # provider
    Rule("provider", GENAI, "gen_ai.provider.name"),
    Rule("provider", GENAI_PREVIOUS, "gen_ai.system"),
    Rule("provider", OPENINFERENCE, "llm.provider"),
    Rule("provider", OPENINFERENCE, "llm.system"),
    # operation
    Rule("operation", GENAI, "gen_ai.operation.name", values=_op(
        chat=CHAT, text_completion=CHAT, generate_content=CHAT, execute_tool=EXECUTE_TOOL,
        invoke_agent=INVOKE_AGENT, embeddings=EMBEDDINGS, retrieval=RETRIEVAL,
    )),
    Rule("operation", OPENINFERENCE, "openinference.span.kind", values=_op(
        LLM=CHAT, TOOL=EXECUTE_TOOL, AGENT=INVOKE_AGENT, EMBEDDING=EMBEDDINGS, RETRIEVER=RETRIEVAL,
    )),
    Rule("operation", OPENLLMETRY, "traceloop.span.kind", values=_op(tool=EXECUTE_TOOL, agent=INVOKE_AGENT)),
    Rule("operation", OPENLLMETRY, "llm.request.type", values=_op(
        chat=CHAT, completion=CHAT, embedding=EMBEDDINGS, rerank=RETRIEVAL,
    )),
    Rule("operation", GENAI, "gen_ai.tool.name", values={ANY: EXECUTE_TOOL}),  # a tool span without an operation
    # tool name and call id
    Rule("tool_name", GENAI, "gen_ai.tool.name"),
    Rule("tool_name", OPENINFERENCE, "tool.name", when=_OI_TOOL),
    Rule("tool_name", OPENLLMETRY, "traceloop.entity.name", when=_TL_TOOL),
    Rule("tool_call_id", GENAI, "gen_ai.tool.call.id"),
    Rule("tool_call_id", OPENINFERENCE, "tool_call.id"),
    # a tool's arguments and result
    Rule("tool_arguments", GENAI, "gen_ai.tool.call.arguments"),
    Rule("tool_arguments", OPENINFERENCE, "tool.parameters", when=_OI_TOOL),
    Rule("tool_arguments", OPENINFERENCE, "input.value", when=_OI_TOOL),
    Rule("tool_arguments", OPENLLMETRY, "traceloop.entity.input", when=_TL_TOOL),
    Rule("tool_result", GENAI, "gen_ai.tool.call.result"),
    Rule("tool_result", OPENINFERENCE, "output.value", when=_OI_TOOL),
    Rule("tool_result", OPENLLMETRY, "traceloop.entity.output", when=_TL_TOOL),
    # tokens
    Rule("input_tokens", GENAI, "gen_ai.usage.input_tokens"),
    Rule("input_tokens", GENAI_PREVIOUS, "gen_ai.usage.prompt_tokens"),
    Rule("input_tokens", OPENINFERENCE, "llm.token_count.prompt"),
    Rule("input_tokens", OPENLLMETRY, "llm.usage.prompt_tokens"),
    Rule("output_tokens", GENAI, "gen_ai.usage.output_tokens"),
    Rule("output_tokens", GENAI_PREVIOUS, "gen_ai.usage.completion_tokens"),
    Rule("output_tokens", OPENINFERENCE, "llm.token_count.completion"),
    Rule("output_tokens", OPENLLMETRY, "llm.usage.completion_tokens"),
    # errors (also: status ERROR, and an "exception" event's exception.type)
    Rule("error_type", OTEL, "error.type"),
    Rule("error_type", OPENINFERENCE, "exception.type"),
    # the model's context window, when the agent says it
    Rule("context_window", PIPELINE, "ba.context_window"),
)

# Where messages are, in which shape; the first one a span has wins.
PARTS_JSON = "GenAI JSON parts"
INDEXED = "indexed gen_ai.prompt.N.*"
OPENINFERENCE_INDEXED = "indexed llm.*_messages.N.message.*"


@dataclass(frozen=True)
class MessageRule:
    concept: str  # input_messages / output_messages
    convention: str
    key: str  # the attribute, or the prefix of the indexed keys
    shape: str


MESSAGE_RULES: tuple[MessageRule, ...] = (
    MessageRule("input_messages", GENAI, "gen_ai.input.messages", PARTS_JSON),
    MessageRule("input_messages", GENAI_PREVIOUS, "gen_ai.prompt", INDEXED),
    MessageRule("input_messages", OPENINFERENCE, "llm.input_messages", OPENINFERENCE_INDEXED),
    MessageRule("output_messages", GENAI, "gen_ai.output.messages", PARTS_JSON),
    MessageRule("output_messages", GENAI_PREVIOUS, "gen_ai.completion", INDEXED),
    MessageRule("output_messages", OPENINFERENCE, "llm.output_messages", OPENINFERENCE_INDEXED),
)

# Values that say nothing (traceloop writes "unknown" when a model has no name).
EMPTY_VALUES = frozenset({"", "unknown", "None", "null"})
# The keys any rule reads: a span with none of them is not a GenAI span.
KEYS = frozenset(rule.key for rule in RULES) | frozenset(rule.key for rule in MESSAGE_RULES if rule.shape == PARTS_JSON)
MESSAGE_PREFIXES = tuple(rule.key + "." for rule in MESSAGE_RULES if rule.shape != PARTS_JSON)
_MESSAGE_KEYS = tuple(rule.key for rule in MESSAGE_RULES)  # what every key holding messages starts with
TEXT_LIMIT = 16 * 1024  # a message or tool argument kept from a span, at most
# What ingest (dashboard.ingest.otlp) appends to a value it cut to its limits.
TRUNCATION_MARKER = "…[truncated]"


@dataclass
class ToolCallFact:
    id: str
    name: str
    arguments: Any


@dataclass
class MessageFact:
    role: str
    content: str = ""
    name: str = ""
    tool_call_id: str = ""
    tool_calls: list[ToolCallFact] = field(default_factory=list)


@dataclass
class SpanFacts:
    """What one span says in the dashboard's words ("" / None when it does not)."""

    conversation: str = ""
    user: str = ""
    agent: str = ""
    model: str = ""
    provider: str = ""
    operation: str = ""
    tool_name: str = ""
    tool_call_id: str = ""
    tool_arguments: Any = None
    tool_result: Any = None
    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    error_type: str = ""
    context_window: Optional[int] = None


_TEXT_CONCEPTS = ("conversation", "user", "agent", "model", "provider", "tool_name", "tool_call_id", "error_type")
_NUMBER_CONCEPTS = ("input_tokens", "output_tokens", "context_window")


# A token count past this is no count (what the token columns hold, and more than any context).
TOKENS_MAX = 2**31 - 1


def token_count_of(value: Any) -> Optional[int]:
    """``count_of`` for a token count: also None past TOKENS_MAX."""
    count = count_of(value)
    return count if count is not None and count <= TOKENS_MAX else None


def _text(value: Any) -> str:
    if value is None or isinstance(value, (dict, list)):
        return ""
    text = str(value).strip()
    return "" if text in EMPTY_VALUES else text


def count_of(value: Any) -> Optional[int]:
    """A count (a whole number >= 0, or its digits as text) from an attribute value; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.isdigit() and len(value) < 19:
        return int(value)
    return None


def _matches(rule: Rule, source: Mapping[str, Any]) -> Any:
    if rule.when is not None and str(source.get(rule.when[0], "")) != rule.when[1]:
        return None
    value = source.get(rule.key)
    if value is None or value == "":
        return None
    if rule.values is not None:
        name = str(value)
        return rule.values.get(name) or (rule.values.get(ANY) if ANY in rule.values else None)
    return value


def rules_for(concept: str) -> tuple[Rule, ...]:
    return tuple(rule for rule in RULES if rule.concept == concept)


_BY_CONCEPT = {concept: rules_for(concept) for concept in dict.fromkeys(rule.concept for rule in RULES)}


def value_of(concept: str, attributes: Mapping[str, Any], resource: Optional[Mapping[str, Any]] = None) -> Any:
    """The first value a rule of ``concept`` finds: span attributes by every rule,
    then the resource's by the rules that allow it."""
    rules = _BY_CONCEPT.get(concept, ())
    for rule in rules:
        value = _matches(rule, attributes)
        if value is not None and (concept not in _TEXT_CONCEPTS or _text(value)):
            return value
    if resource:
        for rule in rules:
            if rule.resource:
                value = _matches(rule, resource)
                if value is not None and _text(value):
                    return value
    return None


def text_of(concept: str, attributes: Mapping[str, Any], resource: Optional[Mapping[str, Any]] = None) -> str:
    """``value_of`` as text ("" when absent or not a scalar): what a column stores."""
    return _text(value_of(concept, attributes, resource))


def span_facts(
    attributes: Mapping[str, Any], resource: Optional[Mapping[str, Any]] = None,
    events: Optional[Iterable[Mapping[str, Any]]] = None,
) -> SpanFacts:
    """Read one span through the table."""
    attributes = attributes if isinstance(attributes, Mapping) else {}
    resource = resource if isinstance(resource, Mapping) else None
    facts = SpanFacts()
    for concept in _TEXT_CONCEPTS:
        setattr(facts, concept, _text(value_of(concept, attributes, resource)))
    for concept in _NUMBER_CONCEPTS:
        setattr(facts, concept, count_of(value_of(concept, attributes, resource)))
    facts.operation = value_of("operation", attributes) or ""
    facts.tool_arguments = value_of("tool_arguments", attributes)
    facts.tool_result = value_of("tool_result", attributes)
    if not facts.error_type and events:
        for event in events:
            if isinstance(event, Mapping) and event.get("name") == "exception":
                event_attributes = event.get("attributes")
                if isinstance(event_attributes, Mapping):
                    facts.error_type = _text(event_attributes.get("exception.type"))
                    break
    return facts


def is_genai(attributes: Mapping[str, Any], resource: Optional[Mapping[str, Any]] = None) -> bool:
    """Whether any rule reads something from this span."""
    if not KEYS.isdisjoint(attributes) or (resource and not KEYS.isdisjoint(resource)):
        return True
    return any(key.startswith(MESSAGE_PREFIXES) for key in attributes)


# --- messages ------------------------------------------------------------------------

_ROLES = {"human": "user", "ai": "assistant", "model": "assistant", "function": "tool"}


def _role(value: Any) -> str:
    role = _text(value).lower()
    return _ROLES.get(role, role)[:16]


def _clip(text: Any) -> str:
    if text is None:
        return ""
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False)
    return text[:TEXT_LIMIT]


JSON_TEXT_LIMIT = 256 * 1024  # JSON text read from a span value, at most (longer: kept as text)
JSON_DEPTH_LIMIT = 32  # objects and arrays inside each other (deeper: kept as text)


def json_or_text(value: Any) -> Any:
    """``value`` parsed when it is the JSON text of an object or array (what the
    conventions send as a string: arguments, message documents), else as it is: a
    text that is not JSON stays text. Bounded: a text longer than JSON_TEXT_LIMIT,
    or nested deeper than JSON_DEPTH_LIMIT, stays text (the parser would recurse
    once per level)."""
    if not isinstance(value, str) or len(value) > JSON_TEXT_LIMIT or value.lstrip()[:1] not in ("{", "["):
        return value
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return value
    return parsed if _depth_within(parsed, JSON_DEPTH_LIMIT) else value


def _depth_within(document: Any, limit: int) -> bool:
    """Whether no object or array of ``document`` lies more than ``limit`` deep (walked
    without recursion)."""
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def _parts_messages(raw: Any) -> list[MessageFact]:
    """The GenAI JSON form: [{"role", "parts": [{"type": "text", "content"},
    {"type": "tool_call", "id", "name", "arguments"}, {"type": "tool_call_response", "id", "response"}]}]."""
    document = json_or_text(raw)
    if not isinstance(document, list):
        return []
    messages = []
    for item in document:
        if not isinstance(item, Mapping):
            continue
        message = MessageFact(role=_role(item.get("role")), name=_text(item.get("name"))[:200])
        texts = []
        parts = item.get("parts")
        if isinstance(parts, list):
            for part in parts:
                if not isinstance(part, Mapping):
                    continue
                kind = part.get("type")
                if kind == "text" or (kind is None and "content" in part):
                    texts.append(_clip(part.get("content")))
                elif kind == "tool_call":
                    message.tool_calls.append(ToolCallFact(
                        _text(part.get("id")), _text(part.get("name")), json_or_text(part.get("arguments"))
                    ))
                elif kind == "tool_call_response":
                    message.tool_call_id = _text(part.get("id"))
                    texts.append(_clip(part.get("response")))
        elif "content" in item:
            texts.append(_clip(item.get("content")))
        message.content = "\n".join(text for text in texts if text)[:TEXT_LIMIT]
        messages.append(message)
    return messages


_INDEX = re.compile(r"(\d+)\.(.+)")


def _indexed(attributes: Mapping[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """{"p.0.role": x, "p.0.content": y} -> {0: {"role": x, "content": y}}."""
    found: dict[int, dict[str, Any]] = {}
    start = prefix + "."
    for key, value in attributes.items():
        if key.startswith(start):
            match = _INDEX.fullmatch(key[len(start):])
            if match and len(match.group(1)) < 6:
                found.setdefault(int(match.group(1)), {})[match.group(2)] = value
    return dict(sorted(found.items()))


def _indexed_messages(attributes: Mapping[str, Any], prefix: str, shape: str) -> list[MessageFact]:
    lead = "message." if shape == OPENINFERENCE_INDEXED else ""
    call = "tool_call." if shape == OPENINFERENCE_INDEXED else ""
    messages = []
    for fields in _indexed(attributes, prefix).values():
        message = MessageFact(
            role=_role(fields.get(lead + "role")),
            content=_clip(fields.get(lead + "content")) if fields.get(lead + "content") is not None else "",
            name=_text(fields.get(lead + "name"))[:200],
            tool_call_id=_text(fields.get(lead + "tool_call_id")),
        )
        calls = _indexed({k: v for k, v in fields.items()}, lead + "tool_calls")
        for each in calls.values():
            message.tool_calls.append(ToolCallFact(
                _text(each.get(call + "id")),
                _text(each.get(call + "function.name") if call else each.get("name")),
                json_or_text(each.get(call + "function.arguments") if call else each.get("arguments")),
            ))
        messages.append(message)
    return messages


def messages_of(concept: str, attributes: Mapping[str, Any]) -> list[MessageFact]:
    """A span's input or output messages, from the first shape it carries."""
    if not isinstance(attributes, Mapping) or not any(key.startswith(_MESSAGE_KEYS) for key in attributes):
        return []  # (one pass over the keys, not one per shape: most spans carry no messages)
    for rule in MESSAGE_RULES:
        if rule.concept != concept:
            continue
        if rule.shape == PARTS_JSON:
            if attributes.get(rule.key) not in (None, ""):
                messages = _parts_messages(attributes[rule.key])
                if messages:
                    return messages
        else:
            messages = _indexed_messages(attributes, rule.key, rule.shape)
            if messages:
                return messages
    return []


# --- messages sent as log events ---------------------------------------------------------
#
# Some instrumentations send the messages of a model call as log records (events) tied to
# its span instead of span attributes (opentelemetry-instrumentation-openai-v2 with content
# capture in EVENT_ONLY mode, the GenAI semantic conventions' events): one event per message
# in the previous conventions, one event with the whole input and output in the current one.
# The rows below say which event holds which messages in which shape; the span-row passes
# read them with ``event_messages`` and put them on the round of the event's span, as
# ``messages_of`` does with a span's attributes (docs/conventions.md).

EVENT_BODY = "event body {role, content, tool_calls, id}"
CHOICE_BODY = "choice body {index, finish_reason, message: {role, content, tool_calls}}"


@dataclass(frozen=True)
class EventRule:
    event: str  # the event (log record) name
    convention: str
    concept: str  # input_messages / output_messages
    role: str  # the role the event gives its message ("": the message says)
    shape: str  # EVENT_BODY, CHOICE_BODY, or PARTS_JSON in attribute ``key``
    key: str = ""


_DETAILS = "gen_ai.client.inference.operation.details"

EVENT_RULES: tuple[EventRule, ...] = (
    EventRule(_DETAILS, GENAI, "input_messages", "", PARTS_JSON, "gen_ai.input.messages"),
    EventRule(_DETAILS, GENAI, "output_messages", "", PARTS_JSON, "gen_ai.output.messages"),
    EventRule("gen_ai.system.message", GENAI_PREVIOUS, "input_messages", "system", EVENT_BODY),
    EventRule("gen_ai.user.message", GENAI_PREVIOUS, "input_messages", "user", EVENT_BODY),
    EventRule("gen_ai.assistant.message", GENAI_PREVIOUS, "input_messages", "assistant", EVENT_BODY),
    EventRule("gen_ai.tool.message", GENAI_PREVIOUS, "input_messages", "tool", EVENT_BODY),
    EventRule("gen_ai.choice", GENAI_PREVIOUS, "output_messages", "assistant", CHOICE_BODY),
)
MESSAGE_EVENTS = frozenset(rule.event for rule in EVENT_RULES)


def _event_tool_calls(value: Any) -> list[ToolCallFact]:
    """[{"id", "type": "function", "function": {"name", "arguments"}}] (or name/arguments flat)."""
    calls = []
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, Mapping):
            continue
        function = item.get("function") if isinstance(item.get("function"), Mapping) else item
        calls.append(ToolCallFact(_text(item.get("id")), _text(function.get("name")),
                                  json_or_text(function.get("arguments"))))
    return calls


def _body_message(body: Any, role: str) -> MessageFact:
    if not isinstance(body, Mapping):
        # a body that is the text itself (or nothing: content capture off)
        return MessageFact(role=role, content=_clip(body) if body is not None else "")
    message = MessageFact(role=_role(body.get("role")) or role, name=_text(body.get("name"))[:200])
    if body.get("content") is not None:
        message.content = _clip(body.get("content"))
    message.tool_calls = _event_tool_calls(body.get("tool_calls"))
    if message.role == "tool":
        message.tool_call_id = _text(body.get("id") or body.get("tool_call_id"))
    return message


def event_messages(event_name: str, body: Any, attributes: Any) -> tuple[list[MessageFact], list[MessageFact]]:
    """The (input, output) messages one log event carries, by ``EVENT_RULES``; two
    empty lists for an event the table does not name."""
    inputs: list[MessageFact] = []
    outputs: list[MessageFact] = []
    attributes = attributes if isinstance(attributes, Mapping) else {}
    for rule in EVENT_RULES:
        if rule.event != event_name:
            continue
        found = inputs if rule.concept == "input_messages" else outputs
        if rule.shape == PARTS_JSON:
            raw = attributes.get(rule.key)
            if raw in (None, "") and isinstance(body, Mapping):
                raw = body.get(rule.key)
            found.extend(_parts_messages(raw) if raw not in (None, "") else [])
        elif rule.shape == CHOICE_BODY:
            message = body.get("message") if isinstance(body, Mapping) else None
            found.append(_body_message(message if isinstance(message, Mapping) else {}, rule.role))
        else:
            found.append(_body_message(body, rule.role))
    return inputs, outputs


# --- the ingest's fast read -----------------------------------------------------------

_LINK_CONCEPTS = ("conversation", "tool_name", "tool_call_id", "operation")


def link_facts(attributes: Mapping[str, Any], resource: Mapping[str, Any], resource_has_keys: bool) -> tuple[str, str, str, str]:
    """(conversation, tool name, tool call id, operation) of one span, what ingest
    copies to columns. ``resource_has_keys``: whether the resource holds any key of
    the table (computed once per resource by the caller). A span without any key of
    the table costs one set test."""
    if KEYS.isdisjoint(attributes) and not resource_has_keys:
        return "", "", "", ""
    conversation = _text(value_of("conversation", attributes, resource if resource_has_keys else None))
    tool_name = _text(value_of("tool_name", attributes))
    tool_call_id = _text(value_of("tool_call_id", attributes))
    operation = value_of("operation", attributes) or ""
    return conversation, tool_name, tool_call_id, operation


# --- the tools offered to the model ------------------------------------------------------

# Where a model call's span lists the tools the model could call, by convention, in
# precedence order: the GenAI JSON array (a string of JSON, or an array value) of
# {"type", "name", "description", "parameters"}; OpenInference's indexed
# llm.tools.N.tool.json_schema (each a JSON schema: {"type": "function", "function":
# {...}} or the function itself); OpenLLMetry's indexed llm.request.functions.N.*.
TOOL_DEFINITION_RULES = (
    (GENAI, "gen_ai.tool.definitions"),
    (OPENINFERENCE, "llm.tools"),
    (OPENLLMETRY, "llm.request.functions"),
)
MAX_TOOL_DEFINITIONS = 256


def tools_offered(attributes: Mapping[str, Any]) -> Optional[list[dict[str, Any]]]:
    """The tools a model call's span says the model was offered, each as
    {"name", "description"?, "parameters"?}; None when the span does not say (or
    says it in a form that cannot be read, e.g. JSON cut at the attribute limit)."""
    for convention, key in TOOL_DEFINITION_RULES:
        if convention == GENAI:
            raw = json_or_text(attributes.get(key))
            found = [_tool_definition(item) for item in raw] if isinstance(raw, list) else None
        else:
            found = _indexed_tools(attributes, key + ".", json_key="tool.json_schema" if convention == OPENINFERENCE
                                   else None)
        if found:
            tools = [tool for tool in found if tool is not None][:MAX_TOOL_DEFINITIONS]
            if tools:
                return tools
    return None


def _tool_definition(raw: Any) -> Optional[dict[str, Any]]:
    raw = json_or_text(raw)
    if not isinstance(raw, dict):
        return None
    if isinstance(raw.get("function"), dict):  # {"type": "function", "function": {...}}
        raw = raw["function"]
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        return None
    tool: dict[str, Any] = {"name": name[:200]}
    if isinstance(raw.get("description"), str) and raw["description"]:
        tool["description"] = _clip(raw["description"])
    parameters = json_or_text(raw.get("parameters", raw.get("input_schema")))
    if parameters not in (None, ""):
        tool["parameters"] = parameters
    return tool


def _indexed_tools(attributes: Mapping[str, Any], prefix: str, json_key: Optional[str]) -> list[Any]:
    """``prefix`` N.field keys gathered per N, in N's order: the JSON of ``json_key``,
    or the fields themselves as one definition."""
    by_index: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        match = _INDEX.fullmatch(key[len(prefix):])
        if match is None or len(by_index) > MAX_TOOL_DEFINITIONS and int(match.group(1)) not in by_index:
            continue
        by_index.setdefault(int(match.group(1)), {})[match.group(2)] = value
    found = []
    for _, fields in sorted(by_index.items()):
        found.append(_tool_definition(fields.get(json_key) if json_key else fields))
    return found

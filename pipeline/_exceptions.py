"""The library's exception tree: everything it raises derives from PipelineError.

Tool failures are not exceptions to the agent: the executor turns them into error
results. These exceptions are for misuse of the library itself (bad ids, bad
config, cycles) and are raised to the caller that made the mistake.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every exception the pipeline library raises."""


class ConfigError(PipelineError, ValueError):
    """A config value is invalid. The message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class ArtifactError(PipelineError):
    """Base of artifact store errors."""


class InvalidArtifactId(ArtifactError, ValueError):
    """Not a well-formed ``artifact_<hex>`` id (traversal, path, NUL, ...)."""


class ArtifactNotFound(ArtifactError, KeyError):
    """No artifact with that id (never stored, expired or cleaned up)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "artifact not found"


class ToolTimeoutError(PipelineError, TimeoutError):
    """A tool did not finish within its timeout (the seeds' TimeoutException)."""


#: The seeds' name (v2.1 ToolTimeoutHandler: "超时抛出 TimeoutException").
TimeoutException = ToolTimeoutError


class SkillError(PipelineError, ValueError):
    """Base of skill loading and activation errors. A ValueError, as the design
    raises for a cycle or too deep a nesting (``except ValueError`` catches them)."""


class CircularDependencyError(SkillError):
    """A skill activation would close a cycle: 'Circular dependency detected: a → b → a'."""


class RecordExportError(PipelineError):
    """Raised only by explicit, caller-requested export operations (never on the agent thread)."""


class LockTimeoutError(PipelineError, TimeoutError):
    """A per-key lock (LockManager) could not be had within the caller's timeout."""

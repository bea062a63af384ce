"""Passes other apps run after the fixed ones (``passes.PASSES``), over the same batch.

An app that derives rows of its own from what the passes wrote (judging links the
scores that arrived before what they judge) registers its pass in its
``AppConfig.ready``; the drainer runs the registered passes, in the order they were
registered, after the fixed ones. So the derivations import nothing of that app,
and the order of the fixed passes stays what ``passes`` and docs/derivations.md say.
"""

from __future__ import annotations

from .batch import Pass

_registered: list[Pass] = []


def pass_register(derivation: Pass) -> None:
    """Run ``derivation`` after the fixed passes from now on (once, whatever the calls)."""
    if all(known.name != derivation.name for known in _registered):
        _registered.append(derivation)


def registered_passes() -> tuple[Pass, ...]:
    return tuple(_registered)

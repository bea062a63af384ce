"""The derivation engine: everything computed from the stored rows, in one direction.

    ingest (rows + a note, one transaction) --wake--> drain --> passes, in order
                                                          \\--> schedule (hourly, daily)

- ``notes``: what writers call (``derivations_enqueue``) and the wakers registered at
  start-up; the only module of this package that ingest imports.
- ``batch``: the batch of notes a drainer derives, and the form of a pass.
- ``passes``: one module per pass (links, span_rows, totals, rollups), each declaring
  what it reads and writes; none imports the drainer, ingest or the scheduler.
- ``drain``: claims notes, runs the passes over their batch, contains failures.
- ``runner``: the embedded drainer thread (no broker) and the waker of either mode.
- ``schedule``: the hourly and daily jobs. ``reprice``: notes after a price rule changed.

docs/derivations.md has the picture: what each pass reads and writes, and why each
is safe to run twice.
"""

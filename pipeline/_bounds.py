"""Upper bounds shared by every record schema.

Records cross a trust boundary: the dashboard stores what they say. Every integer fits
the narrowest column that holds it (PostgreSQL ``integer``), and every float is finite
and bounded, so no value can overflow a column or an aggregate downstream. The limits
sit far beyond anything a real agent produces.
"""

from __future__ import annotations

MAX_COUNT = 2**31 - 1  # indexes, token counts, sizes of lists
MAX_RETRIES = 1_000  # a retry count past this is a runaway loop, not data
MAX_BYTES = 2**53  # data sizes (exact in a float, fits BIGINT)
MAX_DURATION_MS = 1e12  # about 31 years
MAX_COST_USD = 1e9

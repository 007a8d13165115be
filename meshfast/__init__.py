"""meshfast: a governed LLM gateway.

Callers use keys that meshfast issues; provider credentials never leave it. The hot path lives
in the compiled core (``meshfast._core``); this package holds the HTTP edge, the admin plane,
storage and the CLI.
"""

__version__ = "0.1.0"

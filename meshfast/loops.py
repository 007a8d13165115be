"""The workers' event loop: uvloop by default (MESHFAST_LOOP), asyncio or Granian's choice otherwise.

A worker holds Granian's stop back while realtime sessions drain (``App._watch_stop_signals``),
which needs the callback Granian registered for SIGTERM. asyncio's loop keeps its signal handlers
in ``_signal_handlers``; uvloop keeps them where Python cannot read them. So the uvloop loop
Granian builds for a worker is :class:`Loop`, uvloop's loop that also keeps each handler it is
given in ``_signal_handlers`` (an :class:`asyncio.Handle`, as asyncio does). :func:`install`
registers it under Granian's ``uvloop`` name, in the supervisor, before the workers are forked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def install() -> bool:
    """Have Granian build :class:`Loop` for ``--loop uvloop``; False without uvloop."""
    try:
        import uvloop
        from granian._loops import loops
    except ImportError:
        return False

    class Loop(uvloop.Loop):
        """uvloop's loop, with the signal handlers it was given readable (see the module)."""

        def __init__(self) -> None:
            super().__init__()
            self._signal_handlers: dict[int, asyncio.Handle] = {}

        def add_signal_handler(  # type: ignore[override]
                self, sig: int, callback: Callable[..., Any], *args: Any) -> None:
            super().add_signal_handler(sig, callback, *args)
            self._signal_handlers[sig] = asyncio.Handle(callback, args, self)

        def remove_signal_handler(self, sig: int) -> bool:
            self._signal_handlers.pop(sig, None)
            return bool(super().remove_signal_handler(sig))

    @loops.register("uvloop", packages=["uvloop"])
    def build(uvloop: Any) -> asyncio.AbstractEventLoop:
        loop = Loop()
        asyncio.set_event_loop(loop)
        return loop

    return True

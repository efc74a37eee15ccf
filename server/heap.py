"""A server process's heap after start-up.

By the time a relay or an account API serves, its imports and set-up (SQLAlchemy's
mappers, pydantic's validators, protobuf's descriptors, FastAPI's routes) have left about
a hundred thousand container objects that live as long as the process. CPython's cyclic
garbage collector walks every one of them in each full collection, with the event loop
stopped: 50 to 120 ms in a relay process (docs/performance.md, "Relay capacity"), a pause
every stream on the relay waits out. Full collections come when many objects outlive
their first collections — a burst of new streams, say — so they hit a busy relay.

:func:`settle` moves those objects into the permanent generation (``gc.freeze``): later
collections walk only what was made since. Objects made after it are collected as
usual; cycles among the frozen ones never are, and :func:`settle` runs one full
collection first, so what it freezes is what start-up keeps.
"""

from __future__ import annotations

import gc


def settle() -> int:
    """Runs one full collection, then freezes every object that survived it out of the
    collector's reach (``gc.freeze``); returns how many objects are frozen.

    Called by each server process (``svc up``, ``svc relay``, ``svc api`` and ``svc up``'s
    API process) before it says it is ready: once started, or for ``svc api`` once its
    app is built. Not for library code: freezing is a decision of whoever owns the
    process.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

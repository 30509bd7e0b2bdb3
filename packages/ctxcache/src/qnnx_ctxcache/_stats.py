"""A store's counters (hits, misses by reason, stores...), and the records every process leaves of them."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import Counter

from qnnx_ctxcache import _fs
from qnnx_ctxcache._layout import HOST_ID, Layout


class Counters:
    """What one store object counted, and its record under ``v1/stats`` (one file per store object and process)."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def snapshot(self) -> dict[str, int]:
        """This store object's counters as they are now."""
        with self._lock:
            return dict(self._counts)

    def totals(self) -> dict[str, int]:
        """The counters every process recorded under this root, summed (unreadable records are passed over)."""
        totals: Counter[str] = Counter()
        with contextlib.suppress(OSError):
            for path in self._layout.folder("stats").glob("*.json"):
                with contextlib.suppress(OSError, ValueError, TypeError):
                    data = json.loads(path.read_text(encoding="utf-8"))
                    totals.update({str(k): int(v) for k, v in data.get("counters", {}).items()})
        return dict(totals)

    def flush(self) -> None:
        """Record this store's counters under ``v1/stats`` (best effort; never read for decisions)."""
        if self._layout.mode != "readwrite":
            return
        counters = self.snapshot()
        path = self._layout.folder("stats") / f"{HOST_ID}-{os.getpid()}-{id(self):x}.json"
        with contextlib.suppress(OSError):
            _fs.write_json_atomic(path, {"counters": counters, "time": self._layout.clock()}, durable=False)

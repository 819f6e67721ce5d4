"""Process-wide handles that allow one opener per path (the edge WAL lock, the local-mode lock file).

Shared by the deployment (which force-closes them on stop) and the clients (which reference-count them).
"""

from __future__ import annotations

import threading
from typing import Any


class Shared:
    """Objects opened once per key and closed when the last user releases them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: dict[str, list[Any]] = {}  # key -> [object, refcount]

    def acquire(self, key: str, open_fn: Any) -> Any:
        with self.lock:
            if key not in self.items:
                self.items[key] = [open_fn(), 0]
            self.items[key][1] += 1
            return self.items[key][0]

    def release(self, key: str, force: bool = False) -> None:
        with self.lock:
            item = self.items.get(key)
            if item is not None:
                item[1] -= 1
                if force or item[1] <= 0:
                    del self.items[key]
                    item[0].close()


EDGE = Shared()
LOCAL = Shared()

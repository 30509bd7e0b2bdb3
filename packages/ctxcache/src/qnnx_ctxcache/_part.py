"""What every part of a store holds: the cache's layout and this process's counters, one of each per store."""

from __future__ import annotations

import attrs

from qnnx_ctxcache._layout import Layout
from qnnx_ctxcache._stats import Counters

__all__ = ["StorePart"]


@attrs.define(eq=False)
class StorePart:
    """The base of the store's parts (listing, verifier, lookup, pruner, publisher, packer): each is made with the
    store's one layout and counters first, then the other parts it uses."""

    _layout: Layout
    _counters: Counters

"""KV cache transactions: append, commit, rollback, and byte accounting.

A cache holds, per layer, K and V rows indexed by absolute position. Rows below `committed` belong
to accepted tokens. A forward pass `append`s rows right after the committed ones (draft steps may
append several times in a row); `commit(n)` keeps the first n appended rows and `rollback()` drops
them all. Dropping is O(1): only the pointer moves and the stale rows are overwritten by the next
append, never read, because attention only reads positions <= the row being computed.

This module knows nothing about models; `model.py` writes and reads the arrays.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ContextOverflowError, OutOfMemoryError


class KVCache:
    def __init__(self, n_layers: int, max_ctx: int, n_kv_heads: int, head_dim: int,
                 dtype=np.float32, store: bool = True):
        """store=False keeps only the bookkeeping: the rows live elsewhere (GPU buffers)."""
        shape = (n_layers, max_ctx, n_kv_heads, head_dim)
        self._nbytes = 2 * math.prod(shape) * np.dtype(dtype).itemsize
        # (n_layers, max_ctx, n_kv_heads, head_dim) each, or None when stored elsewhere
        try:
            self.k = np.zeros(shape, dtype) if store else None
            self.v = np.zeros(shape, dtype) if store else None
        except (MemoryError, ValueError) as e:  # ValueError: more bytes than an array may hold
            raise OutOfMemoryError(
                f"a KV cache of {max_ctx} positions needs {self._nbytes:,} bytes, more than this "
                "machine can allocate; reserve fewer positions (max_ctx; --ctx)") from e
        self.max_ctx = max_ctx
        # (max_ctx,) the slot of each row's parent: the row before it, unless a tree's verify
        # pass or a draft's expansion put it under another (append_tree). A row attends to the
        # committed rows and to its own chain of pending ancestors (`lineage`).
        self.parent = np.arange(-1, max_ctx - 1)
        # (max_ctx, d) the final residual state of each row, kept only when a drafter reads the
        # model's own states (an EAGLE-style head, drafters/eagle.py): keep_states(d) starts it.
        # Written by the same passes as K and V, so it follows the same transactions.
        self.states: np.ndarray | None = None
        self.committed = 0                # rows of accepted tokens
        self.pending = 0                  # rows appended since the last commit / rollback
        self.peak = 0                     # most rows ever in use (committed + pending)
        # Bumped by every truncate: whoever remembers which tokens the committed rows hold (the
        # engine's conversation cache) checks it, so that another engine sharing this cache
        # (engines over one GPU model) and starting a request of its own invalidates the memory.
        self.epoch = 0

    def keep_states(self, d: int, dtype=np.float32) -> None:
        """Keep each row's final residual state (d floats) from now on."""
        if self.states is None:
            self.states = np.zeros((self.max_ctx, d), dtype)
            self._nbytes += self.states.nbytes

    @property
    def length(self) -> int:
        """Rows visible to the next append (committed + pending)."""
        return self.committed + self.pending

    def append(self, n: int) -> int:
        """Reserve n rows after the current ones; returns the first position to write."""
        start = self.length
        if start + n > self.max_ctx:
            raise ContextOverflowError(
                f"the sequence needs {start + n} positions but the context holds {self.max_ctx}; "
                f"shorten the prompt or lower max_tokens (--max-tokens)")
        self.pending += n
        self.peak = max(self.peak, self.length)
        self.parent[start:start + n] = np.arange(start - 1, start + n - 1)
        return start

    def append_tree(self, parents) -> int:
        """Reserve rows, one per entry of `parents` (m,), each under the row at that slot (a row
        already there or one of these before it; -1 only for a first row at slot 0). Returns the
        first slot written; its position is not its slot (`lineage`)."""
        parents = np.asarray(parents, dtype=np.int64)
        slots = self.length + np.arange(len(parents))
        if ((parents >= slots) | (parents < self.committed - 1)).any():
            raise ValueError(f"tree parents {parents.tolist()} must be earlier pending rows (or "
                             f"the last committed one) for rows at slots {slots.tolist()}")
        start = self.append(len(parents))
        self.parent[slots] = parents
        return start

    def lineage(self, slot: int) -> np.ndarray:
        """The slots the row at `slot` attends to, in position order: every committed row, then
        its pending ancestors and itself. Its position is len(lineage) - 1."""
        chain = []
        while slot >= self.committed:
            chain.append(slot)
            slot = int(self.parent[slot])
        return np.concatenate([np.arange(slot + 1), chain[::-1]]).astype(np.int64)

    def compact(self, slots) -> None:
        """Commit the pending rows at `slots` (increasing; the first at `committed`), moved to
        consecutive slots after the committed ones: a tree's accepted path, O(len(slots)) row
        copies. Every other pending row is dropped."""
        slots = np.asarray(slots, dtype=np.int64)
        dest = self.committed + np.arange(len(slots))
        if len(slots) > self.pending or (slots < dest).any() or (np.diff(slots) <= 0).any():
            raise ValueError(f"cannot compact slots {slots.tolist()}: {self.committed} committed, "
                             f"{self.pending} pending")
        for arr in (self.k, self.v):
            if arr is not None:   # (n_layers, max_ctx, ...): a row is one slot of every layer
                arr[:, dest] = arr[:, slots]
        if self.states is not None:
            self.states[dest] = self.states[slots]
        self.parent[dest] = dest - 1
        self.committed += len(slots)
        self.pending = 0

    def commit(self, n: int) -> None:
        """Keep the first n pending rows, drop the rest."""
        if not 0 <= n <= self.pending:
            raise ValueError(f"cannot commit {n} rows: {self.pending} pending")
        self.committed += n
        self.pending = 0

    def commit_to(self, n: int) -> None:
        """The first n rows hold committed tokens (n >= the rows committed already): for rows a
        cycle wrote where the device chose (a draft fed on the device, gpu/ahead.py). Drops every
        pending row."""
        if not self.committed <= n <= self.max_ctx:
            raise ValueError(f"cannot commit up to row {n}: {self.committed} committed, "
                             f"{self.max_ctx} positions")
        self.committed, self.pending = n, 0
        self.peak = max(self.peak, n)

    def rollback(self) -> None:
        """Drop every pending row."""
        self.pending = 0

    def truncate(self, n: int) -> None:
        """Forget committed rows from position n on (truncate(0) starts a new request)."""
        if not 0 <= n <= self.committed:
            raise ValueError(f"cannot truncate to {n}: {self.committed} committed")
        self.committed, self.pending = n, 0
        self.epoch += 1

    @property
    def nbytes(self) -> int:
        """Physical bytes allocated (here, or on the device that holds the rows)."""
        return self._nbytes

    @property
    def peak_bytes(self) -> int:
        """Logical bytes of the rows ever in use."""
        return self.nbytes * self.peak // self.max_ctx


def rows_kept(kv: KVCache, epoch: int, held: list[int], tokens: list[int]) -> int:
    """How many leading rows of `kv` a request for `tokens` may keep as they are: the common
    prefix of tokens[:-1] and `held`, the tokens whose first kv.committed rows the cache holds
    since `epoch` (0 once the cache was truncated since: another request started on it). Kept
    rows are those a fresh prefill would write wherever the forward is batch-invariant."""
    if epoch != kv.epoch:
        return 0
    n = min(kv.committed, len(tokens) - 1, len(held))
    same = np.asarray(held[:n]) == np.asarray(tokens[:n])
    return n if same.all() else int(np.argmin(same))

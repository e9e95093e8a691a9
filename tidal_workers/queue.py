"""The item queue: Redis sorted sets by model, priority, tenant and batch, and leases with fencing; the Lua that
keeps them atomic is in ``queue_scripts.py``.

A claim walks model -> tenant -> priority level -> batch -> item (layout: ``keys.py``): the models the node's engine
serves take turns; in a model, the tenant whose turn it is (stride scheduling over all the model's levels: each item
claimed adds ``1 / weight`` to its tenant's pass, so tenants share items by weight, round robin at equal weights,
whichever node claims and whatever their batches' priorities), then that tenant's most urgent level, its earliest
deadline there, then prompt-prefix ordinal. Priority thus orders a tenant's own batches and the engine's queue (the
priority each request is sent with), never another tenant's share (issue 37, M2). Escalating a batch moves it
between levels with a few ZADD/ZREM, whatever its size. Kombu's own Redis priorities are ten FIFO lists that cannot
re-order a queued message, which is why only *claimed* items become Celery messages.
"""

from __future__ import annotations

import dataclasses
import json
import typing as t

import redis

from tidal_workers import keys
from tidal_workers.attempt import Attempt
from tidal_workers.policy.laxity import PRIORITY_MAX
from tidal_workers.policy.phase import Phase
from tidal_workers.queue_scripts import BATCH_INFLIGHT
from tidal_workers.queue_scripts import CLAIM
from tidal_workers.queue_scripts import CLAIM_BATCH
from tidal_workers.queue_scripts import COMPLETE
from tidal_workers.queue_scripts import DEPTH
from tidal_workers.queue_scripts import DROP
from tidal_workers.queue_scripts import ENQUEUE
from tidal_workers.queue_scripts import GIVE_BACK
from tidal_workers.queue_scripts import RECLAIM
from tidal_workers.queue_scripts import RENEW
from tidal_workers.queue_scripts import REQUEUE
from tidal_workers.queue_scripts import RESCORE

PRIORITY_SCALE = 10_000_000_000  # score = priority * 1e10 + deadline; exact below 2**53
ENQUEUE_CHUNK = 5000  # items per ENQUEUE call, so one script never blocks Redis for long
WHOLE = Phase.WHOLE.value  # the phase ENQUEUE is given for an item that is not split

# Gauge bands of the queue depth: (label, lowest priority, highest priority).
BANDS = (("0", 0, 0), ("1-9", 1, 9), ("10-49", 10, 49), ("50-99", 50, 99), ("100", 100, 100))


def batch_score(priority: int, deadline: float) -> int:
    """Lowest first: priority (vLLM's, lower is sooner), then earliest deadline."""
    return int(priority) * PRIORITY_SCALE + int(deadline)


def score_priority(score: float) -> int:
    return int(float(score)) // PRIORITY_SCALE


@dataclasses.dataclass(frozen=True)
class Claim:
    """An item this node just claimed, under a new lease, and the batch it belongs to."""

    item_id: int
    lease: str
    batch_id: str

    @property
    def attempt(self) -> Attempt:
        return Attempt(self.item_id, self.lease)


@dataclasses.dataclass(frozen=True)
class GivenBack:
    """What ``give_back`` did with a claim whose lease was current."""

    item_id: int
    batch_id: str
    requeued: bool  # False: its batch was dropped, so the item was abandoned


@dataclasses.dataclass(frozen=True)
class Expired:
    """An item whose lease ``take_expired`` took off."""

    item_id: int
    lease: str  # the lease that expired: its attempt is the one that died
    batch_id: str
    taken: bool  # False: its batch was dropped, so the item was abandoned; else it waits for ``requeue``

    @property
    def attempt(self) -> Attempt:
        return Attempt(self.item_id, self.lease)


class Queue:
    """Tidal's view of its Redis keys; every mutation is one atomic script.

    ``client`` decodes responses (``Runtime.redis``), so its replies are ``str``; the casts below say so to mypy.
    """

    def __init__(self, client: redis.Redis):
        self.redis = client
        self._turn = 0  # where CLAIM starts the turns of models tied at a level
        self._enqueue = client.register_script(ENQUEUE)
        self._claim = client.register_script(CLAIM)
        self._claim_batch = client.register_script(CLAIM_BATCH)
        self._renew = client.register_script(RENEW)
        self._complete = client.register_script(COMPLETE)
        self._reclaim = client.register_script(RECLAIM)
        self._requeue = client.register_script(REQUEUE)
        self._give_back = client.register_script(GIVE_BACK)
        self._rescore = client.register_script(RESCORE)
        self._drop = client.register_script(DROP)
        self._batch_inflight = client.register_script(BATCH_INFLIGHT)
        self._depth = client.register_script(DEPTH)

    # --- producers -----------------------------------------------------------
    def enqueue_batch(
        self,
        batch_id: str,
        priority: int,
        deadline: float,
        items: t.Iterable[tuple[int, int, str]],
        *,
        model: str,
        tenant: str,
        weight: float = 1.0,
    ) -> int:
        """Queue ``(item_id, ordinal, phase)`` of an open batch's items; leased items are skipped. Returns how many.

        ``model`` and ``tenant`` place the batch (keys.py); ``weight`` is the tenant's share of claims.
        """
        head: list[str | int] = [batch_id, batch_score(priority, deadline), model, tenant, repr(float(weight))]
        keys_ = [keys.LEASES, keys.batch(batch_id), keys.ready(batch_id)]
        queued, calls = 0, 0
        chunk: list[int | str] = []
        for item_id, ordinal, phase in items:
            chunk += (item_id, ordinal, phase)
            if len(chunk) >= 3 * ENQUEUE_CHUNK:
                queued += self._enqueue(keys=keys_, args=[*head, *chunk])
                chunk, calls = [], calls + 1
        if chunk or not calls:  # at least once: an open batch keeps its place even with nothing to queue
            queued += self._enqueue(keys=keys_, args=[*head, *chunk])
        return queued

    def rescore(self, batch_id: str, priority: int, deadline: float) -> bool:
        """Move a batch to its new level whatever its size; False if the batch is not open in Redis."""
        return bool(self._rescore(keys=[keys.batch(batch_id)], args=[batch_id, batch_score(priority, deadline)]))

    def drop_batch(self, batch_id: str) -> int:
        """Forget a batch's queued items (cancel, expiry, finalize); returns how many were dropped."""
        return int(self._drop(keys=[keys.batch(batch_id), keys.ready(batch_id)], args=[batch_id]))

    # --- consumers -------------------------------------------------------------
    def claim(
        self,
        node: str,
        n: int,
        lease_seconds: float,
        models: t.Collection[str],
        phases: t.Sequence[tuple[str, int]] = (),
        whole: bool = True,
    ) -> list[Claim]:
        """Atomically lease up to ``n`` items of the given models in one call: first the split items of each
        ``(phase, max priority)`` in ``phases``, in order (batch score order, then ordinal), then, if ``whole``,
        whole items in claim order: the models' turns, the tenants' weighted turns (across levels), then the
        tenant's most urgent level, its earliest deadline, then prompt-prefix ordinal."""
        if n <= 0 or not models:
            return []
        turn = self._turn
        if whole:
            self._turn += n
        limits = [x for phase, most in phases for x in (phase, (most + 1) * PRIORITY_SCALE - 1)]
        flat = self._claim(
            keys=[keys.BATCHES, keys.INFLIGHT, keys.node_inflight(node), keys.LEASES, keys.NODES],
            args=[node, n, lease_seconds, turn, int(whole), len(phases), *limits, *sorted(models)],
        )
        return [Claim(int(flat[i]), flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    def claim_batch(
        self, node: str, batch_id: str, n: int, lease_seconds: float, models: t.Collection[str]
    ) -> list[Claim]:
        """Atomically lease up to ``n`` items of one batch in ordinal order, whatever its score or its tenant's
        share (the floor), if its model is one of ``models``; its split items after its whole ones."""
        if n <= 0 or not models:
            return []
        flat = self._claim_batch(
            keys=[keys.BATCHES, keys.INFLIGHT, keys.node_inflight(node), keys.LEASES, keys.NODES, keys.ready(batch_id)],
            args=[node, n, lease_seconds, batch_id, *sorted(models)],
        )
        return [Claim(int(flat[i]), flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    def claim_phase(
        self,
        node: str,
        phase: str,
        n: int,
        lease_seconds: float,
        models: t.Collection[str],
        max_priority: int = PRIORITY_MAX,
    ) -> list[Claim]:
        """Atomically lease up to ``n`` split items queued as ``phase`` (the phase split), of batches at ``max_priority`` or
        below, in batch score order (priority, then deadline), then ordinal: ``claim`` of that phase alone."""
        return self.claim(node, n, lease_seconds, models, phases=[(phase, max_priority)], whole=False)

    def renew(self, node: str, attempts: t.Iterable[Attempt], lease_seconds: float) -> list[int]:
        """Extend the leases of ``node``'s attempts; returns the item ids whose lease was lost."""
        pairs = [x for attempt in attempts for x in attempt]
        if not pairs:
            return []
        lost = self._renew(keys=[keys.INFLIGHT, keys.node_inflight(node), keys.LEASES], args=[lease_seconds, *pairs])
        return [int(i) for i in lost]

    def complete(self, attempt: Attempt) -> bool:
        """Forget a settled item if the attempt's lease is still its lease; False for a stale attempt."""
        return self.complete_all([attempt])[0]

    def complete_all(self, attempts: t.Sequence[Attempt]) -> list[bool]:
        """``complete`` for each attempt, in one round trip per node of the leases (a worker's are one)."""
        by_node: dict[str, list[int]] = {}
        for i, attempt in enumerate(attempts):
            by_node.setdefault(attempt.node, []).append(i)
        done = [False] * len(attempts)
        for node, indexes in by_node.items():
            items = [attempts[i].item_id for i in indexes]
            flags = self._complete(
                keys=[keys.INFLIGHT, keys.node_inflight(node), keys.LEASES, *map(keys.item, items)],
                args=[x for i in indexes for x in attempts[i]],
            )
            for i, flag in zip(indexes, flags):
                done[i] = bool(flag)
        return done

    def give_back(self, attempt: Attempt, as_phase: str = "") -> GivenBack | None:
        """Requeue a claim that never reached the engine, if its lease is current (None if not); the item is
        abandoned instead if its batch was dropped. The next claim of it is a new attempt. ``as_phase``: the
        phase it is queued as from now on (Phase split: ``decode`` once its prefill answered); by default its own."""
        code, batch_id = self._give_back(
            keys=[keys.INFLIGHT, keys.node_inflight(attempt.node), keys.LEASES], args=[*attempt, as_phase]
        )
        return GivenBack(attempt.item_id, batch_id, int(code) == 1) if int(code) else None

    def lease_current(self, attempt: Attempt) -> bool:
        """Is the attempt's lease still the item's? Asks Redis (``result.lease_current`` asks the node's book
        first)."""
        return self.redis.hget(keys.LEASES, str(attempt.item_id)) == attempt.lease

    def take_expired(self, limit: int = 1000) -> list[Expired]:
        """Take expired leases off their items (their worker died); abandon the items of dropped batches. The
        others are queued nowhere until ``requeue`` (``reclaim.py`` counts each reclaim in SQL first)."""
        flat = self._reclaim(keys=[keys.INFLIGHT, keys.LEASES], args=[limit])
        return [Expired(int(flat[i]), flat[i + 1], flat[i + 2], bool(int(flat[i + 3]))) for i in range(0, len(flat), 4)]

    def requeue(self, items: t.Sequence[tuple[int, bool]]) -> int:
        """For each ``(item id, back)`` of items ``take_expired`` took: back into its batch at its ordinal if
        ``back``, else forgotten (settled, or written off); returns how many went back."""
        if not items:
            return 0
        return int(self._requeue(keys=[keys.LEASES], args=[x for item_id, back in items for x in (item_id, int(back))]))

    # --- reading -----------------------------------------------------------------
    def inflight(self, node: str) -> int:
        return int(self.redis.zcard(keys.node_inflight(node)))

    def inflight_by_node(self) -> dict[str, int]:
        nodes = sorted(t.cast(set[str], self.redis.smembers(keys.NODES)))
        with self.redis.pipeline(transaction=False) as p:
            for node in nodes:
                p.zcard(keys.node_inflight(node))
            return dict(zip(nodes, (int(n) for n in p.execute())))

    def batch_inflight(self, batch_id: str) -> int:
        return int(self._batch_inflight(keys=[keys.INFLIGHT], args=[batch_id]))

    def queued_batches(self) -> list[str]:
        """Every batch with queued items, whole or split, in score order."""
        return t.cast(list[str], self.redis.zrange(keys.BATCHES, 0, -1))

    def set_urgent(self, batch_ids: t.Iterable[str]) -> None:
        """Replace the set of batches the floor admits past the gate (one transaction)."""
        with self.redis.pipeline() as p:
            p.delete(keys.URGENT)
            ids = list(batch_ids)
            if ids:
                p.sadd(keys.URGENT, *ids)
            p.execute()

    def urgent(self) -> set[str]:
        return t.cast(set[str], self.redis.smembers(keys.URGENT))

    def urgent_by_tenant(self) -> dict[str, list[str]]:
        """The urgent batches by tenant, each tenant's earliest deadline first (the floor serves tenants, not
        batches); a batch no longer open in Redis is left out."""
        ids = sorted(self.urgent())
        with self.redis.pipeline(transaction=False) as p:
            for batch_id in ids:
                p.hmget(keys.batch(batch_id), "score", "tenant")
            placed = p.execute()
        by_tenant: dict[str, list[tuple[int, str]]] = {}
        for batch_id, (score, tenant) in zip(ids, placed):
            if score is not None and tenant is not None:
                by_tenant.setdefault(tenant, []).append((int(float(score)) % PRIORITY_SCALE, batch_id))
        return {tenant: [b for _, b in sorted(batches)] for tenant, batches in sorted(by_tenant.items())}

    def depth_by_band(self) -> dict[str, int]:
        """Queued items per priority band (items waiting here are invisible to Flower)."""
        flat = self._depth(keys=[keys.BATCHES])
        depth = {label: 0 for label, _, _ in BANDS}
        for i in range(0, len(flat), 2):
            priority = score_priority(flat[i])
            for label, lo, hi in BANDS:
                if lo <= priority <= hi:
                    depth[label] += int(flat[i + 1])
        return depth

    # --- the models nodes serve -----------------------------------------------------
    def publish_models(self, node: str, models: t.Collection[str], ttl: float) -> None:
        """Record the models ``node``'s engine serves for ``ttl`` seconds (none: the node serves nothing now)."""
        key = keys.node_models(node)
        with self.redis.pipeline() as p:
            p.delete(key)
            if models:
                p.sadd(key, *models)
                p.pexpire(key, max(1, int(ttl * 1000)))
            p.sadd(keys.NODES, node)
            p.execute()

    def served_models(self) -> set[str]:
        """Every model some live node's engine serves (nodes whose record has not expired)."""
        nodes = t.cast(set[str], self.redis.smembers(keys.NODES))
        with self.redis.pipeline(transaction=False) as p:
            for node in nodes:
                p.smembers(keys.node_models(node))
            return set().union(*p.execute()) if nodes else set()

    # --- data loss and upgrades ---------------------------------------------------------
    def mark_built(self, at: float) -> None:
        self.redis.set(keys.BUILT, json.dumps({"layout": keys.LAYOUT, "at": at}))

    def is_built(self) -> bool:
        """False once Redis has lost its data (FLUSHALL, a restart without persistence), and while it holds another
        release's key layout (``tidal:built`` of layout 1 is a bare time): either way a rebuild from SQL is due."""
        raw = self.redis.get(keys.BUILT)
        try:
            built = json.loads(t.cast(str, raw)) if raw else None
        except ValueError:
            return False
        return isinstance(built, dict) and built.get("layout") == keys.LAYOUT

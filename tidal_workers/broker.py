"""The Celery broker's transport: kombu's Redis transport, with one Redis client per channel.

kombu builds a new ``redis.Redis`` for every command it sends outside its event loop (each task published by the
claim thread, each batch of task events, each ack); redis-py 8 takes ~100 µs to build one, as long as a round
trip to a local Redis. A client is a front to the channel's connection pool and safe to share between threads
(each command takes a connection from the pool), so the channel builds one and keeps it.
"""

from __future__ import annotations

import typing as t

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _shared: redis.Redis | None = None

    def _create_client(self, asynchronous: bool = False) -> t.Any:
        if asynchronous:  # the event loop's own clients (BRPOP, pub/sub), built once each by kombu already
            return super()._create_client(asynchronous=True)
        if self._shared is None:
            self._shared = super()._create_client()
        return self._shared


class Transport(kombu_redis.Transport):
    Channel = Channel

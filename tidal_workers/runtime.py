"""One process's handles on Tidal's services, built lazily from Settings.

The API keeps one in ``app.extensions["tidal"]``; a worker builds one at start-up.
Passing it explicitly (never a global) keeps Celery tasks and tests free of
request contexts and lets a test build a runtime on its own Redis DB and database.
"""

from __future__ import annotations

import functools
import typing as t

import redis

from config import Settings
from tidal_workers.store import Store

if t.TYPE_CHECKING:
    from celery import Celery

    from tidal_workers.blobs import BlobStore
    from tidal_workers.queue import Queue


class Runtime:
    def __init__(self, settings: Settings):
        self.settings = settings

    @functools.cached_property
    def store(self) -> Store:
        return Store(self.settings)

    @functools.cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url, decode_responses=True, health_check_interval=10)

    @functools.cached_property
    def blobs(self) -> BlobStore:
        from tidal_workers.blobs import BlobStore

        return BlobStore(self.settings.blob_path)

    @functools.cached_property
    def queue(self) -> Queue:
        from tidal_workers.queue import Queue

        return Queue(self.redis)

    @functools.cached_property
    def celery(self) -> Celery:
        from tidal_workers.celery_app import make_celery

        return make_celery(self.settings)

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.dispose()
        if "redis" in self.__dict__:
            self.redis.close()

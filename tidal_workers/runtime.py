"""One process's handles on Tidal's services, built lazily from Settings.

The API keeps one in ``app.extensions["tidal"]``; a worker builds one at start-up, around its own
Celery app. Elsewhere ``celery`` is a sending-only app, so a Runtime never imports the worker's code.
Passing it explicitly (never a global) keeps Celery tasks and tests free of
request contexts and lets a test build a runtime on its own Redis DB and database.
"""

from __future__ import annotations

import functools

import redis
import requests
from celery import Celery
from requests.adapters import HTTPAdapter

from config import Settings
from config.celery import sending_app
from tidal_workers.blobs import Blobs
from tidal_workers.blobs import open_blobs
from tidal_workers.queue import Queue
from tidal_workers.store import Store


class Runtime:
    def __init__(self, settings: Settings, celery: Celery | None = None):
        self.settings = settings
        self._owns_celery = celery is None  # a worker's app belongs to the worker; one built here is closed here
        if celery is not None:
            self.__dict__["celery"] = celery

    @functools.cached_property
    def store(self) -> Store:
        return Store(self.settings)

    @functools.cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url, decode_responses=True, health_check_interval=10)

    @functools.cached_property
    def blobs(self) -> Blobs:
        return open_blobs(self.settings)

    @functools.cached_property
    def queue(self) -> Queue:
        return Queue(self.redis)

    @functools.cached_property
    def http(self) -> requests.Session:
        """The process's one pooled HTTP client (the engine's POSTs and its /metrics): connections are reused,
        and the pool holds one per worker thread so no POST waits for a connection or opens one per request."""
        session = requests.Session()
        # Settings come from config alone: no proxy, .netrc or CA bundle read from the environment on every request
        # (requests scanned os.environ twice a POST for them). The engine is co-located, never behind a proxy.
        session.trust_env = False
        # Connections are opened only as needed: the bound is room for every task thread of a large GPU node.
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=max(self.settings.worker_threads, 512))
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session

    @functools.cached_property
    def celery(self) -> Celery:
        """The app to send tasks with: the worker's own inside a worker, else a sending-only one."""
        return sending_app(self.settings)

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.dispose()
        if "redis" in self.__dict__:
            self.redis.close()
        if "http" in self.__dict__:
            self.http.close()
        if "celery" in self.__dict__ and self._owns_celery:
            self.celery.close()

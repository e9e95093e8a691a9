"""The broker transport: kombu's Redis transport, keeping one client per channel, on the real Redis."""

from __future__ import annotations

import pytest

from config.celery import celery_config
from config.celery import sending_app
from tidal_workers.broker import Channel
from tidal_workers.broker import Transport

pytestmark = pytest.mark.no_sql


def test_a_redis_broker_runs_on_tidals_transport_which_keeps_one_client_and_delivers(settings):
    app = sending_app(settings)
    try:
        with app.connection_for_write() as conn:
            assert isinstance(conn.transport, Transport)
            channel = conn.default_channel
            assert isinstance(channel, Channel)
            assert channel._create_client() is channel._create_client()  # built once, not per command
            assert channel._create_client(asynchronous=True) is not channel._create_client()  # the event loop's own
            queue = conn.SimpleQueue("tidal-test-broker")
            try:
                queue.put({"n": 1})
                queue.put({"n": 2})
                got = [queue.get(timeout=5) for _ in range(2)]
                for message in got:
                    message.ack()
                assert [m.payload for m in got] == [{"n": 1}, {"n": 2}]
            finally:
                queue.queue.delete()
                queue.close()
    finally:
        app.close()


@pytest.mark.parametrize(
    ("url", "transport"),
    [
        ("redis://127.0.0.1:6379/0", "tidal_workers.broker:Transport"),
        ("rediss://redis.example:6380/0", "tidal_workers.broker:Transport"),
        ("sentinel://127.0.0.1:26379", None),
        ("amqp://guest@127.0.0.1//", None),
    ],
)
def test_only_a_plain_redis_broker_gets_tidals_transport(settings, url, transport):
    assert celery_config(settings.replace(broker_url=url)).get("broker_transport") == transport

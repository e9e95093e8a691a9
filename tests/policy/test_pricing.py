"""Batch billing against the online price."""

from __future__ import annotations

import dataclasses

import pytest

from config import load_settings
from tidal_workers.policy.pricing import Cost
from tidal_workers.policy.pricing import Usage
from tidal_workers.policy.pricing import cost
from tidal_workers.policy.pricing import prices_for

TABLE = {"big": (2.50, 10.00), "*": (0.15, 0.60)}


def test_named_model_at_the_default_discount():
    c = cost(Usage(input_tokens=1_000_000, output_tokens=500_000), "big", TABLE)
    assert c.online_usd == pytest.approx(2.50 + 5.00)
    assert c.batch_usd == pytest.approx(3.75)
    assert c.saved_usd == pytest.approx(3.75)


def test_unknown_model_uses_the_default_row_and_the_discount_is_configurable():
    c = cost(Usage(input_tokens=2_000, output_tokens=1_000), "tiny", TABLE, discount=0.25)
    online = (2_000 * 0.15 + 1_000 * 0.60) / 1e6
    assert c == Cost(pytest.approx(online), pytest.approx(online * 0.25), pytest.approx(online * 0.75))


def test_cached_and_reasoning_tokens_are_inside_input_and_output():
    plain = cost(Usage(input_tokens=1_000, output_tokens=1_000), "big", TABLE)
    detailed = cost(
        Usage(input_tokens=1_000, cached_tokens=800, output_tokens=1_000, reasoning_tokens=600), "big", TABLE
    )
    assert detailed == plain


def test_settings_price_table_and_discount():
    s = load_settings({"TIDAL_PRICES": '{"tiny": [1, 2], "*": [3, 4]}', "TIDAL_BATCH_DISCOUNT": "0.4"})
    c = cost(Usage(input_tokens=1_000_000, output_tokens=1_000_000), "tiny", s.price_table, s.batch_discount)
    assert (c.online_usd, c.batch_usd) == (pytest.approx(3.0), pytest.approx(1.2))
    assert prices_for("other", s.price_table) == (3.0, 4.0)
    # the shipped default prices any model
    assert prices_for("anything", load_settings({}).price_table) == (0.15, 0.60)


def test_no_price_and_no_default_is_an_error_that_names_the_model():
    with pytest.raises(ValueError, match="'gpt-x'"):
        prices_for("gpt-x", {"big": (1.0, 1.0)})


def test_zero_usage_costs_nothing():
    assert cost(Usage(), "big", TABLE) == Cost(0.0, 0.0, 0.0)


def test_usage_from_chat_and_responses_vocabularies():
    chat = {
        "prompt_tokens": 12,
        "completion_tokens": 30,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 5},
    }
    assert Usage.from_response(chat) == Usage(12, 8, 30, 5)
    responses = {
        "input_tokens": 12,
        "output_tokens": 30,
        "total_tokens": 42,
        "input_tokens_details": {"cached_tokens": 8},
        "output_tokens_details": {"reasoning_tokens": 5},
    }
    assert Usage.from_response(responses) == Usage(12, 8, 30, 5)
    # vLLM leaves details null unless asked; embeddings have no completion tokens
    assert Usage.from_response({"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": None}) == Usage(
        7, 0, 3, 0
    )
    assert Usage.from_response({"prompt_tokens": 7, "total_tokens": 7}) == Usage(7, 0, 0, 0)
    assert Usage.from_response(None) == Usage()


def test_usage_sums_into_the_batch_usage_object():
    total = sum([Usage(10, 2, 20, 1), Usage(5, 0, 7, 0)], Usage())
    assert total.as_batch_usage() == {
        "input_tokens": 15,
        "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 27,
        "output_tokens_details": {"reasoning_tokens": 1},
        "total_tokens": 42,
    }


def test_costs_add_up():
    a = cost(Usage(1_000_000, 0, 0, 0), "big", TABLE)
    b = cost(Usage(0, 0, 1_000_000, 0), "*", TABLE)
    assert (a + b).online_usd == pytest.approx(2.50 + 0.60)
    assert (a + b).saved_usd == pytest.approx((2.50 + 0.60) / 2)


def test_usage_columns_are_its_fields_by_name():
    """``columns`` is written out by hand for speed (the result write's hot path); it must stay the dataclass's."""
    u = Usage(1, 2, 3, 4)
    assert u.columns() == dataclasses.asdict(u)
    assert list(u.columns()) == [f.name for f in dataclasses.fields(Usage)]
    assert u + Usage(10, 20, 30, 40) == Usage(11, 22, 33, 44)

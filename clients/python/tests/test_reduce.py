"""Every fixture case, posted to a real agentmux and watched: the state `agentmux.reduce` builds from what
the stream sent serialises to exactly the JSON of the service's snapshot; and the reducer's refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

import agentmux

from helpers import same
from server import REPOSITORY

FIXTURES = REPOSITORY / "fixtures"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "input.jsonl").exists())


def test_there_are_fixture_cases() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES)
def test_reduced_as_the_service_reduces_it(server: Any, case: str) -> None:
    client = agentmux.Client(server.base_url)
    created = client.create_stream(model="fixture")
    lines = (FIXTURES / case / "input.jsonl").read_text(encoding="utf-8").splitlines()
    client.append(created.id, [json.loads(line) for line in lines if line.strip()], write_token=created.write_token)
    outcome_file = FIXTURES / case / "outcome.json"
    outcome = json.loads(outcome_file.read_text(encoding="utf-8")) if outcome_file.exists() else None
    client.end(created.id, outcome, write_token=created.write_token)
    state = None
    for update in client.watch(created.id, token=created.read_token):
        state = update.state
    assert same(state, client.snapshot(created.id, token=created.read_token))


def test_a_delta_of_another_type_without_type_change_is_refused_and_changes_nothing() -> None:
    state = agentmux.initial_state()
    agentmux.reduce(state, {"type": "text", "props": {"content": "a"}, "message_id": "m"})
    with pytest.raises(agentmux.DeltaError):
        agentmux.reduce(state, {"type": "loading", "props": {"message": "x"}, "message_id": "m", "delta": True})
    with pytest.raises(agentmux.DeltaError):
        agentmux.reduce(state, {"type": "text", "props": {"content": 1}, "message_id": "m", "delta": True})
    assert state.messages == [{"type": "text", "props": {"content": "a"}, "message_id": "m"}]


def test_set_creates_the_way_and_merge_replace_append_on_arrays() -> None:
    state = agentmux.initial_state()
    card = {"type": "card", "message_id": "c"}
    agentmux.reduce(state, {**card, "props": {"list": [1]}})
    agentmux.reduce(
        state, {**card, "props": {"a": {"b": 2}}, "delta": True, "delta_path": "a.b", "delta_action": "set"}
    )
    agentmux.reduce(state, {**card, "props": {"list": [2, 3]}, "delta": True, "delta_path": "list"})
    agentmux.reduce(state, {**card, "props": {"x": 1}, "delta": True, "delta_path": ""})
    agentmux.reduce(
        state, {**card, "props": {"list": {"0": 9}}, "delta": True, "delta_path": "list.0", "delta_action": "replace"}
    )
    assert state.messages[0]["props"] == {"list": [9, 2, 3], "a": {"b": 2}, "x": 1}

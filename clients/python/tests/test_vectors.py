"""The cross-language test vectors (tests/vectors/formats.json, computed by the server's own
functions): this SDK's shard of a run id, and its JSON against the server's canonical JSON."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from aaa._route import shard
from aaa.types import dumps, loads

VECTORS = json.loads((Path(__file__).parents[3] / "tests" / "vectors" / "formats.json").read_text(encoding="utf-8"))
SHARDS = VECTORS["run_shards"]
CANONICAL = VECTORS["canonical_json"]["cases"]


@pytest.mark.parametrize("case", SHARDS["cases"], ids=lambda case: case["run_id"])
def test_a_runs_shard_is_the_servers(case):
    assert shard(case["run_id"]) == case["shard"]
    assert 0 <= case["shard"] < SHARDS["shards"]


@pytest.mark.parametrize("text", SHARDS["not_run_ids"])
def test_what_is_not_a_run_id_has_no_shard(text):
    assert shard(text) is None


@pytest.mark.parametrize("case", CANONICAL, ids=lambda case: case["name"])
def test_canonical_json_and_its_digest(case):
    canonical = case["canonical"]
    # The digest approvers see is the SHA-256 of the canonical text.
    assert hashlib.sha256(canonical.encode("utf-8")).hexdigest() == case["sha256"]
    # Canonicalizing changes no value this SDK reads.
    assert loads(case["input"]) == loads(canonical)
    # What it writes of the value is the canonical text, keys in the server's order; numbers other
    # than plain integers are read as binary floats (1.50 is 1.5), so only the value is kept.
    if case["plain_integers"]:
        assert dumps(loads(canonical)) == canonical

"""The decision-log mask's erasing: the same result as erasing from a deep copy, and
the document it was given is never changed (its unmasked parts are shared)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from gateway.policy.mask import erase, masked_copy


def reference(doc: dict[str, Any], pointers: list[str]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    for pointer in pointers:
        erase(out, pointer)
    return out


DOC = {
    "input": {
        "execution": {
            "code": "print(1)",
            "language": "python",
            "files": [{"path": "a"}, {"path": "b"}],
        },
        "principal": {"claims": {"api_key": "k", "sub": "s", "a/b": 1, "t~x": 2}},
        "tenant": {"id": "acme"},
        "list": [[1, 2, 3], {"x": [4, 5]}],
    },
    "result": {"allow": True, "deny": []},
}

POINTERS = [
    "/input/execution/code", "/input/principal/claims/api_key", "/input/principal/claims/a~1b",
    "/input/principal/claims/t~0x", "/input/execution/files/0", "/input/execution/files/1/path",
    "/input/list/0/1", "/input/list/1/x/0", "/input/nothing/here", "/input/list/9",
    "/input/list/x", "/input/tenant/id/deeper", "/result", "/input", "", "no-slash", "/",
]  # fmt: skip


def test_every_pointer_and_their_combinations_match_a_deep_copy() -> None:
    rng = random.Random(7)
    cases = [[p] for p in POINTERS] + [rng.sample(POINTERS, rng.randint(2, 6)) for _ in range(300)]
    for pointers in cases:
        before = json.dumps(DOC, sort_keys=True)
        assert masked_copy(DOC, pointers) == reference(DOC, pointers), pointers
        assert json.dumps(DOC, sort_keys=True) == before, pointers  # never changed


def test_the_unmasked_parts_are_shared_and_the_masked_path_is_not() -> None:
    out = masked_copy(DOC, ["/input/execution/code"])
    assert out["result"] is DOC["result"] and out["input"]["tenant"] is DOC["input"]["tenant"]
    assert (
        out["input"] is not DOC["input"]
        and out["input"]["execution"] is not DOC["input"]["execution"]
    )
    assert out["input"]["execution"]["files"] is DOC["input"]["execution"]["files"]

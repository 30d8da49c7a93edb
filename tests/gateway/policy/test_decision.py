"""parse_decision: the SPEC section 4 shape in, a Decision out, anything else refused."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.policy.decision import Decision, DecisionError, Obligations, parse_decision


def parse(raw: Any) -> Decision:
    return parse_decision(raw, decision_id="dec_1", revision="rev")


def allow(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "allow": True,
        "deny": [],
        "require_approval": False,
        "obligations": {"timeout_s": 5, "memory_mb": 256, "egress": []},
        "monitor": [],
    }
    raw.update(changes)
    return raw


def test_spec_example() -> None:
    decision = parse(
        {
            "allow": False,
            "deny": ["network egress to api.example.com:443 needs scope net:egress"],
            "require_approval": True,
            "approval": {"reason": "bash with network for tenant acme", "ttl_s": 900},
            "obligations": {
                "backend": "docker-gvisor",
                "timeout_s": 10,
                "memory_mb": 256,
                "egress": [],
            },
            "monitor": ["would deny under draft rule X"],
        }
    )
    assert decision == Decision(
        allow=False,
        deny=("network egress to api.example.com:443 needs scope net:egress",),
        require_approval=True,
        approval_reason="bash with network for tenant acme",
        approval_ttl_s=900,
        obligations=Obligations(backend="docker-gvisor", timeout_s=10, memory_mb=256, egress=()),
        monitor=("would deny under draft rule X",),
        decision_id="dec_1",
        revision="rev",
    )


def test_minimal_allow() -> None:
    decision = parse({"allow": True})
    assert decision.allow is True
    assert decision.deny == () and decision.monitor == ()
    assert decision.require_approval is False
    assert decision.obligations == Obligations()
    assert decision.obligations.egress is None


def test_all_obligations() -> None:
    raw = {
        "backend": "nsjail",
        "timeout_s": 2.5,
        "memory_mb": 128,
        "cpus": 0.5,
        "pids": 32,
        "disk_mb": 16,
        "output_bytes": 4096,
        "egress": ["api.example.com:443"],
    }
    obligations = parse(allow(obligations=raw)).obligations
    assert obligations.as_dict() == raw
    assert obligations.limits() == {
        "timeout_s": 2.5,
        "memory_mb": 128,
        "cpus": 0.5,
        "pids": 32,
        "disk_mb": 16,
        "output_bytes": 4096,
    }
    assert obligations.egress == ("api.example.com:443",)


def test_whole_number_floats_become_ints() -> None:
    # Rego engines may render 512 as 512.0.
    obligations = parse(allow(obligations={"memory_mb": 512.0, "pids": 64.0})).obligations
    assert obligations.memory_mb == 512 and isinstance(obligations.memory_mb, int)
    assert obligations.pids == 64 and isinstance(obligations.pids, int)


def test_allow_with_deny_is_a_denial() -> None:
    decision = parse(allow(deny=["no"]))
    assert decision.allow is False
    assert decision.deny == ("no",)


def test_allow_with_required_approval_is_a_hold() -> None:
    decision = parse(allow(require_approval=True, approval={"reason": "native code"}))
    assert decision.allow is False
    assert decision.require_approval is True
    assert decision.approval_reason == "native code"
    assert decision.approval_ttl_s is None


def test_approval_without_details() -> None:
    decision = parse({"allow": False, "require_approval": True})
    assert decision.require_approval and decision.approval_reason == ""


def test_approval_details_ignored_when_not_required() -> None:
    decision = parse(allow(approval={"reason": "x", "ttl_s": 5}))
    assert (decision.approval_reason, decision.approval_ttl_s) == ("", None)


def test_unknown_top_level_keys_are_ignored_and_kept() -> None:
    decision = parse(allow(policy_note="hi", zeta=1))
    assert decision.allow is True
    assert decision.extra_keys == ("policy_note", "zeta")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "must be an object, got null"),
        ("allow", "must be an object, got a string"),
        ([{"allow": True}], "must be an object, got an array"),
        (True, "must be an object, got a boolean"),
        ({}, "no 'allow'"),
        ({"deny": []}, "no 'allow'"),
        ({"allow": "true"}, "'allow' must be a boolean, got a string"),
        ({"allow": 1}, "'allow' must be a boolean, got a number"),
        ({"allow": None}, "'allow' must be a boolean, got null"),
        (allow(deny="no"), "'deny' must be an array of strings, got a string"),
        (allow(deny=None), "'deny' must be an array"),
        (allow(deny={"a": 1}), "'deny' must be an array"),
        (allow(deny=["ok", 3]), "'deny[1]' must be a string, got a number"),
        (allow(monitor="x"), "'monitor' must be an array"),
        (allow(monitor=[None]), "'monitor[0]' must be a string"),
        (allow(require_approval="yes"), "'require_approval' must be a boolean"),
        (allow(require_approval=True, approval="x"), "'approval' must be an object"),
        (allow(require_approval=True, approval={"reason": 1}), "'approval.reason'"),
        (allow(require_approval=True, approval={"ttl_s": 0}), "'approval.ttl_s' must be positive"),
        (allow(require_approval=True, approval={"ttl_s": 1.5}), "whole number"),
        (allow(require_approval=True, approval={"ttl_s": "900"}), "must be a number"),
        (allow(obligations=[]), "'obligations' must be an object, got an array"),
        (allow(obligations=None), "'obligations' must be an object, got null"),
        (allow(obligations={"gpu": 1}), "unknown obligation(s): gpu"),
        (allow(obligations={"network": "on", "sudo": 1}), "unknown obligation(s): network, sudo"),
        (allow(obligations={"timeout_s": 0}), "'obligations.timeout_s' must be positive"),
        (allow(obligations={"timeout_s": -1}), "must be positive"),
        (allow(obligations={"cpus": "1"}), "'obligations.cpus' must be a number"),
        (allow(obligations={"cpus": True}), "must be a number, got a boolean"),
        (allow(obligations={"memory_mb": math.inf}), "must be positive"),
        (allow(obligations={"memory_mb": math.nan}), "must be positive"),
        (allow(obligations={"memory_mb": 0.5}), "whole number"),
        (allow(obligations={"pids": None}), "must be a number, got null"),
        (allow(obligations={"backend": ""}), "'obligations.backend' must be a name"),
        (allow(obligations={"backend": 1}), "'obligations.backend' must be a name"),
        (allow(obligations={"egress": "a:1"}), "'obligations.egress' must be an array"),
        (allow(obligations={"egress": None}), "'obligations.egress' must be an array"),
        (allow(obligations={"egress": [443]}), "'obligations.egress[0]' must be a string"),
    ],
)
def test_malformed_decisions_fail_closed(raw: Any, message: str) -> None:
    with pytest.raises(DecisionError) as info:
        parse(raw)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)

"""Pipeline stages: verbs, each `async def stage(ctx, services) -> None`.

Their order lives in gateway/pipeline.py and nowhere else.
"""

from gateway.stages.admit import admit
from gateway.stages.analyse import analyse
from gateway.stages.approval import Held, hold_for_approval, redeem_approval
from gateway.stages.auth import authenticate, authorize
from gateway.stages.dispatch import dispatch
from gateway.stages.policy import decide
from gateway.stages.policy_input import build_input
from gateway.stages.review import review
from gateway.stages.validate import validate

__all__ = [
    "Held",
    "admit",
    "analyse",
    "authenticate",
    "authorize",
    "build_input",
    "decide",
    "dispatch",
    "hold_for_approval",
    "redeem_approval",
    "review",
    "validate",
]

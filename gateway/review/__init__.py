"""Immediate safety review: the policy's second question over what an execution
tried, and telling a person when it flags something.

`document` builds the review input (`data.execgate.review`, policies/review.rego)
and reads the flags back, bounded and checked; `notifier` sends flagged
executions to the review webhook (Standard Webhooks, as approval requests are),
retried off the request path, every attempt audited.
"""

from gateway.review.document import REVIEW_VERSION, Flag, parse_flags, review_input
from gateway.review.notifier import ReviewNotifier

__all__ = ["REVIEW_VERSION", "Flag", "ReviewNotifier", "parse_flags", "review_input"]

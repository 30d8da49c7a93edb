"""ApprovalRecords on Redis: an approval made on one replica is seen by all.

One hash per approval: `record` is the approval as created (JSON), every later
change is its own field (a JSON value) laid over it, so no script ever re-encodes a
record. Deciding and expiring are Lua scripts (one winner across replicas); a
token's jti is spent with SET NX and lapses when the token would have expired.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from gateway.approvals.records import Approval, ApprovalError, DecisionWord
from gateway.state.redis_state import PREFIX, RedisState, lua_script

_DECIDED = {"approve": "approved", "deny": "denied"}
_IMMUTABLE = "record"
# Decided approvals are kept this long after they would have expired.
KEEP_S = 7 * 86400


class RedisApprovalStore:
    def __init__(self, state: RedisState, clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._redis = state.client
        self._clock = clock
        self._decide = self._redis.register_script(lua_script("decide"))
        self._expire = self._redis.register_script(lua_script("expire"))

    @staticmethod
    def _key(approval_id: str) -> str:
        return f"{PREFIX}apr:{approval_id}"

    _pending = f"{PREFIX}apr:pending"
    _index = f"{PREFIX}apr:index"

    async def start(self) -> None:
        pass  # the client belongs to the RedisState, which starts and closes it

    async def close(self) -> None:
        pass

    async def create(self, approval: Approval) -> None:
        key = self._key(approval.id)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(
            key,
            mapping={
                _IMMUTABLE: json.dumps(asdict(approval)),
                "status": json.dumps(approval.status),
                "expires_at": repr(approval.expires_at),
            },
        )
        pipe.expireat(key, int(approval.expires_at + KEEP_S))
        pipe.zadd(self._pending, {approval.id: approval.expires_at})
        pipe.zadd(self._index, {approval.id: approval.created_at})
        pipe.zremrangebyscore(self._index, "-inf", approval.created_at - KEEP_S)
        await self._state.run(pipe.execute())

    async def get(self, approval_id: str) -> Approval | None:
        fields = await self._state.run(self._redis.hgetall(self._key(approval_id)))
        return self._load(fields)

    @staticmethod
    def _load(fields: dict[bytes, bytes]) -> Approval | None:
        if not fields or _IMMUTABLE.encode() not in fields:
            return None
        data = json.loads(fields[_IMMUTABLE.encode()])
        for name, value in fields.items():
            if name.decode() not in (_IMMUTABLE, "expires_at"):
                data[name.decode()] = json.loads(value)
        return Approval(**data)

    async def decide(
        self, approval_id: str, word: DecisionWord, approver: str, reason: str
    ) -> tuple[Approval, bool]:
        keys = [self._key(approval_id), self._pending]
        args = [json.dumps(_DECIDED[word]), json.dumps(approver), json.dumps(reason), approval_id]
        answer = await self._state.run(self._decide(keys=keys, args=args))
        verdict = answer[0].decode()
        if verdict == "not_found":
            raise ApprovalError("not_found", "no such approval")
        if verdict == "expired":
            raise ApprovalError("expired", "the approval has expired")
        if verdict == "conflict":
            raise ApprovalError("conflict", f"already {json.loads(answer[1])}")
        approval = await self.get(approval_id)
        assert approval is not None
        return approval, verdict == "changed"

    async def update(self, approval_id: str, **changes: Any) -> Approval | None:
        key = self._key(approval_id)
        if not await self._state.run(self._redis.exists(key)):
            return None
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(key, mapping={name: json.dumps(value) for name, value in changes.items()})
        if changes.get("status", "pending") != "pending":
            pipe.zrem(self._pending, approval_id)
        await self._state.run(pipe.execute())
        return await self.get(approval_id)

    async def expire_due(self) -> list[Approval]:
        now = self._clock()
        due = await self._state.run(self._redis.zrangebyscore(self._pending, "-inf", now))
        expired = []
        for raw in due:
            approval_id = raw.decode()
            keys = [self._key(approval_id), self._pending]
            if await self._state.run(self._expire(keys=keys, args=[approval_id, now])):
                approval = await self.get(approval_id)
                if approval is not None:
                    expired.append(approval)
        return expired

    async def list(
        self, status: str | None = None, tenant: str | None = None, limit: int = 100
    ) -> list[Approval]:
        source = self._pending if status == "pending" else self._index
        ids = await self._state.run(self._redis.zrevrange(source, 0, -1))
        found: list[Approval] = []
        for start in range(0, len(ids), 200):
            pipe = self._redis.pipeline(transaction=False)
            for raw in ids[start : start + 200]:
                pipe.hgetall(self._key(raw.decode()))
            for fields in await self._state.run(pipe.execute()):
                approval = self._load(fields)
                if approval is None:
                    continue
                if (status and approval.status != status) or (tenant and approval.tenant != tenant):
                    continue
                found.append(approval)
                if len(found) >= limit:
                    return found
        return found

    async def spend_token(self, jti: str, expires_at: float) -> bool:
        # Remembered a minute past the token's expiry (clock skew between replicas).
        return await self._state.spend_once(f"jti:{jti}", expires_at - self._clock() + 60)

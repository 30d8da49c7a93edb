"""The state tests share a real redis-server fixture."""

from tests.redis_server import redis_server  # noqa: F401

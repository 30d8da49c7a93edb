"""Refused syscalls, named, as sandbox events (nsjail with seccomp_log)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from backends.nsjail.backend import NsjailBackend
from backends.nsjail.seccomp_audit import RECORD, syscall_names
from backends.nsjail.settings import NsjailSettings
from tests.backends.conformance import run

pytestmark = pytest.mark.integration  # drives a real nsjail

LINE = (
    b"6,1234,5678,-;audit: type=1326 audit(1.2:3): auid=4294967295 uid=160000 gid=160000"
    b' ses=4294967295 pid=22884 comm="python3" exe="/usr/bin/python3.11" sig=0'
    b" arch=c000003e syscall=165 compat=0 ip=0x7fa3918c5829 code=0x50000\n"
)


def test_record_and_names() -> None:
    match = RECORD.search(LINE)
    assert match is not None and (match[1], match[2]) == (b"22884", b"165")
    names = syscall_names()
    if names:  # the kernel headers are optional: numbers are reported without them
        assert names[165] == "mount" and names[435] == "clone3"


@pytest.fixture
async def logging_backend(nsjail_settings: NsjailSettings) -> AsyncIterator[NsjailBackend]:
    backend = NsjailBackend(nsjail_settings.model_copy(update={"seccomp_log": True}))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def test_refused_syscalls_are_events(logging_backend: NsjailBackend) -> None:
    code = (
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for _ in range(3):\n"
        "    print(libc.syscall(165, 0, 0, 0, 0, 0))\n"  # mount
        "time.sleep(0.5)\n"  # the kernel log may trail the refusal a little
    )
    result = await run(logging_backend, "python", code)
    assert result.stdout.split() == [b"-1"] * 3
    seccomp = [e.detail for e in result.events if e.kind == "seccomp"]
    assert any(d.startswith(("mount refused", "syscall 165 refused")) for d in seccomp), seccomp
    # Another execution does not see this one's refusals.
    quiet = await run(logging_backend, "python", "print(1)")
    assert not [e for e in quiet.events if e.kind == "seccomp"]

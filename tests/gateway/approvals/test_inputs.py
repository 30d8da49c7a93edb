"""Approvers see what will run, and the analysis reads what will run.

A real gateway (nsjail, embedded Rego, audit) and a real Standard Webhooks receiver:
input files are analysed like the code (`import helper` with a `helper.py` that
loads ctypes is held on the default tenant, as ctypes in the code is), and the
approval record and the webhook payload carry every file (text inline when small,
else sha256 and size) and stdin.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from gateway.approvals.records import SHOW_INLINE_BYTES, SHOW_TOTAL_BYTES
from tests.gateway.approvals.gateway import (  # noqa: F401 (fixtures)
    Receiver,
    gateway_env_fixture,
    receiver_fixture,
    start_fixture,
    wait_for,
)
from tests.gateway.conftest import auth

pytestmark = pytest.mark.integration

MAIN = "import sys\nsys.path.insert(0, '.')\nimport helper\nprint(helper.size())\n"


def files(*entries: tuple[str, bytes]) -> list[dict[str, str]]:
    return [{"path": p, "content_b64": base64.b64encode(c).decode()} for p, c in entries]


# Each loads native code only through an input file the code pulls in.
HIDDEN_IN_FILES = {
    "helper.py imports ctypes": files(
        ("helper.py", b"import ctypes\ndef size():\n    return ctypes.sizeof(ctypes.c_int)\n")
    ),
    "helper.py imports _ctypes": files(
        ("helper.py", b"from _ctypes import sizeof as size\n"),
    ),
    "a package's __init__": files(
        ("helper/__init__.py", b"from .impl import size\n"),
        ("helper/impl.py", b"import ctypes\nsize = lambda: ctypes.sizeof(ctypes.c_int)\n"),
    ),
    "a native extension": files(("helper.cpython-311-x86_64-linux-gnu.so", b"\x7fELF\x02\x01")),
    "a script by its shebang": files(("helper", b"#!/usr/bin/env python3\nimport ctypes\n")),
}


@pytest.mark.parametrize("case", sorted(HIDDEN_IN_FILES))
async def test_native_code_in_an_input_file_is_held_on_the_default_tenant(
    start: Any, case: str
) -> None:
    gw, client = await start()
    body = {"language": "python", "code": MAIN, "files": HIDDEN_IN_FILES[case]}
    # "hooli" has no policy data of its own: the default tenant's rules apply.
    resp = await client.post("/v1/executions", json=body, headers=auth(gw.token(tenant="hooli")))
    held = await resp.json()
    assert resp.status == 202, (case, held)
    assert any("loads native code" in reason for reason in held["reasons"]), held


async def test_harmless_input_files_still_run(start: Any) -> None:
    """Data is not code: a CSV or prose that names ctypes holds nothing."""
    gw, client = await start()
    body = {
        "language": "python",
        "code": MAIN,
        "files": files(
            ("helper.py", b"def size():\n    return 4\n"),
            ("data.csv", b"ctype,value\nint,4\n"),
            ("notes.txt", b"we do not use ctypes here\n"),  # prose, not Python
        ),
    }
    resp = await client.post("/v1/executions", json=body, headers=auth(gw.token(tenant="hooli")))
    answer = await resp.json()
    assert resp.status == 200 and answer["stdout"] == "4\n", answer


async def test_the_record_and_the_webhook_show_files_and_stdin(
    start: Any, receiver: tuple[Receiver, str]
) -> None:
    gw, client = await start()
    text = b"import ctypes\n"
    blob = bytes(range(256))
    large = b"#" * (SHOW_INLINE_BYTES + 1)
    body = {
        "language": "python",
        "code": MAIN,
        "stdin": "line one\nline two\n",
        "files": files(("helper.py", text), ("blob.bin", blob), ("large.txt", large)),
    }
    resp = await client.post("/v1/executions", json=body, headers=auth(gw.token()))
    held = await resp.json()
    assert resp.status == 202, held
    expected_files = [
        {
            "path": "helper.py",
            "bytes": len(text),
            "sha256": hashlib.sha256(text).hexdigest(),
            "content": text.decode(),
        },
        {
            "path": "blob.bin",
            "bytes": 256,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "content": None,
        },
        {
            "path": "large.txt",
            "bytes": len(large),
            "sha256": hashlib.sha256(large).hexdigest(),
            "content": None,
        },
    ]
    stdin = body["stdin"].encode()
    expected_stdin = {
        "bytes": len(stdin),
        "sha256": hashlib.sha256(stdin).hexdigest(),
        "content": body["stdin"],
    }
    record = await (
        await client.get(f"/v1/approvals/{held['approval_id']}", headers=gw.approver())
    ).json()
    assert record["files"] == expected_files and record["stdin"] == expected_stdin
    assert record["backend"] == "nsjail" and record["tool"] is None
    assert record["binding_sha256"] and "content_b64" not in str(record)
    await wait_for(lambda: bool(receiver[0].received))
    data = receiver[0].received[0]["data"]
    assert data["files"] == expected_files and data["stdin"] == expected_stdin
    assert data["binding_sha256"] == record["binding_sha256"]


async def test_inline_inputs_are_bounded_per_approval(start: Any) -> None:
    """Many small text files: inline until the approval's budget is spent, then by
    hash, so a listing of many approvals stays a bounded answer."""
    gw, client = await start()
    piece = b"#" * (SHOW_INLINE_BYTES - 1)
    count = SHOW_TOTAL_BYTES // len(piece) + 3
    body = {
        "language": "python",
        "code": "import ctypes\n",
        "files": files(*((f"f{i}.txt", piece) for i in range(count))),
    }
    resp = await client.post("/v1/executions", json=body, headers=auth(gw.token()))
    held = await resp.json()
    assert resp.status == 202, held
    listing = await (await client.get("/v1/approvals", headers=gw.approver())).json()
    (record,) = [a for a in listing["approvals"] if a["approval_id"] == held["approval_id"]]
    inline = [f for f in record["files"] if f["content"] is not None]
    assert len(inline) == SHOW_TOTAL_BYTES // len(piece)
    assert all(f["sha256"] == hashlib.sha256(piece).hexdigest() for f in record["files"])
    assert len(record["files"]) == count

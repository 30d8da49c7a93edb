"""Compile and probe a policy in a throw-away process before the gateway does.

rego-cpp 1.5 aborts or segfaults on some policies instead of reporting an error
(for example `with input as {...}` next to a builtin call, or one function
defined with two arities). In-process that would kill the gateway with no word
about which policy did it; here it becomes a start-up error naming the cause.

Protocol: the parent writes {"root", "modules", "data"} as JSON on stdin; this
process prints {"error": null | "message"} on stdout and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from gateway.policy.base import PolicyEngineError
from gateway.policy.sources import PolicySources

_TIMEOUT_S = 60.0
# The child must import this very package, installed or not.
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def _check(payload: dict[str, Any]) -> str | None:
    from gateway.policy.rego import CompiledPolicy  # regopy loads only in the child

    sources = PolicySources(
        root=Path(payload["root"]), modules=payload["modules"], data=payload["data"], revision=""
    )
    try:
        CompiledPolicy(sources).probe()
    except PolicyEngineError as exc:
        return exc.message
    return None


def main() -> None:
    payload = json.loads(sys.stdin.buffer.read())
    json.dump({"error": _check(payload)}, sys.stdout)


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


async def preflight(sources: PolicySources) -> None:
    """Raise PolicyEngineError("invalid") if compiling or probing fails or crashes."""
    payload = json.dumps(
        {"root": str(sources.root), "modules": sources.modules, "data": sources.data}
    ).encode()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.policy.preflight",
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(payload), _TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise PolicyEngineError(
            "invalid", f"compiling the policy in {sources.root} took over {_TIMEOUT_S:.0f} s"
        ) from None
    if proc.returncode != 0:
        cause = (
            f"crashed ({_signal_name(proc.returncode)})"
            if proc.returncode < 0
            else f"failed (exit {proc.returncode}): {err.decode(errors='replace')[-500:]}"
        )
        raise PolicyEngineError(
            "invalid",
            f"the embedded Rego engine {cause} compiling the policy in {sources.root}; "
            "rego-cpp 1.5 crashes on some valid Rego, e.g. `with input as` or one "
            "function defined with two arities",
        )
    error = json.loads(out)["error"]
    if error is not None:
        raise PolicyEngineError("invalid", error)


if __name__ == "__main__":
    main()

"""How each language runs in a sandbox: the interpreter's argv and the code's file name.

Shared by every backend that runs real interpreters (nsjail, docker, docker-gvisor);
each backend's settings carry a `runtimes` table of these.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RuntimeSettings(BaseModel):
    """How one language runs: the interpreter argv (host paths, also valid in the
    jail since they are bind-mounted at the same place) and the code file name."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str] = Field(min_length=1)
    filename: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")

    @field_validator("argv")
    @classmethod
    def _absolute_interpreter(cls, value: list[str]) -> list[str]:
        if not value[0].startswith("/"):
            raise ValueError("the interpreter must be an absolute path")
        if any("\n" in arg or "\x00" in arg for arg in value):
            raise ValueError("arguments may not contain newlines or NUL")
        return value


def default_runtimes() -> dict[str, RuntimeSettings]:
    """The same paths on the host (nsjail bind-mounts /usr read-only) and in the
    sandbox image (backends/images/sandbox/build.sh)."""
    return {
        # Debian's interpreter, not any other python found on PATH; -I: no
        # user site, no PYTHON* variables, no script dir on sys.path.
        "python": RuntimeSettings(argv=["/usr/bin/python3", "-I"], filename="main.py"),
        "bash": RuntimeSettings(argv=["/bin/bash"], filename="main.sh"),
        "javascript": RuntimeSettings(argv=["/usr/bin/node"], filename="main.js"),
    }

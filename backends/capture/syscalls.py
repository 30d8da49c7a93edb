"""x86-64 (and i386) system call numbers -> names, from the kernel headers."""

from __future__ import annotations

import re
from pathlib import Path

UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
# The 32-bit table (int 0x80 from a 64-bit process uses it).
UNISTD_32 = Path("/usr/include/x86_64-linux-gnu/asm/unistd_32.h")


def syscall_names(header: Path = UNISTD) -> dict[int, str]:
    """{} without the headers (a refusal is then named "syscall N")."""
    try:
        text = header.read_text()
    except OSError:
        return {}
    return {int(number): name for name, number in re.findall(r"#define __NR_(\w+)\s+(\d+)", text)}


X32_FLAG = 0x40000000
# A refusal's number for a 32-bit call (int 0x80) as the host tracer prints it: the
# i386 number plus this (an x32 call's number carries its own flag).
COMPAT_FLAG = 0x100000


def call_name(number: int, names: dict[int, str], names32: dict[int, str] | None = None) -> str:
    """A refused call's name: x86-64's, or marked x32 or i386."""
    if number & X32_FLAG:
        number &= ~X32_FLAG
        return "x32 " + names.get(number, f"syscall {number}")
    if number & COMPAT_FLAG and names32 is not None:
        number &= ~COMPAT_FLAG
        return "i386 " + names32.get(number, f"syscall {number}")
    return names.get(number, f"syscall {number}")

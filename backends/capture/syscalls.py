"""x86-64 system call numbers -> names, from the kernel headers."""

from __future__ import annotations

import re
from pathlib import Path

UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")


def syscall_names(header: Path = UNISTD) -> dict[int, str]:
    """{} without the headers (a refusal is then named "syscall N")."""
    try:
        text = header.read_text()
    except OSError:
        return {}
    return {int(number): name for name, number in re.findall(r"#define __NR_(\w+)\s+(\d+)", text)}

"""The docker backends' seccomp profile: nsjail's allowlist, in the engine's JSON.

One list of allowed system calls for every backend: backends/seccomp.kafel. Its
plain names become one allow rule; the few calls it allows only with certain
arguments get the same conditions written for libseccomp below (a test fails if
the kafel file gains a condition this module does not know). Everything else
fails with EPERM, clone3 with ENOSYS (so glibc falls back to clone, whose flags
seccomp can inspect). The engine's default profile is looser: Docker 20.10's lets
io_uring through, for one.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

# Kafel's names where libseccomp's differ.
RENAMES = {"newstat": "stat", "newfstat": "fstat", "newlstat": "lstat", "newuname": "uname",
           "sendfile64": "sendfile"}  # fmt: skip
CLONE_NS_FLAGS = 0x7E020080
LOW32 = 0xFFFFFFFF
S_IFMT, S_IFREG, S_IFIFO = 0xF000, 0x8000, 0x1000
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, NETLINK_ROUTE = 1, 2, 10, 16, 0


def _arg(index: int, value: int, op: str = "SCMP_CMP_EQ", mask: int = 0) -> dict[str, Any]:
    if op == "SCMP_CMP_MASKED_EQ":
        # libseccomp's masked compare: (arg & value) == valueTwo.
        return {"index": index, "value": mask, "valueTwo": value, "op": op}
    return {"index": index, "value": value, "valueTwo": 0, "op": op}


def _mode_rules(name: str, index: int) -> list[dict[str, Any]]:
    masked = "SCMP_CMP_MASKED_EQ"
    return [{"names": [name], "action": "SCMP_ACT_ALLOW",
             "args": [_arg(index, kind, masked, S_IFMT)]}
            for kind in (0, S_IFREG, S_IFIFO)]  # fmt: skip


# The calls seccomp.kafel allows only with conditions, as libseccomp rules.
CONDITIONAL: dict[str, list[dict[str, Any]]] = {
    "clone": [{"names": ["clone"], "action": "SCMP_ACT_ALLOW",
               "args": [_arg(0, 0, "SCMP_CMP_MASKED_EQ", CLONE_NS_FLAGS)]}],
    "personality": [{"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                     "args": [_arg(0, value, "SCMP_CMP_MASKED_EQ", LOW32)]}
                    for value in (0, LOW32)],
    "mknod": _mode_rules("mknod", 1),
    "mknodat": _mode_rules("mknodat", 2),
    # Kafel refuses TIOCSTI and TIOCLINUX; libseccomp cannot express "low 32 bits
    # differ", and a sandbox has no terminal to push characters into anyway.
    "ioctl": [{"names": ["ioctl"], "action": "SCMP_ACT_ALLOW"}],
    "socket": [
        *({"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, family)]}
          for family in (AF_UNIX, AF_INET, AF_INET6)),
        {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
         "args": [_arg(0, AF_NETLINK), _arg(2, NETLINK_ROUTE)]},
    ],
}  # fmt: skip


def _allow_items(kafel: str, action: str = "ALLOW") -> list[str]:
    """Every item of every `action` block, conditions included, comments removed."""
    text = re.sub(r"//[^\n]*", "", kafel)
    items: list[str] = []
    for match in re.finditer(rf"\b{action}\s*\{{", text):
        depth, start, pos = 1, match.end(), match.end()
        current = start
        while depth:
            char = text[pos]
            if char in "({":
                depth += 1
            elif char in ")}":
                depth -= 1
            elif char == "," and depth == 1:
                items.append(text[current:pos].strip())
                current = pos + 1
            pos += 1
        items.append(text[current : pos - 1].strip())
    return [item for item in items if item]


def profile_from_kafel(kafel: str) -> dict[str, Any]:
    names: list[str] = []
    rules: list[dict[str, Any]] = []
    for item in _allow_items(kafel):
        name = re.match(r"[a-z0-9_]+", item)
        if name is None:
            raise ValueError(f"seccomp.kafel: cannot read {item!r}")
        if item == name.group():
            names.append(RENAMES.get(item, item))
        elif name.group() in CONDITIONAL:
            rules += CONDITIONAL[name.group()]
        else:
            raise ValueError(f"seccomp.kafel: no libseccomp rule for {item!r}")
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        # x86_64 only: 32-bit and x32 calls (other architectures) get the default.
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [
            {"names": sorted(set(names)), "action": "SCMP_ACT_ALLOW"},
            *rules,
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
            *(
                [{"names": sorted(killed), "action": "SCMP_ACT_KILL_PROCESS"}]
                if (killed := _allow_items(kafel, "KILL_PROCESS"))
                else []
            ),
        ],
    }


def bundled_profile() -> dict[str, Any]:
    kafel = resources.files("backends").joinpath("seccomp.kafel").read_text()
    return profile_from_kafel(kafel)

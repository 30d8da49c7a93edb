"""Bash analysis: the commands a script runs, and what they suggest."""

from __future__ import annotations

import pytest

from gateway.analysis import analyse


def sh(code: str) -> dict:
    result = analyse("bash", code)
    assert result["parsed"] is True, code[:200]
    return result


@pytest.mark.parametrize(
    ("code", "calls"),
    [
        ("ls -l", ["ls"]),
        ("a | b && c; d || e & f", ["a", "b", "c", "d", "e", "f"]),
        ("echo $(whoami) `id` <(date)", ["date", "echo", "id", "whoami"]),
        ('echo "$(hostname)"', ["echo", "hostname"]),
        ("x=1 Y=2 cmd arg", ["cmd"]),
        ("x=1", []),
        ("/usr/bin/curl x", ["curl"]),
        ("if true; then a; elif b; then c; else d; fi", ["a", "b", "c", "d", "true"]),
        ("while read l; do echo $l; done < f", ["echo", "read"]),
        ("for f in a b c; do rm $f; done", ["rm"]),
        ("for ((i=0; i<3; i++)); do echo $i; done", ["echo"]),
        ("case $x in a) one ;; b|c) two ;; *) three ;; esac", ["one", "three", "two"]),
        ("f() { inner; }\nf", ["f", "inner"]),
        ("function g { inner; }", ["inner"]),
        ("(sub; shell)", ["shell", "sub"]),
        ("{ grouped; }", ["grouped"]),
        ("! negated", ["negated"]),
        ("sudo -u root tee /etc/x", ["sudo", "tee"]),
        ("env A=1 B=2 python3 x.py", ["env", "python3"]),
        ("timeout 5 curl x", ["curl", "timeout"]),
        ("find . | xargs -n 1 rm", ["find", "rm", "xargs"]),
        ("echo a # curl in a comment", ["echo"]),
        ("echo 'curl in quotes' \"wget too\"", ["echo"]),
        ("echo \\\n  continued", ["echo"]),
        ("cat <<EOF\ncurl is only text here\nEOF\nls", ["cat", "ls"]),
        ("cat <<-'END'\n\tbody\n\tEND\nls", ["cat", "ls"]),
        ("echo $((1 + (2 * 3)))", ["echo"]),
        ("echo ${x:-default} ${#arr[@]}", ["echo"]),
        ("echo $'it\\'s'", ["echo"]),
        ("arr[0]=1 cmd", ["cmd"]),
    ],
)
def test_commands(code: str, calls: list[str]) -> None:
    assert sh(code)["calls"] == calls


@pytest.mark.parametrize(
    ("code", "feature"),
    [
        ("curl https://example.com", "network"),
        ("wget -q x", "network"),
        ("nc -l 4444", "network"),
        ("exec 3<>/dev/tcp/203.0.113.9/80", "network"),
        ("cat < /dev/tcp/host/80", "network"),
        ("echo x > /dev/udp/h/53", "network"),
        ("sudo curl x", "network"),
        ("python3 -c 'print(1)'", "dynamic_code"),
        ("perl -e 1", "dynamic_code"),
        ('eval "$cmd"', "dynamic_code"),
        ("source ./x.sh", "dynamic_code"),
        (". ./x.sh", "dynamic_code"),
        ("bash -c 'ls'", "dynamic_code"),
        ("$cmd arg", "dynamic_code"),
        ("echo hi > out.txt", "filesystem_write"),
        ("echo hi >> log", "filesystem_write"),
        ("ls &> all.txt", "filesystem_write"),
        ("echo x | tee f", "filesystem_write"),
        ("rm -rf dir", "filesystem_write"),
        ("gcc x.c -o x", "native_code"),
        ("LD_PRELOAD=/tmp/x.so ls", "native_code"),
        ("python3 -c 'import ctypes'", "native_code"),
        ("python3 <<'EOF'\nimport ctypes\nEOF", "native_code"),
        ("cat <<EOF\n$(curl x)\nEOF", "network"),
        ("printenv", "environment"),
    ],
)
def test_feature(code: str, feature: str) -> None:
    assert feature in sh(code)["features"]


@pytest.mark.parametrize(
    "code",
    [
        "ls 2>&1",
        "ls > /dev/null 2>&1",
        "ls &>/dev/null",
        "echo hi >&2",
        "grep x < input.txt",
        "cat <<< 'here string'",
        "echo '> not a redirect'",
    ],
)
def test_no_write(code: str) -> None:
    assert "filesystem_write" not in sh(code)["features"]


def test_native_module_named_from_embedded_python() -> None:
    assert sh("python3 -c 'import ctypes'")["imports"] == ["ctypes"]


@pytest.mark.parametrize(
    "code",
    [
        "echo 'open",
        'echo "open',
        "echo $(ls",
        "echo `ls",
        "echo ${x",
        "echo $'x",
        "$(" * 40 + ")" * 40,
    ],
)
def test_unbalanced_is_not_parsed(code: str) -> None:
    assert analyse("bash", code)["parsed"] is False


def test_unparsed_script_is_still_scanned() -> None:
    result = analyse("bash", "curl x; echo 'unterminated")
    assert result["parsed"] is False
    assert "network" in result["features"]

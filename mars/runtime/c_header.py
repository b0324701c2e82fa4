"""The C kernels' declarations for ctypes, read from their one header (mars/runtime/csrc/mars_kernels.h).

    parse(text) -> Header: constants (`#define NAME <integer>`), structs (ctypes.Structure classes laid out as
                  the C compiler lays them out: same fields, same types, same order) and functions (ctypes
                  restype and argtypes)
    Header.declare(lib)  sets every declared function's argtypes and restype on a loaded library

Why a parser and not a second list: a prototype written twice (C and Python) drifts, and a wrong argtype
passes a pointer where an int64 was expected without a word. The parser is strict: it reads only the subset
the header is written in and raises `HeaderError` on anything else, so a new construct is added here on purpose.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field

# value types by C name; any pointer is a c_void_p (the wrappers pass data_ptr() integers, byref, arrays)
SCALARS = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "int": ctypes.c_int, "float": ctypes.c_float,
           "double": ctypes.c_double, "uint8_t": ctypes.c_uint8, "int8_t": ctypes.c_int8, "uint16_t": ctypes.c_uint16}
RETURNS = {"void": None, "int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float}
NAME = r"[A-Za-z_][A-Za-z0-9_]*"


class HeaderError(ValueError):
    pass


@dataclass
class Header:
    constants: dict[str, int] = field(default_factory=dict)
    structs: dict[str, type] = field(default_factory=dict)  # name -> ctypes.Structure subclass
    functions: dict[str, tuple] = field(default_factory=dict)  # name -> (restype, [argtypes])

    def declare(self, lib) -> None:
        """Every declared function's argtypes and restype on `lib`; AttributeError where one is missing."""
        for name, (restype, argtypes) in self.functions.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _type(words: list[str], stars: int, header: Header, where: str, value_types: dict):
    """The ctypes type of a declaration's type words (const dropped) and pointer depth."""
    words = [w for w in words if w != "const"]
    if len(words) != 1:
        raise HeaderError(f"{where}: one type name expected, got {' '.join(words) or 'none'}")
    name = words[0]
    known = name in SCALARS or name in header.structs or name == "void"
    if not known:
        raise HeaderError(f"{where}: unknown type {name!r}")
    if stars:
        return ctypes.c_void_p
    if name not in value_types:
        raise HeaderError(f"{where}: a {name} is not taken by value here")
    return value_types[name]


def _declarators(decl: str, where: str) -> tuple[list[str], list[tuple[str, int]]]:
    """'const float *a, *b' -> (['const', 'float'], [('a', 1), ('b', 1)])."""
    first, *rest = [p.strip() for p in decl.split(",")]
    m = re.fullmatch(rf"((?:{NAME}\s+)*{NAME})(?:\s*(\*+)\s*|\s+)({NAME})", first)
    if not m:
        raise HeaderError(f"{where}: cannot read {decl!r}")
    words, out = m.group(1).split(), [(m.group(3), len(m.group(2) or ""))]
    for p in rest:
        m2 = re.fullmatch(rf"(\**)\s*({NAME})", p)
        if not m2:
            raise HeaderError(f"{where}: cannot read {p!r} in {decl!r}")
        out.append((m2.group(2), len(m2.group(1))))
    return words, out


def _struct(body: str, name: str, header: Header) -> type:
    fields = []
    value_types = {**SCALARS, **header.structs}
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        words, names = _declarators(decl, f"struct {name}")
        for field_name, stars in names:
            fields.append((field_name, _type(words, stars, header, f"struct {name}.{field_name}", value_types)))
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def _function(decl: str, header: Header) -> tuple[str, tuple]:
    m = re.fullmatch(rf"({NAME})\s+({NAME})\s*\((.*)\)", decl, flags=re.S)
    if not m:
        raise HeaderError(f"not a prototype: {decl!r}")
    ret, name, args = m.group(1), m.group(2), m.group(3).strip()
    if ret not in RETURNS:
        raise HeaderError(f"{name}: return type {ret!r} is not one of {sorted(RETURNS, key=str)}")
    argtypes = []
    if args != "void":
        for i, arg in enumerate(a.strip() for a in args.split(",")):
            words, ((_, stars),) = _declarators(arg, f"{name} argument {i}")
            scalars = {k: SCALARS[k] for k in ("int64_t", "int", "float", "double")}
            argtypes.append(_type(words, stars, header, f"{name} argument {i}", scalars))
    return name, (RETURNS[ret], argtypes)


def parse(text: str) -> Header:
    header = Header()
    code = []
    for line in _strip_comments(text).splitlines():
        s = line.strip()
        if not s.startswith("#"):
            code.append(line)
            continue
        if m := re.fullmatch(rf"#\s*define\s+({NAME})\s+(-?\d+)", s):
            header.constants[m.group(1)] = int(m.group(2))
        elif not re.fullmatch(rf"#\s*(ifndef\s+{NAME}|define\s+{NAME}|endif|include\s+<[\w./]+>)", s):
            raise HeaderError(f"a preprocessor line this reader does not take: {s!r}")
    rest = " ".join(code)
    pos = 0
    pattern = re.compile(rf"\s*(typedef\s+struct\s*\{{(?P<body>[^{{}}]*)\}}\s*(?P<sname>{NAME})\s*;"
                         rf"|(?P<proto>[^;{{}}]+);)")
    while rest[pos:].strip():
        m = pattern.match(rest, pos)
        if not m:
            raise HeaderError(f"cannot read the header from here: {rest[pos:pos + 80].strip()!r}")
        if m.group("sname"):
            sname = m.group("sname")
            header.structs[sname] = _struct(m.group("body"), sname, header)
        else:
            name, sig = _function(" ".join(m.group("proto").split()), header)
            header.functions[name] = sig
        pos = m.end()
    return header

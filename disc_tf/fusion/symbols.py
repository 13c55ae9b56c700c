"""Symbols of dims and what is proven of them: each symbol's definition for the
host runner (an input dim, a constant, a checked broadcast of other symbols),
a union-find of proven equalities, and the checks the host runner makes.

Symbols are integers; constants are symbols too (one per value).
"""

from __future__ import annotations

import dataclasses
import math


class ShapeError(ValueError):
    """Shapes that can never be valid (e.g. broadcasting 3 with 4)."""


@dataclasses.dataclass
class SymDef:
    """How the host runner computes a symbol."""

    kind: str  # "arg" | "const" | "broadcast" | "expr" | "arith"
    arg: tuple[int, int] | None = None  # (argument, dim) for "arg"
    value: int | None = None  # for "const"
    components: list[int] | None = None  # for "broadcast" and "arith" (operands)
    scalar: HostScalar | None = None  # for "expr" (e.g. a reshape's -1 dim)
    #: for "arith": an ``arith`` op on index scalars ("addi", "floordivsi", ...) or
    #: "select_<predicate>" (components a, b, c, d: c if a <predicate> b else d)
    op: str | None = None

    def __str__(self) -> str:
        if self.kind == "arg":
            return f"arg{self.arg[0]}.dim{self.arg[1]}"
        if self.kind == "const":
            return str(self.value)
        if self.kind == "expr":
            return str(self.scalar)
        if self.kind == "arith":
            return f"{self.op}(" + ", ".join(f"s{c}" for c in self.components) + ")"
        return "broadcast(" + ", ".join(f"s{c}" for c in self.components) + ")"


@dataclasses.dataclass
class ShapeCheck:
    """A host-side check emitted before any kernel runs."""

    #: "broadcast" | "equal" | "expand" (operand dim i is 1 or result dim d) |
    #: "matmul" (lhs dim i equals rhs dim j for each pair in ``dims``) |
    #: "reshape" (element counts of the operand and ``result`` are equal) |
    #: "nonnegative" (every dim of ``result``, computed on the host, is >= 0) |
    #: "require" (``result`` = [a, b]: a <predicate> b holds, else ``message``)
    kind: str
    operands: list[list[int]]
    result: list[int]
    tf_node: str
    #: (operand dim, result dim) for "expand"; (lhs dim, rhs dim) for "matmul"
    dims: list[tuple[int, int]] | None = None
    #: "reshape" with a -1 entry: the product of the other entries, which must
    #: divide the operand's element count
    multiple_of: int | None = None
    #: for "require": the comparison ("sle", ...) and what fails if it does not hold
    predicate: str | None = None
    message: str | None = None

    def __str__(self) -> str:
        shapes = " vs ".join("[" + ", ".join(f"s{s}" for s in o) + "]"
                             for o in self.operands + ([self.result] if self.kind == "reshape" else []))
        return f"check {self.kind} {shapes} (TF op '{self.tf_node}')"


class SymbolTable:
    """Symbol definitions plus a union-find of proven equalities."""

    def __init__(self) -> None:
        self.defs: list[SymDef] = []
        self._parent: list[int] = []
        self._const_of_class: dict[int, int] = {}
        self._const_sym: dict[int, int] = {}

    def new(self, d: SymDef) -> int:
        """Defines a new symbol."""
        sym = len(self.defs)
        self.defs.append(d)
        self._parent.append(sym)
        if d.kind == "const":
            self._const_of_class[sym] = d.value
        return sym

    def const(self, value: int) -> int:
        """The symbol of constant ``value`` (interned)."""
        if value not in self._const_sym:
            self._const_sym[value] = self.new(SymDef("const", value=value))
        return self._const_sym[value]

    def find(self, sym: int) -> int:
        """The class representative of ``sym``."""
        while self._parent[sym] != sym:
            self._parent[sym] = self._parent[self._parent[sym]]
            sym = self._parent[sym]
        return sym

    def union(self, a: int, b: int) -> None:
        """Records that a and b are equal; raises ShapeError on 3 == 4."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        ca, cb = self._const_of_class.get(ra), self._const_of_class.get(rb)
        if ca is not None and cb is not None and ca != cb:
            raise ShapeError(f"dimension {ca} can never equal {cb}")
        # Keep the older symbol as representative: it is defined earlier.
        if rb < ra:
            ra, rb = rb, ra
        self._parent[rb] = ra
        const = ca if ca is not None else cb
        if const is not None:
            self._const_of_class[ra] = const

    def same(self, a: int, b: int) -> bool:
        """True if a == b is proven."""
        return self.find(a) == self.find(b)

    def constant_value(self, sym: int) -> int | None:
        """The value of ``sym`` if its class holds a constant."""
        return self._const_of_class.get(self.find(sym))

    def absorbed(self, big: int, small: int) -> bool:
        """True if ``small`` is proven to broadcast into ``big`` (no check needed)."""
        if self.same(big, small) or self.constant_value(small) == 1:
            return True
        stack = [big]
        seen = set()
        while stack:
            s = self.find(stack.pop())
            if s in seen:
                continue
            seen.add(s)
            if self.same(s, small):
                return True
            d = self.defs[s]
            if d.kind == "broadcast":
                stack.extend(d.components)
        return False

    def describe(self) -> str:
        """Each class with its members and definitions, one per line."""
        classes: dict[int, list[int]] = {}
        for s in range(len(self.defs)):
            classes.setdefault(self.find(s), []).append(s)
        lines = []
        for rep, members in classes.items():
            body = ", ".join(f"s{m} = {self.defs[m]}" for m in members)
            lines.append(f"class s{rep}: {body}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class HostScalar:
    """A value the host runner computes from dims: ``factor * prod(symbols) / divisor``
    (integer division; ``divisor`` > 0)."""

    symbols: tuple[int, ...]
    factor: int = 1
    divisor: int = 1

    def times(self, other: HostScalar) -> HostScalar:
        """The product of two host scalars (neither a quotient)."""
        if self.divisor != 1 or other.divisor != 1:
            raise ShapeError(f"product of quotients {self} and {other} is not supported")
        return HostScalar(self.symbols + other.symbols, self.factor * other.factor)

    def divided(self, other: HostScalar) -> HostScalar:
        """This scalar divided by a positive constant one (common factors cancelled)."""
        if other.symbols or other.divisor != 1 or other.factor <= 0 or self.divisor != 1:
            raise ShapeError(f"division of {self} by {other} is not supported")
        g = math.gcd(self.factor, other.factor) or 1
        return HostScalar(self.symbols, self.factor // g, other.factor // g)

    def __str__(self) -> str:
        parts = [str(self.factor)] if self.factor != 1 or not self.symbols else []
        text = " * ".join(parts + [f"s{s}" for s in self.symbols])
        return f"({text}) / {self.divisor}" if self.divisor != 1 else text


#: An affine form: ((symbol, coefficient), ...) sorted by symbol, and a constant.
Affine = tuple[tuple[tuple[int, int], ...], int]


class AffineForms:
    """Sums, differences and constant multiples of symbols as affine forms, so that
    two computations of one dim share a symbol: SAME padding of a 1x1 window computes
    ``max((d - 1) + 1 - d, 0)``, which is the constant 0, and its output dim
    ``d + 0 + 0``, which is ``d`` (its GEMM then spans the whole image, and what reads
    it is proven the same shape). Forms are taken over class representatives when a
    symbol is made; an equality proven later can only add matches, never undo one."""

    def __init__(self, syms: SymbolTable) -> None:
        self.syms = syms
        self._form: dict[int, Affine] = {}
        self._symbol: dict[Affine, int] = {}

    def form(self, sym: int) -> Affine:
        """The affine form of ``sym``: its own, a constant, or the symbol itself."""
        value = self.syms.constant_value(sym)
        if value is not None:
            return (), value
        for s in (sym, self.syms.find(sym)):
            if s in self._form:
                return self._form[s]
        sym = self.syms.find(sym)
        d = self.syms.defs[sym]
        if d.kind == "expr" and d.scalar.divisor == 1 and len(d.scalar.symbols) == 1:
            return ((self.syms.find(d.scalar.symbols[0]), d.scalar.factor),), 0
        return ((sym, 1),), 0

    @staticmethod
    def combine(a: Affine, b: Affine, scale_b: int) -> Affine:
        """``a + scale_b * b``."""
        terms = dict(a[0])
        for s, c in b[0]:
            terms[s] = terms.get(s, 0) + scale_b * c
        return tuple(sorted((s, c) for s, c in terms.items() if c != 0)), a[1] + scale_b * b[1]

    def of(self, op: str, parts: list[int]) -> Affine | None:
        """The form of ``op(parts)`` where it is affine (addi, subi, muli by a constant)."""
        if len(parts) != 2 or op not in ("addi", "subi", "muli"):
            return None
        fa, fb = (self.form(p) for p in parts)
        if op == "muli":
            if not fb[0]:
                return self.combine(((), 0), fa, fb[1])
            if not fa[0]:
                return self.combine(((), 0), fb, fa[1])
            return None
        return self.combine(fa, fb, 1 if op == "addi" else -1)

    def existing(self, form: Affine) -> int | None:
        """A symbol of ``form`` already made: a constant, a lone symbol, or a sum."""
        terms, const = form
        if not terms:
            return self.syms.const(const)
        if const == 0 and len(terms) == 1 and terms[0][1] == 1:
            return terms[0][0]
        return self._symbol.get(form)

    def record(self, sym: int, form: Affine) -> None:
        """``sym`` (just made) computes ``form``."""
        self._form[sym] = form
        self._symbol.setdefault(form, sym)

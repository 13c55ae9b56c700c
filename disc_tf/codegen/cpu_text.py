"""C++ text of plan values shared by the CPU (and CUDA) emitters: symbols,
products, comments, host scalars, accumulator types and GEMM stride forms."""

from __future__ import annotations

from disc_tf.fusion.plan import Buffer, FusionPlan


def sym(s: int, plan: FusionPlan) -> str:
    """C++ for symbol ``s``: its literal if constant, else its host variable."""
    d = plan.symbols[s]
    return str(d.value) if d.kind == "const" else f"s{s}"


def product(syms: list[int], plan: FusionPlan) -> str:
    """C++ product of symbols ("1" for none)."""
    return " * ".join(sym(s, plan) for s in syms) if syms else "1"


#: Reduction combiners the stitch kernels fold with ``disc_f32x8`` vectors (the
#: lanes keep the order of the scalar fold: lane l takes columns l, l + 8, ...).
VECTOR_COMBINERS = ("add", "multiply", "maximum", "minimum")


def accumulator_elem(elem: str) -> str:
    """Element type reductions accumulate in: f32 for f16/bf16 (rounded once at the end)."""
    return "f32" if elem in ("f16", "bf16") else elem


def comment(text: str) -> str:
    """``text`` made safe for a one-line C++ comment."""
    return text.replace("*/", "* /").replace("\n", " ")


def host_expr(h, plan: FusionPlan) -> str:
    """C++ for a host scalar: factor times a product of symbols (over a divisor)."""
    parts = [str(h.factor)] + [sym(s, plan) for s in h.symbols]
    text = " * ".join(parts)
    return f"({text}) / {h.divisor}" if h.divisor != 1 else text



def strided_gemm_exprs(f: dict, lhs: Buffer, rhs: Buffer, plan: FusionPlan) -> dict:
    """C++ expressions of a ``strided_gemm`` form: host lines defining outer, inner, m,
    n and kk, the leading dims and the (outer, inner) batch strides of A and B."""

    def stride(buf: Buffer, d: int) -> str:
        return product(buf.dims[d + 1:], plan)

    batch = f["batch"] + [None] * (2 - len(f["batch"]))
    sizes = [sym(lhs.dims[b[0]], plan) if b else "1" for b in batch]
    return {
        "lines": [f"    const int64_t outer = {sizes[0]}, inner = {sizes[1]};",
                  f"    const int64_t m = {sym(lhs.dims[f['m']], plan)};",
                  f"    const int64_t n = {sym(rhs.dims[f['n']], plan)};",
                  f"    const int64_t kk = {sym(lhs.dims[f['k_lhs']], plan)};"],
        "sa": [stride(lhs, b[0]) if b else "0" for b in batch],
        "sb": [stride(rhs, b[1]) if b else "0" for b in batch],
        "lda": stride(lhs, f["k_lhs"] if f["transpose_a"] else f["m"]),
        "ldb": stride(rhs, f["n"] if f["transpose_b"] else f["k_rhs"]),
    }

"""Host-runner lines of a run of GEMMs each reading the last one's result, as one
``sgemm_layers`` launch (RAL ABI 12; the plan: ``fusion/layer_chain.py``): the RAL
takes each block of rows through every layer in turn, each layer's epilogue on its
rows, a C the plan keeps in scratch never whole."""

from __future__ import annotations

from typing import TYPE_CHECKING

from disc_tf.codegen.cpu_column_epilogue import closure_lines, column_chain
from disc_tf.codegen.cpu_gemm import gemm_operands, scratch_block
from disc_tf.codegen.cpu_text import comment

if TYPE_CHECKING:
    from disc_tf.codegen.cpu_kernels import KernelEmitter


def layers_launch(em: KernelEmitter, buffer_ptr: dict[str, str],
                  layers: list[tuple[KernelEmitter, KernelEmitter | None]]) -> list[str]:
    """The launch of ``layers`` (each a GEMM's emitter and its epilogue's, or None), the
    first ``em``'s: A is the first GEMM's, each later one reads the last one's result."""
    plan = em.plan
    names = ", ".join(f"{g.k.name} ({comment(g.k.ops[0].tf_node)})" for g, _ in layers)
    g0 = gemm_operands(em)
    a = em.buf(em.k.inputs[0])
    lines = [f"  {{  // {names}: library GEMMs, each reading the last one's result, as one "
             "launch: every block of rows through each layer in turn",
             *g0["lines"],
             f"    disc_gemm_layer layers[{len(layers)}] = {{}};"]
    for p, (gemm, epilogue) in enumerate(layers):
        g = gemm_operands(gemm)
        assert g["ta"] == 0 and g["ldc"] == "n", f"{gemm.k.name}: not a plain GEMM"
        (_, c_name), = gemm.k.outputs
        rhs = gemm.buf(gemm.k.inputs[1])
        where = "only a block at a time, in scratch" if gemm.k.c_in_scratch else "in memory"
        lines += [
            f"    // layer {p}: {gemm.k.name} ({comment(gemm.k.ops[0].tf_node)}), C {where}"
            + (f"; {epilogue.k.name} ({comment(', '.join(epilogue.k.tf_ops))}) on its rows"
               if epilogue is not None else ""),
            f"    const int64_t n_{p} = {g['n']};",
            f"    layers[{p}].n = n_{p};",
            f"    layers[{p}].b = {buffer_ptr[rhs.name]};",
            f"    layers[{p}].ldb = {g['ldb']};",
            f"    layers[{p}].transpose_b = {g['tb']};",
            f"    layers[{p}].c = {'nullptr' if gemm.k.c_in_scratch else buffer_ptr[c_name]};",
        ]
        if epilogue is not None:
            lines += _layer_epilogue(p, gemm, epilogue, buffer_ptr, c_name)
        if p + 1 < len(layers):  # the next layer's A, where not in C's place
            a_next = layers[p + 1][0].k.inputs[0].buffer
            if plan.memory(a_next) != plan.memory(c_name):
                lines.append(f"    layers[{p}].result = {buffer_ptr[a_next]};  // "
                             f"{epilogue.k.name if epilogue else gemm.k.name}'s result")
    return lines + [
        "    if (m > 0) {",
        f"      ral->sgemm_layers(ral, m, kk, {buffer_ptr[a.name]}, {g0['lda']}, {len(layers)}, "
        "layers);",
        "    }",
        "  }",
    ]


def _layer_epilogue(p: int, gemm: KernelEmitter, epilogue: KernelEmitter,
                    buffer_ptr: dict[str, str], c_name: str) -> list[str]:
    """Lines setting layer ``p``'s epilogue: its column steps where it is a chain of them
    (``cpu_column_epilogue.py``), else the kernel on the rows where they lie (``rows``)."""
    plan, e = epilogue.plan, epilogue.k
    struct = epilogue.epilogue_struct
    holder = f"Layer{p}"
    lines = [
        f"    const {epilogue.args} args_{p} = [&] {{",
        *("  " + line for line in epilogue.launch_args(buffer_ptr)),
        "      return k;",
        "    }();",
        f"    const int64_t inner_rows_{p} = args_{p}.dims[{epilogue.rank - 1}];",
        f"    const {struct} epi_{p}{{&args_{p}, m, inner_rows_{p} > 0 ? n_{p} / inner_rows_{p} "
        ": 1};",
        f"    struct {holder} {{",
        "      disc_gemm_epilogue_fn epilogue;",
        "      void* closure;",
        *scratch_block(epilogue, c_name, holder, in_scratch=gemm.k.c_in_scratch),
        "    };",
        f"    const {holder} layer_{p}{{&{epilogue.fn}_epilogue, "
        f"const_cast<{struct}*>(&epi_{p})}};",
    ]
    rows = (f"    layers[{p}].rows = &{holder}::block;",
            f"    layers[{p}].closure = const_cast<{holder}*>(&layer_{p});")
    chain = column_chain(plan, gemm.k, e)
    if chain is None:
        lines += rows
    else:
        lines += closure_lines(chain, "m", f"n_{p}", suffix=f"_{p}")
        lines += [f"    if (on_registers_{p}) {{",
                  f"      layers[{p}].columns = &col_{p};",
                  "    } else {",
                  *("  " + line for line in rows),
                  "    }"]
    return lines

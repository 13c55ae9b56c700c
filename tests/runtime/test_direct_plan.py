"""direct_plan on hand-written FunctionDefs: what a direct call runs, and what it refuses."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tensorflow.core.framework import function_pb2, types_pb2

from disc_tf.direct_plan import NotDirect, Source, plan_function

_CLUSTER_ATTRS = """
  attr { key: "Tin" value { list { type: DT_FLOAT type: DT_FLOAT } } }
  attr { key: "Tout" value { list { type: DT_FLOAT type: DT_FLOAT } } }
  attr { key: "output_shapes" value { list { shape { dim { size: -1 } dim { size: 4 } }
                                              shape { unknown_rank: true } } } }
  attr { key: "artifact" value { s: "%s" } }
  attr { key: "artifact_sha256" value { s: "abc" } }
  attr { key: "fallback" value { func { name: "fallback_fn" } } }
  attr { key: "cluster_name" value { s: "%s" } }
  attr { key: "num_kernels" value { i: 3 } }
  attr { key: "constant_inputs" value { list { i: 1 } } }
  attr { key: "_internal" value { s: "dropped" } }
"""


def _fdef(text: str) -> function_pb2.FunctionDef:
    return text_format.Parse(text, function_pb2.FunctionDef())


def _cluster(name: str, inputs: list[str], artifact: str = "bytes") -> str:
    ins = "".join(f' input: "{i}"' for i in inputs)
    return f'node_def {{ name: "{name}" op: "DiscCluster"{ins} {_CLUSTER_ATTRS % (artifact, name)} }}'


_INNER = _fdef(f"""
signature {{ name: "inner"
  input_arg {{ name: "x" type: DT_FLOAT }} input_arg {{ name: "h" type: DT_RESOURCE }}
  output_arg {{ name: "out" type: DT_FLOAT }} output_arg {{ name: "out2" type: DT_FLOAT }} }}
node_def {{ name: "read" op: "ReadVariableOp" input: "h" attr {{ key: "dtype" value {{ type: DT_FLOAT }} }} }}
{_cluster("c0", ["x", "read:value:0", "^read"])}
{_cluster("c1", ["c0:outputs:1", "read:value:0"])}
node_def {{ name: "id" op: "Identity" input: "c1:outputs:0" }}
node_def {{ name: "noop" op: "NoOp" input: "^c1" }}
ret {{ key: "out" value: "id:output:0" }}
ret {{ key: "out2" value: "c0:outputs:0" }}
""")

_OUTER = _fdef("""
signature { name: "outer"
  input_arg { name: "x" type: DT_FLOAT } input_arg { name: "h" type: DT_RESOURCE }
  output_arg { name: "y" type: DT_FLOAT } output_arg { name: "z" type: DT_FLOAT }
  output_arg { name: "passthrough" type: DT_FLOAT } }
node_def { name: "call" op: "StatefulPartitionedCall" input: "x" input: "h"
  attr { key: "f" value { func { name: "inner" } } } }
ret { key: "y" value: "call:output:1" }
ret { key: "z" value: "call:output:0" }
ret { key: "passthrough" value: "x" }
""")


def _lookup(*fdefs: function_pb2.FunctionDef):
    table = {f.signature.name: f for f in fdefs}
    return table.get


def test_nested_call_and_chained_clusters():
    plan = plan_function(_OUTER, 1, [False, True], _lookup(_INNER))
    assert [s.cluster_name for s in plan.steps] == ["c0", "c1"]
    c0, c1 = plan.steps
    assert c0.inputs == (Source("arg", 0), Source("variable", 0))
    assert c1.inputs == (Source("step", 0, 1), Source("variable", 0))
    assert plan.outputs == (Source("step", 0, 0), Source("step", 1, 0), Source("arg", 0))
    attrs = dict(c0.attrs)
    # A variable input is passed as its handle; the artifact travels outside the attrs.
    assert attrs["Tin"] == [types_pb2.DT_FLOAT, types_pb2.DT_RESOURCE]
    assert attrs["output_shapes"] == [[None, 4], None]
    assert attrs["fallback"] == "fallback_fn" and attrs["constant_inputs"] == [1]
    assert "artifact" not in attrs and "_internal" not in attrs
    assert c0.artifact == b"bytes" and c0.num_kernels == 3 and c0.num_outputs == 2
    assert "step1: c1" in plan.describe()


def test_an_assignment_anywhere_in_the_body_refuses_the_plan():
    inner = function_pb2.FunctionDef()
    inner.CopyFrom(_INNER)
    node = inner.node_def.add(name="assign", op="AssignVariableOp")
    node.input.extend(["h", "c0:outputs:0"])
    with pytest.raises(NotDirect, match="AssignVariableOp"):
        plan_function(_OUTER, 1, [False, True], _lookup(inner))


def test_unknown_callee_and_non_resource_reads_are_refused():
    with pytest.raises(NotDirect, match="not registered"):
        plan_function(_OUTER, 1, [False, True], _lookup())
    with pytest.raises(NotDirect, match="not a captured handle"):
        plan_function(_OUTER, 2, [False, True], _lookup(_INNER))  # the handle is an argument


def test_a_body_without_clusters_is_refused():
    fdef = _fdef("""
    signature { name: "identity" input_arg { name: "x" type: DT_FLOAT }
                output_arg { name: "y" type: DT_FLOAT } }
    node_def { name: "id" op: "Identity" input: "x" }
    ret { key: "y" value: "id:output:0" }
    """)
    with pytest.raises(NotDirect, match="no DiscCluster"):
        plan_function(fdef, 1, [False], _lookup())


def test_stateless_ops_outside_clusters_are_eager_steps_and_consts_values():
    fdef = _fdef(f"""
    signature {{ name: "mixed"
      input_arg {{ name: "x" type: DT_FLOAT }} input_arg {{ name: "w" type: DT_FLOAT }}
      output_arg {{ name: "half" type: DT_FLOAT }} output_arg {{ name: "idx" type: DT_INT32 }} }}
    {_cluster("c0", ["x", "w"])}
    node_def {{ name: "axis" op: "Const" attr {{ key: "dtype" value {{ type: DT_INT32 }} }}
      attr {{ key: "value" value {{ tensor {{ dtype: DT_INT32 tensor_shape {{}} int_val: 1 }} }} }} }}
    node_def {{ name: "split" op: "Split" input: "axis:output:0" input: "c0:outputs:0"
      attr {{ key: "num_split" value {{ i: 2 }} }} attr {{ key: "T" value {{ type: DT_FLOAT }} }} }}
    node_def {{ name: "flat" op: "Reshape" input: "c0:outputs:1" input: "axis:output:0"
      attr {{ key: "T" value {{ type: DT_FLOAT }} }} }}
    node_def {{ name: "uniq" op: "Unique" input: "flat:output:0"
      attr {{ key: "T" value {{ type: DT_FLOAT }} }} }}
    ret {{ key: "half" value: "split:output:1" }}
    ret {{ key: "idx" value: "uniq:idx:0" }}
    """)
    plan = plan_function(fdef, 2, [False, False], _lookup())
    assert [s.op for s in plan.steps] == ["DiscCluster", "Split", "Reshape", "Unique"]
    split, reshape, unique = plan.steps[1:]
    assert split.num_outputs == 2 and unique.num_outputs == 2
    assert split.inputs == (Source("const", 0), Source("step", 0, 0))
    assert reshape.inputs == (Source("step", 0, 1), Source("const", 0))  # one const, reused
    assert ("out_idx", types_pb2.DT_INT32) in unique.attrs  # the stripped default, filled in
    assert plan.outputs == (Source("step", 1, 1), Source("step", 3, 1))
    assert len(plan.constants) == 1 and int(plan.constants[0]) == 1
    assert "eager Split (split)" in plan.describe() and "const0: int32[]" in plan.describe()


def test_ops_with_state_or_functions_outside_clusters_are_refused():
    # A random op has state; For calls a function but is not control flow a plan runs;
    # an If whose branch is not a registered function cannot run as an eager op.
    for op, extra in (("RandomUniform", 'attr { key: "dtype" value { type: DT_FLOAT } }'),
                      ("For", 'attr { key: "body" value { func { name: "f" } } }'),
                      ("If", 'attr { key: "then_branch" value { func { name: "f" } } }')):
        fdef = _fdef(f"""
        signature {{ name: "bad" input_arg {{ name: "x" type: DT_FLOAT }}
                     output_arg {{ name: "y" type: DT_FLOAT }} }}
        {_cluster("c0", ["x", "x"])}
        node_def {{ name: "odd" op: "{op}" input: "c0:outputs:0" {extra} }}
        ret {{ key: "y" value: "odd:output:0" }}
        """)
        with pytest.raises(NotDirect, match="has state|calls a function|is not registered"):
            plan_function(fdef, 1, [False], _lookup())

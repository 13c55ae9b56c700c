"""Builds ClusterSpecs from small tf.functions, for stage-level tests."""

from __future__ import annotations

import tensorflow as tf

from disc_tf.cluster import clustering, rewrite
from disc_tf.cluster.graph_view import view_of_graph_def


def cluster_of(fn, *specs: tf.TensorSpec, min_cluster_size: int = 1) -> rewrite.ClusterSpec:
    """The single cluster disc_tf carves out of ``fn`` traced at ``specs``."""
    concrete = tf.function(fn, input_signature=list(specs)).get_concrete_function()
    graph_def = concrete.graph.as_graph_def()
    view = view_of_graph_def(graph_def, graph_def.library, concrete.graph)
    protected = frozenset(t.op.name for t in list(concrete.inputs) + list(concrete.outputs))
    result = clustering.find_clusters(view, min_cluster_size=min_cluster_size,
                                      protected=protected)
    assert len(result.clusters) == 1, result
    fetched = frozenset(t.name for t in concrete.outputs)
    producers = {t.name.split(":")[0] for t in concrete.outputs}
    fetched |= {t.name for n in result.clusters[0] if n in producers
                for t in view.nodes[n].outputs}
    return rewrite.extract_cluster(view, result.clusters[0], "c0", fetched)


def dyn(rank: int, dtype: tf.DType = tf.float32) -> tf.TensorSpec:
    """A TensorSpec of ``rank`` with every dim dynamic."""
    return tf.TensorSpec([None] * rank, dtype)

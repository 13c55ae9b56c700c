"""A direct call's DiscCluster step as a DiscCall: its attributes recorded once, by number.

TF's eager runtime converts, copies and hashes every attribute of an op on each
execution, and a DiscCluster node carries a dozen: on a 2-core AVX2 machine an op
with those attributes and a kernel that does nothing took 31 us an execution, one
with four 17 us. ``as_call`` records a step's attributes with DiscClusterRegister
under a number of this process (one number for the same attributes) and returns the
step as a DiscCall of its input and output types, its fallback function (an eager
op's function library holds only the functions its attributes name) and that number
(``cc/kernels/disc_call_op.cc``). Its kernel runs the recorded node's DiscCluster
kernel: results, errors, fallbacks and counters are the DiscCluster op's.
"""

from __future__ import annotations

import itertools
import logging
import threading

import tensorflow as tf
from tensorflow.python.eager import context, execute

logger = logging.getLogger("disc_tf.direct")

_ids = itertools.count(1)
_lock = threading.Lock()
#: the number recorded for each step's attributes (their repr): steps of the same
#: attributes (a model's __call__ and its signature, the same model loaded twice) share
#: one number, so one kernel, as they shared one DiscCluster kernel
_recorded: dict[str, int] = {}


def as_call(attrs: tuple) -> tuple[str, tuple]:
    """The op and attributes that run a DiscCluster step of ``attrs`` (name, value,
    name, value...): DiscCall and its types, fallback function and number, once the
    attributes are recorded; DiscCluster and ``attrs`` themselves when they cannot be."""
    named = dict(zip(attrs[::2], attrs[1::2]))
    key = repr(attrs)
    with _lock:
        call_id = _recorded.get(key)
        if call_id is None:
            call_id = next(_ids)
            try:
                execute.quick_execute("DiscClusterRegister", 0, [], attrs + ("id", call_id),
                                      context.context())
            except (tf.errors.OpError, TypeError, ValueError) as e:
                logger.info("disc_tf.load: cluster %s runs as DiscCluster: %s",
                            named.get("cluster_name"), e)
                return "DiscCluster", attrs
            _recorded[key] = call_id
    return "DiscCall", ("Tin", named["Tin"], "Tout", named["Tout"], "id", call_id,
                        "fallback", named["fallback"])


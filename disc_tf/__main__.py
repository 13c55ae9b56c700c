"""``python -m disc_tf``: the ``disc-tf`` command line.

``compile-graph`` is the internal command the graph pass of a host without
Python runs (``disc_tf.graph_service``); everything else is ``disc_tf.cli``.
"""

import sys

if sys.argv[1:2] == ["compile-graph"]:
    from disc_tf.graph_service import main as _compile_graph

    raise SystemExit(_compile_graph(sys.argv[2:]))

from disc_tf.cli import main  # noqa: E402

raise SystemExit(main())

"""``python -m disc_tf``: the ``disc-tf`` command line."""

from disc_tf.cli import main

raise SystemExit(main())

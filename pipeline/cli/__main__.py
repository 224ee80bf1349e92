"""``python -m pipeline.cli ...``: the ``notify`` command."""

import sys

from pipeline.cli.parser import main

sys.exit(main())

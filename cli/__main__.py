"""``python -m svc_cli``: the ``svc`` command."""

import sys

from svc_cli import main

sys.exit(main())

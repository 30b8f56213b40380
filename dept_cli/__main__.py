"""``python -m dept_cli``: the ``dept`` command where its script is not on the PATH."""

from dept_cli.main import main

raise SystemExit(main())

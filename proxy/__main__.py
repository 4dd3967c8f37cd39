"""`python -m proxy` runs the `context-guard` command."""

from proxy.cli import main

raise SystemExit(main())

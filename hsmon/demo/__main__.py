"""`python -m hsmon.demo`."""

from hsmon.demo.cli import main

raise SystemExit(main())

from hsmon.cli import main

raise SystemExit(main())

from loops_cookbook.cli import main

raise SystemExit(main())

from kmsbench.cli import main

raise SystemExit(main())

from mars.cli import main

raise SystemExit(main())

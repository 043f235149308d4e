from nvdaemon.cli import main

raise SystemExit(main())

from sidecar.commands.cli import main

raise SystemExit(main())

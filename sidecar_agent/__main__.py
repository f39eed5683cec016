from sidecar_agent.cli import main

raise SystemExit(main())

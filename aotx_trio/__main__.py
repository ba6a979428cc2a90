from aotx_trio.cli import main

raise SystemExit(main())

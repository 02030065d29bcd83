from pg_task_py.cli import main

raise SystemExit(main())

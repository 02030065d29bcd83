from pg_task_py.command import main

raise SystemExit(main())

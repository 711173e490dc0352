from assisted_backends.train_draft.cli import main

raise SystemExit(main())

import sys

from assisted_backends.cli.main import main

sys.exit(main())

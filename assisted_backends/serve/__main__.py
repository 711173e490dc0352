import sys

from assisted_backends.serve.cli import main

sys.exit(main())

import sys

from pelab.report.cli import main

sys.exit(main())

# PYTHON_ARGCOMPLETE_OK
import sys

from driver.cli import main

sys.exit(main())

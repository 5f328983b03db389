import sys

from headwater.cli.entry import main

sys.exit(main())

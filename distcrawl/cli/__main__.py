import sys

from distcrawl.cli import main

sys.exit(main())

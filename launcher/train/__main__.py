import sys

from launcher.train.loop import main

sys.exit(main())

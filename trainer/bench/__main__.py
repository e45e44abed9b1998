import sys

from trainer.bench import main

sys.exit(main())

"""``python -m nli.report SWEEP_DIR [RUN_DIR] [--out DIR]``: a sweep's report (nli/sweep/report.py);
``python -m nli.report compare RUN_A RUN_B``: two runs on the same eval examples (nli/sweep/compare.py)."""

import sys

from nli.sweep.report import main

if __name__ == "__main__":
    sys.exit(main())

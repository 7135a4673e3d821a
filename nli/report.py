"""``python -m nli.report SWEEP_DIR [RUN_DIR] [--out DIR]``: a sweep's report (nli/sweep/report.py);
``python -m nli.report compare RUN_A RUN_B``: two runs on the same eval examples (nli/sweep/compare.py);
``python -m nli.report submission DIR...``: GLUE's submission zip from runs' test predictions
(nli/sweep/leaderboard.py)."""

import sys

from nli.sweep import leaderboard
from nli.sweep.report import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(leaderboard.main(argv[1:]) if argv[:1] == [leaderboard.COMMAND] else main(argv))

"""``python -m nli.cloud attach|cancel|logs SWEEP``: a Vertex AI sweep found again (nli/sweep/vertex.py)."""

import sys

from nli.sweep.vertex import main

if __name__ == "__main__":
    sys.exit(main())

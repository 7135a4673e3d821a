"""``python -m nli ...`` is ``python train.py ...`` (Vertex AI's Python-package jobs run a module)."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parents[1] / "train.py"), run_name="__main__")

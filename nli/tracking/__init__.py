"""Where training metrics go besides the log: W&B, TensorBoard, CSV, several at once, each a class a config
names (``logger.<name>._target_: nli.tracking.CsvTracker``); their files copied to a bucket."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "loggers": ["CsvTracker", "RunInfo", "TensorBoardTracker", "Tracker", "Trackers", "WandbTracker", "wandb_choices"],
}, ["loggers"])

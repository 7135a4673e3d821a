"""Where and how a run computes: the device and its precision, the CPU's threads, data parallelism,
PyTorch/XLA, signals, what the platform tells the run (local, torchrun, Slurm, Vertex AI), and the
provenance of its numbers."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "context": ["RunContext", "console_log", "local"],
    "device": ["Compute", "PeakMemory", "cpu_kernels", "cpu_native_bf16"],
    "distributed": ["World", "keeps_gradients", "no_sync", "shard"],
    "signals": ["Interrupted", "Preempted", "StopRequest", "end_done", "end_promptly", "interruption",
                "relay_to_threads", "shelter_worker", "end_workers_at_exit", "workers_forking", "started",
                "stop_while_starting", "stopped_starting", "hold_ctrl_c", "take_held", "INTERRUPTED", "exit_now"],
    "xla": ["NO_DEVICE", "runtime"],
}, ["cpu", "device", "distributed", "platform", "provenance", "xla"])

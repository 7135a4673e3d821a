"""Where and how a run computes: the device and its precision, the CPU's threads, data parallelism,
PyTorch/XLA, signals, what the platform tells the run (local, torchrun, Slurm, Vertex AI), and the
provenance of its numbers.

- ``device``: the device, precision and autocast, checked against the hardware
- ``cpu``: the CPU a run shares: its thread count, and glibc's heap
- ``distributed``: data parallelism in plain torch.distributed
- ``xla``: PyTorch/XLA: device, processes and collectives, compile counts
- ``signals``: SIGTERM and Ctrl-C as a stop at the next step
- ``context``: what a run is told besides its config: where it writes, its name, its process
- ``provenance``: the code, libraries, machine and command behind a run's numbers
- ``platform/``: local, torchrun, submitit/Slurm, Vertex AI"""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "context": ["RunContext", "local"],
    "device": ["Compute", "PeakMemory", "cpu_kernels", "cpu_native_bf16"],
    "distributed": ["World", "no_sync", "shard"],
    "signals": ["Interrupted", "Preempted", "StopRequest", "interruption", "relay_to_threads"],
    "xla": ["NO_DEVICE", "runtime"],
}, ["cpu", "device", "distributed", "platform", "provenance", "xla"])

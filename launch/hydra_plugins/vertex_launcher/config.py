"""The typed settings of the Vertex AI launcher (``hydra.launcher.*`` on the command line).

Stored in Hydra's ConfigStore as ``hydra/launcher=vertex_base``: the plugin's own defaults. This project's
``conf/hydra/launcher/vertex.yaml`` extends it with ours (and a user's ``conf/local/vertex.yaml``); a
config file may not share a ConfigStore node's name (Hydra would match it to the node as its schema, a
deprecated behaviour that warns on every run), so the node has a name of its own."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from . import _gcloud


class Packaging(Enum):
    container = "container"  # image_uri, whose entry point runs the app (the project's Dockerfile)
    python_package = "python_package"  # a prebuilt Vertex image + this project's sdist, `python -m <module>`


class Strategy(Enum):
    STANDARD = "STANDARD"  # on-demand machines
    SPOT = "SPOT"  # cheaper, preemptible: jobs resume from their checkpoints when restarted
    FLEX_START = "FLEX_START"  # Dynamic Workload Scheduler: waits for scarce GPUs, then runs


@dataclass
class Price:
    """What Vertex AI charges for one machine, or one accelerator, of a custom training job."""

    on_demand: Optional[float] = None  # USD per hour; null: none known (the estimate says which to give)
    spot: Optional[float] = None  # USD per hour on Spot VMs (strategy=SPOT); null: none known


@dataclass
class Prices:
    """The price table the sweep's estimates come from (conf/hydra/launcher/prices/): a job pays, on each of
    its machines, the machine type's price and each accelerator's. Estimates, not a bill."""

    region: str = "us-central1"  # the region whose prices these are
    read_on: Optional[str] = None  # the date they were read (YYYY-MM-DD)
    machines: Dict[str, Price] = field(default_factory=dict)  # machine type -> its price per machine
    accelerators: Dict[str, Price] = field(default_factory=dict)  # accelerator type -> its price per accelerator


@dataclass
class VertexLauncherConf:
    _target_: str = "hydra_plugins.vertex_launcher.vertex_launcher.VertexLauncher"

    project: Optional[str] = "${oc.env:GOOGLE_CLOUD_PROJECT,null}"  # Google Cloud project id
    region: str = "us-central1"  # Vertex AI region the jobs run in
    staging_bucket: Optional[str] = None  # gs://bucket[/prefix]: every job writes to <it>/<sweep>/<job number>
    packaging: Packaging = Packaging.container  # how the code reaches the machine
    image_uri: Optional[str] = None  # container: the training image (Artifact Registry URI)
    # container: build the image from source_dir with Cloud Build (its Dockerfile and cloudbuild.yaml), tagged
    # src-<digest of the Docker build context>, unless that image exists already; in place of image_uri.
    build: bool = False
    # build: where the image goes, REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE; null: <region>-docker.pkg.dev/
    # <project>/nli/train (cloudbuild.yaml's default); the repository must exist (docs/vertex.md, Set-up)
    build_repository: Optional[str] = None
    # build: more of cloudbuild.yaml's substitutions (_TARGET: tpu, _REDUCTION_SERVER: "1"); part of the digest
    build_substitutions: Dict[str, str] = field(default_factory=dict)
    # python_package: a prebuilt Vertex AI PyTorch image, and the module run as `python -m <module>`
    # null: Vertex's prebuilt image of the torch the project pins (_images.py), where there is one
    executor_image_uri: Optional[str] = None
    # python_package: an executor_image_uri whose torch is not the pinned one, on purpose (pip replaces it)
    replace_image_torch: bool = False
    python_module: str = "nli.node"  # one process per GPU on every node (torchrun), or the run itself
    source_dir: str = "."  # the project whose sdist (python_package) or image (build) is built, from the launch dir
    machine_type: str = "n1-standard-8"  # jobs of an app without an hw group (this one refuses hw=auto: _checks)
    # Reduction Server (faster all-reduce for multi-node GPU jobs): replicas, their machine and image
    reduction_server_replicas: int = 0  # 0: none; enough to match the GPU machines' network bandwidth
    reduction_server_machine_type: str = "n1-highcpu-16"
    reduction_server_image_uri: str = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
    service_account: Optional[str] = None  # the jobs' identity (email); null: the project's default
    # A Vertex AI TensorBoard (projects/P/locations/REGION/tensorboards/ID) that shows each job's events
    # as they are written to AIP_TENSORBOARD_LOG_DIR; Vertex requires service_account with it.
    tensorboard: Optional[str] = None
    network: Optional[str] = None  # VPC peering network (projects/<number>/global/networks/<name>)
    labels: Dict[str, str] = field(default_factory=dict)  # added to the labels derived from the sweep
    strategy: Strategy = Strategy.STANDARD  # scheduling: STANDARD, SPOT or FLEX_START
    timeout: Optional[int] = None  # seconds a job may run; null: Vertex's default of 7 days
    restart_job_on_worker_restart: bool = False  # restart the whole job when a worker restarts
    max_concurrent_jobs: int = 16  # jobs in flight at once; the others wait their turn
    wait: bool = True  # true: wait and collect results; false: submit and return
    poll_interval: float = 30.0  # seconds between status polls; grows to 10x while nothing changes
    failed_log_lines: int = 20  # a failed job's last lines of output, printed from Cloud Logging; 0: none
    stream_logs: bool = False  # print the jobs' output as it comes (from Cloud Logging), each line after its job
    dry_run: bool = False  # write each CustomJob request as JSON into the sweep directory; submit nothing
    sweep_name: Optional[str] = None  # names the sweep's jobs and output folder; null: <job name>-<time>
    env: Dict[str, str] = field(default_factory=dict)  # plain variables for the jobs (readable by viewers)
    # Variables delivered by reference, never by value: NAME -> projects/P/secrets/S/versions/V.
    # The job reads them from Secret Manager at start, with its service account.
    secrets: Dict[str, str] = field(default_factory=dict)
    # Another endpoint (an emulator): http://host:port talks REST with anonymous credentials.
    api_endpoint: Optional[str] = None
    # What the jobs' machines cost, for the estimate a sweep prints as it starts and each job's cost_usd
    prices: Prices = field(default_factory=Prices)

    def python_package(self) -> bool:
        """packaging=python_package. Compared by name: Hydra's plugin discovery executes this module again
        in a process that already imported it, so `Packaging` may be a newer class than the value's."""
        return self.packaging.name == Packaging.python_package.name


ConfigStore.instance().store(group="hydra/launcher", name="vertex_base", node=VertexLauncherConf,
                             provider="vertex_launcher")
# ${gcloud:core/project,null}: what the user told gcloud (conf/hydra/launcher/vertex.yaml). Replaced, not
# added: plugin discovery may execute this module a second time in one process.
OmegaConf.register_new_resolver("gcloud", _gcloud.resolve, replace=True)

# The training image for Vertex AI custom-container jobs (and any Docker host with GPUs), and its
# Cloud TPU variant:
#
#     docker build -t nli .                             # the CUDA image: the last stage, `cuda`
#     docker run --gpus all nli task=rte hw=8xa100      # torchrun: python -m nli task=rte hw=8xa100 on each GPU
#     docker build --target tpu -t nli-tpu .            # PyTorch/XLA for the TPU presets (hw=tpu-v5e-8, ...)
#
# The container's arguments are Hydra overrides; Vertex AI passes a job's overrides as the args.
#
# The base is PyTorch's official runtime image of the pinned torch (2.13.0), CUDA 12.6 build. Its
# torch, 2.13.0+cu126, satisfies the project's `torch==2.13.0` pin, so pip keeps it instead of
# pulling PyPI's Linux wheel: gigabytes more, and built for CUDA 13, which needs a 580 driver and
# no longer runs on the V100. CUDA 12.6 runs every GPU of conf/hw/ that torch 2.13 supports (T4,
# V100, A100, H100; no current torch runs on the K80) on any CUDA 12 driver. For Blackwell GPUs,
# build on a `-cuda12.8-` or `-cuda13.0-` tag of the same torch:
#     docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime -t nli .
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime
# The TPU image's base: plain Python 3.11 (Debian), for which torch-xla and libtpu publish wheels.
ARG TPU_BASE_IMAGE=python:3.11-slim-bookworm

# ------------------------------------------------------------------------------------ requirements
# What each image installs, computed once from pyproject.toml and requirements/tpu.txt alone (read
# with tomllib: Python 3.11), so that editing the source or the README reuses the install layers:
#   cuda.txt  the project's pins and its vertex extra;
#   tpu.txt   the same less the torch pin, plus requirements/tpu.txt's torch and torch-xla, the
#             latter with its `tpu` extra: libtpu, the TPU runtime that PJRT loads.
# It runs on the small TPU base, which the CUDA build pulls for this alone.
FROM ${TPU_BASE_IMAGE} AS requirements
WORKDIR /requirements
COPY pyproject.toml ./
COPY requirements/tpu.txt requirements/
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
vertex = p['optional-dependencies']['vertex']; \
deps = [d for d in p['dependencies'] if not d.replace(' ', '').startswith('torch==')]; \
xla = [line.split('#')[0].strip().replace('torch-xla==', 'torch-xla[tpu]==') for line in open('requirements/tpu.txt')]; \
open('cuda.txt', 'w').write('\n'.join(p['dependencies'] + vertex) + '\n'); \
open('tpu.txt', 'w').write('\n'.join([pin for pin in xla if pin] + deps + vertex) + '\n')"

# --------------------------------------------------------------------------------------------- tpu
# The Cloud TPU image: docker build --target tpu -t nli-tpu . The same project, user, directory and
# entry point as the CUDA image below (see there for why each is so); PJRT_DEVICE=TPU points
# PyTorch/XLA at the host's TPU. torch 2.9's PyPI wheel is its CUDA build (gigabytes of NVIDIA
# libraries a TPU host never loads): it is the torch the XLA tests ran with (.ci/xla-env).
FROM ${TPU_BASE_IMAGE} AS tpu
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HYDRA_FULL_ERROR=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PJRT_DEVICE=TPU
RUN useradd --create-home --user-group nli && install -d -o nli -g nli /app
WORKDIR /app
COPY --from=requirements /requirements/tpu.txt /tmp/requirements.txt
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY pyproject.toml ./
COPY conf/ conf/
COPY nli/ nli/
COPY launch/ launch/
COPY train.py README.md ./
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install --no-deps . && rm -rf build nli_glue.egg-info
USER nli
ENTRYPOINT ["python", "-m", "nli.node"]

# -------------------------------------------------------------------------------------------- cuda
# The default image (the last stage): `docker build .` builds it.
FROM ${BASE_IMAGE} AS cuda

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HYDRA_FULL_ERROR=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Unbuffered: Cloud Logging shows each line as the run writes it, not when a buffer fills or the
# job dies. HYDRA_FULL_ERROR: an error in a remote job, which cannot be rerun at a keystroke, logs
# its whole traceback, still ending with the message.

# Some bases ship `python3` only; the ENTRYPOINT calls `python`.
RUN command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python

# Reduction Server (hydra.launcher.reduction_server_replicas > 0) reaches the GPU workers through
# Google's NCCL plugin, which must be in their image. It comes from Google's apt repository, so it
# is built in only when asked for:
#     docker build --build-arg REDUCTION_SERVER=1 -t nli-rs .
ARG REDUCTION_SERVER=0
RUN if [ "$REDUCTION_SERVER" = 1 ]; then \
      apt-get update && apt-get install -y --no-install-recommends ca-certificates curl gnupg \
      && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg \
         | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
      && echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt google-fast-socket main" \
         > /etc/apt/sources.list.d/google-fast-socket.list \
      && apt-get update && apt-get install -y --no-install-recommends google-reduction-server \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# An unprivileged user that owns /app, where the Hydra run directories (outputs/, multirun/) go
# unless output_dir or the platform (a Vertex AI job's directories) points elsewhere; its home holds the
# Hugging Face caches.
# No fixed uid: Ubuntu 24.04 bases already have a user 1000.
RUN useradd --create-home --user-group nli && install -d -o nli -g nli /app
WORKDIR /app

# Dependencies first (the requirements stage's list), so that editing the source or the README
# reuses this layer. PIP_BREAK_SYSTEM_PACKAGES: the image is the environment; a base whose Python is
# marked externally managed (PEP 668) would refuse to install into it otherwise.
COPY --from=requirements /requirements/cuda.txt /tmp/requirements.txt
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt

# The source, then the project itself (its dependencies are in place: --no-deps). Installing it
# registers the Vertex launcher plugin and `nli.conf` for `python -m nli`.
COPY pyproject.toml ./
COPY conf/ conf/
COPY nli/ nli/
COPY launch/ launch/
COPY train.py README.md ./
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install --no-deps . && rm -rf build nli_glue.egg-info

USER nli
ENTRYPOINT ["python", "-m", "nli.node"]

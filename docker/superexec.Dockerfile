# SuperExec: runs the project's ServerApp (beside the SuperLink) or ClientApps (beside each
# SuperNode). The app bundle (FAB) arrives at run time; its dependencies must already be
# here, because runtime installation stays off. BASE_IMAGE: Flower's own image by default,
# or any image with its layout and flwr (flwr-base.Dockerfile's, which smoke.sh builds where
# no registry can be reached).
ARG BASE_IMAGE=flwr/superexec:1.42.0
FROM ${BASE_IMAGE}

# The torch build: from TORCH_INDEX, the CPU wheels by default, a CUDA index for the GPU
# image (compose.gpu.yml); or, where that index cannot be reached (CI here, a host offline),
# a wheel in docker/wheels/: the one TORCH_WHEEL names, else the newest of TORCH_VERSION in
# the index's own build (the index's last path part: torch-2.13.0+cpu-*.whl for the CPU
# index, +cu128 for .../cu128), so a CPU wheel left there never goes into the GPU image.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_WHEEL=""
WORKDIR /app

# torch first (pinned, within pyproject's "<2.14"), so that the project's torch requirement
# is already met and pip does not pull a second (CUDA) build from PyPI. The wheel is bind
# mounted, not copied: it would stay in a layer beside the installed copy.
# hadolint ignore=DL3013
RUN --mount=type=bind,source=docker/wheels,target=/tmp/wheels \
    build="${TORCH_INDEX%/}" && build="${build##*/}" && wheel="${TORCH_WHEEL}" \
    && if [ -z "$wheel" ]; then for found in /tmp/wheels/torch-"${TORCH_VERSION}+${build}"-*.whl; do \
        if [ -e "$found" ]; then wheel="${found##*/}"; fi; done; fi \
    && if [ -n "$wheel" ]; then set -- "/tmp/wheels/$wheel"; \
    else set -- --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"; fi \
    && echo "torch from $*" && python -m pip install --no-cache-dir "$@"

# flwr itself is the image's (the same pinned version); the simulation extra (Ray) is not
# needed in a deployment, so it is dropped before installing.
COPY pyproject.toml README.md ./
COPY dept ./dept
COPY dept_strategy ./dept_strategy
COPY server_app ./server_app
COPY client_app ./client_app
COPY dept_cli ./dept_cli
RUN sed -i 's/"flwr\[simulation\]==\([^"]*\)"/"flwr==\1"/' pyproject.toml \
    && python -m pip install --no-cache-dir .

# Tokenizers, token caches and per-round embeddings (/app/state, a volume per node) and the
# ServerApp's outputs (/app/runs); made by the image's own (non-root) user so that named
# volumes mounted there are writable by it.
RUN mkdir -p /app/state /app/runs
ENV XDG_CACHE_HOME=/app/state
ENTRYPOINT ["flower-superexec"]

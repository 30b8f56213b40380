# SuperExec: runs the project's ServerApp (beside the SuperLink) or ClientApps (beside each
# SuperNode). The app bundle (FAB) arrives at run time; its dependencies must already be
# here, because runtime installation stays off. TORCH_INDEX picks the torch build: the CPU
# wheels by default, a CUDA index for the GPU image (see compose.gpu.yml).
ARG FLWR_VERSION=1.42.0
FROM flwr/superexec:${FLWR_VERSION}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
WORKDIR /app

# torch first (pinned, within pyproject's "<2.14"), from its own index, so that the
# project's torch requirement is already met and pip does not pull a second build from PyPI.
RUN python -m pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

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

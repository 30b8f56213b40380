# A stand-in for Flower's flwr/base images where none can be pulled (CI here): their layout
# (a venv at /python/venv owned by the non-root user app, uid 49999, home and workdir /app)
# and the same flwr, pip-installed on any Debian-like image with "python3 -m venv". smoke.sh
# builds it on python-base.sh's image; the role Dockerfiles beside it take it as BASE_IMAGE.
ARG PYTHON_BASE=python:3.11-slim-bookworm
FROM ${PYTHON_BASE}

ARG FLWR_VERSION=1.42.0
USER 0
RUN useradd --uid 49999 --user-group --home-dir /app --no-create-home app \
    && mkdir -p /app /python/venv \
    && chown app:app /app /python/venv

ENV PATH=/python/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONIOENCODING=UTF-8 \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8 \
    HOME=/app
WORKDIR /app
USER 49999:49999
# The venv belongs to app, so the images built on this one pip-install as app, as on flwr/*.
RUN python3 -m venv /python/venv \
    && python -m pip install --no-cache-dir "flwr==${FLWR_VERSION}"

# SuperLink: the federation's coordinator. It never runs project code (the ServerApp runs
# in the SuperExec container, "--isolation process"), so Flower's own image is all it needs;
# the tag is pinned to the flwr version pyproject.toml requires.
# BASE_IMAGE: Flower's own image by default; any image with its layout and flwr (such as
# flwr-base.Dockerfile's, which smoke.sh builds where no registry can be reached).
ARG BASE_IMAGE=flwr/superlink:1.42.0
FROM ${BASE_IMAGE}

# State (runs, registered SuperNode keys) lives in /app/state: mount a volume there so a
# restarted SuperLink keeps it.
WORKDIR /app
# Made by the image's own (non-root) user, so a named volume mounted here is writable by it.
RUN mkdir -p /app/state
VOLUME ["/app/state"]
EXPOSE 8000
ENTRYPOINT ["flower-superlink", "--isolation", "process", "--database", "/app/state/superlink.db", "--disable-runtime-dependency-installation"]

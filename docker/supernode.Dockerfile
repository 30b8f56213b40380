# SuperNode: one per data source. It connects to the SuperLink and hands each message to
# its SuperExec ("--isolation process"), which runs the ClientApp; no project code here.
# BASE_IMAGE: Flower's own image by default; any image with its layout and flwr (such as
# flwr-base.Dockerfile's, which smoke.sh builds where no registry can be reached).
ARG BASE_IMAGE=flwr/supernode:1.42.0
FROM ${BASE_IMAGE}

WORKDIR /app
EXPOSE 9094
ENTRYPOINT ["flower-supernode", "--isolation", "process", "--host", "0.0.0.0", "--port", "9094"]

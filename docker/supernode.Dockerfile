# SuperNode: one per data source. It connects to the SuperLink and hands each message to
# its SuperExec ("--isolation process"), which runs the ClientApp; no project code here.
ARG FLWR_VERSION=1.42.0
FROM flwr/supernode:${FLWR_VERSION}

WORKDIR /app
EXPOSE 9094
ENTRYPOINT ["flower-supernode", "--isolation", "process", "--host", "0.0.0.0", "--port", "9094"]

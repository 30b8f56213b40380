# The gateway of compose.tls.yml for hosts that cannot pull its nginx image: Debian's nginx,
# started the way the official image starts (every /etc/nginx/templates/*.template filled in
# by envsubst with the environment's names into /etc/nginx/conf.d/, then nginx in the
# foreground, logs to the container's output). smoke.sh builds it on python-base.sh's image
# and sets GATEWAY_IMAGE; elsewhere the pinned nginx:1.28.0-alpine serves as well.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx-light gettext-base \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/* \
    && ln -sf /dev/stdout /var/log/nginx/access.log \
    && ln -sf /dev/stderr /var/log/nginx/error.log \
    && mkdir -p /etc/nginx/templates

COPY --chmod=755 docker/gateway-start.sh /usr/local/bin/gateway-start
EXPOSE 8443
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/usr/local/bin/gateway-start"]

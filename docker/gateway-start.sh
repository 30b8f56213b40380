#!/bin/sh
# gateway.Dockerfile's entrypoint, as the official nginx image starts: each
# /etc/nginx/templates/NAME.template, with only the environment's own names replaced (so
# nginx's lower-case $variables stay), becomes /etc/nginx/conf.d/NAME; then nginx runs in
# the foreground.
set -eu
names=$(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/${\1}/p' | tr '\n' ' ')
for template in /etc/nginx/templates/*.template; do
    [ -e "$template" ] || continue
    config=/etc/nginx/conf.d/$(basename "$template" .template)
    envsubst "$names" <"$template" >"$config"
done
exec nginx -g 'daemon off;'

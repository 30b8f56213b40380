#!/usr/bin/env bash
# A real deployment on this machine, no Docker, no root: a SuperLink with TLS and SuperNode
# authentication, one SuperNode (and its executor) per source, a federation run through them,
# and a new source joining while it runs. The processes and flags are the compose files'.
#
#   bash docker/loopback.sh [FOLDER]     # with the project installed, from any folder
#
# Everything goes to FOLDER (default: loopback-run): certificates, logs, node state, the run's
# outputs (run/). Ports are free ones found at the start. Every process started here is
# stopped on exit, Ctrl-C included (each runs in a session of its own, with what it starts).
set -euo pipefail

app=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the checkout this script is in
work=$(realpath -m "${1:-loopback-run}")
mkdir -p "$work/logs" "$work/state"
export FLWR_HOME="$work/flwr-home"           # this federation's own connection profile
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export OMP_NUM_THREADS=1                     # several trainers share this machine's cores
certs="$work/certs"
secret="$certs/superexec.secret"

free_port() {
  python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

sessions=()
start() {  # start NAME COMMAND...: in a session of its own, its output in logs/NAME.log
  local name=$1
  shift
  setsid "$@" > "$work/logs/$name.log" 2>&1 &
  sessions+=("$!")
}
stop_all() {  # SIGTERM each session, SIGKILL what is left after 10 s
  for pid in "${sessions[@]}"; do kill -- "-$pid" 2> /dev/null || true; done
  for _ in $(seq 20); do
    alive=0
    for pid in "${sessions[@]}"; do kill -0 -- "-$pid" 2> /dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.5
  done
  for pid in "${sessions[@]}"; do kill -KILL -- "-$pid" 2> /dev/null || true; done
}
trap stop_all EXIT

wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" > /dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      echo "loopback: gave up waiting for $what; logs in $work/logs" >&2
      exit 1
    fi
    sleep 1
  done
}

# 1. Certificates: a CA, the SuperLink's certificate, a key pair per SuperNode, the SuperExec
#    secret (dept certs; docs/deployment.md says what each is for).
[ -f "$certs/ca.crt" ] || dept certs "$certs" --name localhost --name 127.0.0.1 \
  --supernodes latin,greek,cyrillic > "$work/logs/certs.log"

# 2. The SuperLink (TLS, only registered SuperNodes admitted) and the ServerApp's executor.
link="127.0.0.1:$(free_port)"
start superlink flower-superlink --host 127.0.0.1 --port "${link#*:}" --isolation process \
  --enable-supernode-auth --ssl-ca-certfile "$certs/ca.crt" \
  --ssl-certfile "$certs/server.pem" --ssl-keyfile "$certs/server.key" \
  --superexec-auth-secret-file "$secret" --database "$work/superlink.db" \
  --disable-runtime-dependency-installation
start superexec-serverapp flower-superexec --runtime-api-address "$link" \
  --root-certificates "$certs/ca.crt" --superexec-auth-secret-file "$secret"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "loopback"

[superlink.loopback]
address = "$link"
root-certificates = "$certs/ca.crt"
TOML
wait_for 60 "the SuperLink on $link" flwr supernode ls loopback

# 3. Each SuperNode's public key, registered by the operator (here, this shell).
for source in latin greek cyrillic; do
  flwr supernode register "$certs/supernodes/$source.pub" loopback > /dev/null
done

# 4. A SuperNode per source, signing with its key, and its executor (where the ClientApp runs).
node() {  # node SOURCE
  local port
  port=$(free_port)
  start "supernode-$1" flower-supernode --superlink "$link" --isolation process \
    --root-certificates "$certs/ca.crt" --auth-supernode-private-key "$certs/supernodes/$1" \
    --port "$port" --superexec-auth-secret-file "$secret" \
    --node-config "source='$1' path='builtin:synthetic-$1' vocab-size=300 state-dir='$work/state/$1'"
  start "superexec-$1" dept superexec --insecure --runtime-api-address "127.0.0.1:$port" \
    --superexec-auth-secret-file "$secret"   # the node's own Runtime API: loopback only
}
node latin
node greek

# 5. The run, streamed to logs/run.log; a third source joins once round 1 is done.
flwr run "$app" loopback --stream --run-config "model='debug' seq-len=32 local-steps=4 \
num-server-rounds=4 min-available-nodes=2 wait-for-nodes-s=120.0 round-timeout-s=180.0 \
output-dir='$work/run'" > "$work/logs/run.log" 2>&1 &
run=$!
echo "loopback: SuperLink on $link; the run streams to $work/logs/run.log"
round_1_done() {  # the run's round 1 line; the run's own last lines if it ended first
  grep -q "round 1/4 done" "$work/logs/run.log" && return 0
  if ! kill -0 "$run" 2> /dev/null; then
    echo "loopback: the run ended before its round 1; the end of $work/logs/run.log:" >&3
    tail -n 15 "$work/logs/run.log" >&3
    exit 1
  fi
  return 1
}
wait_for 600 "round 1 of the run" round_1_done 3>&2
echo "loopback: round 1 done; cyrillic joins"
node cyrillic
wait "$run"
grep -E "round [0-9]/4 done" "$work/logs/run.log" | sed 's/.*round/round/'
python - "$work/run/summary.json" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
for name, source in sorted(summary["sources"].items()):
    print(f"loopback: {name}: joined in round {source['joined_round']}, "
          f"{source['tokens_trained']:,} tokens, {source['val_bpb']:.3f} bits per byte")
PY

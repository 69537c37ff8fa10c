#!/usr/bin/env bash
# gradtune's MLflow tracking server: registry in a SQL store, model files in S3.
#
#   mlflow/server.sh            start it (settings: mlflow/server.env, overridable by env)
#   MLFLOW_PORT=5001 S3_PORT=9001 MLFLOW_HOME=/tmp/mlf mlflow/server.sh
#
# With START_MOTO=1 (the default) it first starts moto's S3-compatible server on 127.0.0.1
# and creates the bucket. Then `mlflow server --backend-store-uri ... --artifacts-destination
# s3://...` serves the registry and proxies every artifact to the bucket: clients
# (gradtune tune / retune / pull with --mlflow-uri http://HOST:PORT) never write a local file
# store and need no S3 credentials. Prints "ready: http://HOST:PORT" once /health answers;
# stops both servers (and their workers) when it is stopped or either of them exits.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=server.env
source "$here/server.env"
PYTHON="${PYTHON:-python3}"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION

pids=()
kill_tree() {  # a process and all its descendants (uvicorn workers, moto's threads' children)
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null || true
}
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill_tree "$pid"; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

wait_for() {  # URL, name, pid: poll until the URL answers, or fail if the process died
  local url="$1" name="$2" pid="$3"
  for _ in $(seq 1 240); do
    if "$PYTHON" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "$url" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "mlflow/server.sh: $name exited before answering at $url" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "mlflow/server.sh: $name did not answer at $url within 120 s" >&2
  exit 1
}

mkdir -p "$MLFLOW_HOME"
if [ "$START_MOTO" = 1 ]; then
  "$PYTHON" -m moto.server -H 127.0.0.1 -p "$S3_PORT" >"$MLFLOW_HOME/moto.log" 2>&1 &
  pids+=($!)
  export MLFLOW_S3_ENDPOINT_URL="http://127.0.0.1:$S3_PORT"
  # moto accepts any key; boto3 insists on having one.
  export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-moto}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-moto}"
  export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}"
  wait_for "$MLFLOW_S3_ENDPOINT_URL/moto-api/" "moto S3 server" "${pids[-1]}"
  "$PYTHON" -c "
import sys, boto3
s3 = boto3.client('s3', endpoint_url=sys.argv[1])
if sys.argv[2] not in [b['Name'] for b in s3.list_buckets()['Buckets']]:
    s3.create_bucket(Bucket=sys.argv[2])
" "$MLFLOW_S3_ENDPOINT_URL" "$MLFLOW_BUCKET"
fi

"$PYTHON" -m mlflow server --host "$MLFLOW_HOST" --port "$MLFLOW_PORT" \
  --backend-store-uri "$MLFLOW_BACKEND_STORE_URI" \
  --artifacts-destination "$MLFLOW_ARTIFACTS_DESTINATION" \
  --workers "$MLFLOW_WORKERS" >"$MLFLOW_HOME/mlflow.log" 2>&1 &
pids+=($!)
wait_for "http://$MLFLOW_HOST:$MLFLOW_PORT/health" "mlflow server" "${pids[-1]}"
echo "ready: http://$MLFLOW_HOST:$MLFLOW_PORT (artifacts: $MLFLOW_ARTIFACTS_DESTINATION)"
# Until either server exits (or this script is stopped): then the trap stops the other.
wait -n "${pids[@]}"
echo "mlflow/server.sh: a server exited; stopping (logs in $MLFLOW_HOME)" >&2
exit 1

#!/bin/bash
# Signed GPU verdicts on a GPU machine: `build --gpus devices --push --sign-key` attaches the
# build host's verdict to the wheel and to the pushed image; `check IMAGE --verify --attest` on
# the same machine (standing in for a node) verifies it, runs the check, and adds the node's
# verdict; `check --verify` then shows both, and `inspect WHEEL --verify` the wheel's.
#
# Run from a copy of the repository, as root, through poll.sh:
#   SCRIPT=signed_check.sh bash bench/gpu_container/poll.sh WORK_DIR SECONDS OUT_DIR
# Needs beside the repository what setup.sh needs (.gpu-engine/ with Debian's docker-registry
# unpacked beside the engine, .gpu-wheelhouse/) and fa-images' own dependencies importable.
set -u
# shellcheck source=bench/gpu_container/setup.sh
source "$(dirname "$0")/setup.sh" "${1:-/tmp/gc}"
REG_PORT=38919
REGISTRY=127.0.0.1:$REG_PORT

phase "a registry on $REGISTRY (Debian's docker-registry)"
mkdir -p "$W/registry"
cat >"$W/registry.yml" <<YAML
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $W/registry}}
http: {addr: $REGISTRY}
YAML
setsid nohup docker-registry serve "$W/registry.yml" >"$W/registry.log" 2>&1 &
for _ in $(seq 30); do curl -sf "http://$REGISTRY/v2/" >/dev/null && break; sleep 1; done
curl -s "http://$REGISTRY/v2/" && echo " registry up"

phase "project: the tiny flash-attn sdist, a compat override, a matrix that pushes to $REGISTRY"
mkdir -p "$W/proj/sdists" && cd "$W/proj" || exit 1
export PYTHONPATH=$REPO:${PYTHONPATH:-}
python3 "$REPO/bench/gpu_container/tiny_project.py" "$REPO" "$PYVER" "${TORCH%%+*}" "$PORT" "$REGISTRY/fa-images/flash-attn"
python3 -m fa_images keys create keys
KEY=keys/fa-images.key
PUB=keys/fa-images.pub

phase "fa-images build --gpus devices --push --sign-key"
python3 -m fa_images build --matrix matrix.yaml --dry-run | grep -E 'attest|push'
started=$(date +%s)
python3 -m fa_images build --matrix matrix.yaml --gpus devices --push --sign-key $KEY --report report.json 2>&1 | tee out-build.txt
echo "fa-images build exited ${PIPESTATUS[0]} after $(($(date +%s) - started)) s"
ID=$(python3 -m fa_images plan --matrix matrix.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
IMAGE=$REGISTRY/fa-images/flash-attn:$ID

phase "the wheel's attestations, verified (the build host's verdict)"
WHEEL=$(find dist -maxdepth 1 -name '*.whl' | head -1)
python3 -m fa_images inspect "$WHEEL" --verify $PUB 2>&1 | tee out-inspect.txt | head -30
echo "inspect --verify exited ${PIPESTATUS[0]}"

phase "check IMAGE --verify --attest: verified, checked on this GPU, this node's verdict added"
python3 -m fa_images check "$IMAGE" --gpus devices --verify $PUB --attest --sign-key $KEY 2>&1 | tee out-check-attest.txt
echo "check --verify --attest exited ${PIPESTATUS[0]}"

phase "check IMAGE --verify: both verdicts, each verified"
python3 -m fa_images check "$IMAGE" --gpus devices --verify $PUB --json >check.json 2>out-check-verify.txt
echo "check --verify exited $?"
cat out-check-verify.txt
python3 -c 'import json; d=json.load(open("check.json")); [print(v["gpu"], v["capability"], v["driver"], v["passed"], v["checkedOn"], v["checkedAt"], len(v["cases"])) for v in d["images"][0]["verdicts"]]'
cp check.json report-check.json

phase "the attestations as the registry holds them (cosign's tags)"
curl -s "http://$REGISTRY/v2/fa-images/flash-attn/tags/list"; echo
phase "done"

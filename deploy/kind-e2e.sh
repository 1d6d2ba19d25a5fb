#!/usr/bin/env bash
# End to end on a throwaway kind cluster (needs docker, kind, kubectl and the kfloop venv):
#   1. a kind cluster and the Kubeflow Training Operator v1.9 (standalone manifests), its Worker init container
#      made to meet the restricted Pod Security profile;
#   2. the CPU image (deploy/Dockerfile) built and loaded into the cluster;
#   3. namespace `kfloop` enforcing the restricted Pod Security profile, deploy/rbac.yaml, a shared volume;
#   4. `kubectl auth can-i` as the kfloop service account: what it must be allowed and what it must not;
#   5. demo data, schema and training config put on the shared volume, a PyTorchJob (2 nodes x 2 gloo processes)
#      rendered by `kfloop render-job` and created as the service account, waited for, the model read back;
#   6. standalone Kubeflow Pipelines beside the operator (the pinned upstream release's manifests, KFP_VERSION),
#      an MLflow server of the image and deploy/rbac.yaml in `kubeflow` (where standalone KFP runs the steps), then
#      `kfloop upload` (every step in the built image) and `kfloop run training --wait` through a port-forward: the
#      script fails when the run does (SKIP_KFP=1 skips this stage).
#
# Usage: deploy/kind-e2e.sh            (KEEP_CLUSTER=1 keeps the cluster; CLUSTER, IMAGE, KFLOOP override names)
# The rendered manifests go to ARTIFACTS (default $TMPDIR/kfloop-kind-e2e); when the script fails, the cluster's
# state, events, pod logs and `kind export logs` go there too (the GitHub job uploads that folder).
set -euo pipefail

CLUSTER="${CLUSTER:-kfloop-e2e}"
IMAGE="${IMAGE:-kfloop:e2e}"
KFLOOP="${KFLOOP:-.venv/bin/kfloop}"
NAMESPACE=kfloop
JOB=kfloop-train
SA="system:serviceaccount:${NAMESPACE}:kfloop"
OPERATOR="github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0"
KFP_VERSION="${KFP_VERSION:-2.17.0}"  # the kubeflow/pipelines release whose API the tests' KFP server follows
KFP_MANIFESTS="github.com/kubeflow/pipelines/manifests/kustomize"
TIMEOUT_SECONDS="${TIMEOUT_SECONDS:-900}"
ARTIFACTS="${ARTIFACTS:-${TMPDIR:-/tmp}/kfloop-kind-e2e}"

cd "$(dirname "$0")/.."
for tool in docker kind kubectl "$KFLOOP"; do
  if ! command -v "$tool" >/dev/null; then
    echo "kind-e2e: '$tool' not found; install it (or set KFLOOP=path/to/kfloop)" >&2
    exit 2
  fi
done

log() { printf '\n== %s\n' "$*"; }
diagnose() {  # the cluster's state and every log worth reading, into $ARTIFACTS
  kubectl get all,pytorchjobs,events -A -o wide >"${ARTIFACTS}/cluster.txt" 2>&1 || true
  kubectl -n "$NAMESPACE" describe pytorchjobs,pods >"${ARTIFACTS}/describe.txt" 2>&1 || true
  kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/name=kfloop --all-containers --prefix --tail=-1 \
    >"${ARTIFACTS}/pods.log" 2>&1 || true
  kubectl -n kubeflow logs deployment/training-operator --tail=-1 >"${ARTIFACTS}/training-operator.log" 2>&1 || true
  kubectl -n kubeflow logs deployment/ml-pipeline --tail=-1 >"${ARTIFACTS}/ml-pipeline.log" 2>&1 || true
  kubectl -n kubeflow get pods -o wide >"${ARTIFACTS}/kubeflow-pods.txt" 2>&1 || true
  kind export logs "${ARTIFACTS}/kind" --name "$CLUSTER" >/dev/null 2>&1 || true
}
cleanup() {
  local status=$?
  if (( status != 0 )); then
    echo "kind-e2e: failed (exit ${status}); diagnostics in ${ARTIFACTS}" >&2
    diagnose
  fi
  if [[ "${KEEP_CLUSTER:-0}" == 1 ]]; then
    echo "kind-e2e: keeping cluster ${CLUSTER} (kind delete cluster --name ${CLUSTER})"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
mkdir -p "$ARTIFACTS"

log "kind cluster ${CLUSTER}"
clusters="$(kind get clusters 2>/dev/null)"
grep -qx "$CLUSTER" <<<"$clusters" || kind create cluster --name "$CLUSTER" --wait 120s
kubectl config use-context "kind-${CLUSTER}" >/dev/null

log "Training Operator v1.9"
kubectl apply --server-side -k "$OPERATOR"
# Its Worker pods' init container must meet the restricted profile too (see deploy/operator-restricted-init.yaml).
kubectl apply -f deploy/operator-restricted-init.yaml
init_flag=--pytorch-init-container-template-file=/etc/kfloop-init/initContainer.yaml
args="$(kubectl -n kubeflow get deployment training-operator -o jsonpath='{.spec.template.spec.containers[0].args}')"
if [[ "$args" != *"$init_flag"* ]]; then
  kubectl -n kubeflow patch deployment training-operator --type=strategic -p '
spec:
  template:
    spec:
      containers:
        - name: training-operator
          volumeMounts: [{name: kfloop-init, mountPath: /etc/kfloop-init, readOnly: true}]
      volumes: [{name: kfloop-init, configMap: {name: kfloop-restricted-pytorch-init}}]'
  if [[ -z "$args" ]]; then
    patch="[{\"op\": \"add\", \"path\": \"/spec/template/spec/containers/0/args\", \"value\": [\"${init_flag}\"]}]"
  else
    patch="[{\"op\": \"add\", \"path\": \"/spec/template/spec/containers/0/args/-\", \"value\": \"${init_flag}\"}]"
  fi
  kubectl -n kubeflow patch deployment training-operator --type=json -p "$patch"
fi
kubectl -n kubeflow rollout status deployment/training-operator --timeout=300s

log "image ${IMAGE}"
commit="$(deploy/image-commit.sh)"  # `-dirty` when the tree differs from HEAD
docker build -f deploy/Dockerfile --build-arg VARIANT=cpu --build-arg "GIT_COMMIT=${commit}" -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "namespace ${NAMESPACE} (restricted Pod Security enforced), RBAC, shared volume"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
kubectl label --overwrite namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=restricted
kubectl apply -f deploy/rbac.yaml
# kind's local-path storage is ReadWriteOnce: fine here, every pod runs on the one node.
kubectl apply -f - <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: kfloop-shared, namespace: ${NAMESPACE}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
EOF

log "RBAC: kubectl auth can-i as ${SA}"
failures=0
can_i() {  # can_i yes|no VERB RESOURCE [NAMESPACE]
  local want="$1" verb="$2" resource="$3" ns="${4:-$NAMESPACE}" got
  got="$(kubectl auth can-i "$verb" "$resource" --as="$SA" -n "$ns" 2>/dev/null || true)"
  if [[ "$got" == "$want" ]]; then
    echo "ok   ${verb} ${resource} (${ns}): ${got}"
  else
    echo "FAIL ${verb} ${resource} (${ns}): got '${got}', want '${want}'"
    failures=$((failures + 1))
  fi
}
can_i yes create pytorchjobs.kubeflow.org; can_i yes get pytorchjobs.kubeflow.org
can_i yes list pytorchjobs.kubeflow.org; can_i yes watch pytorchjobs.kubeflow.org
can_i yes patch pytorchjobs.kubeflow.org; can_i yes delete pytorchjobs.kubeflow.org
can_i yes create trainjobs.trainer.kubeflow.org; can_i yes delete trainjobs.trainer.kubeflow.org
can_i yes get pods; can_i yes list pods; can_i yes watch pods; can_i yes get pods/log; can_i yes list events
can_i yes get leases.coordination.k8s.io; can_i yes create leases.coordination.k8s.io
can_i yes update leases.coordination.k8s.io
can_i yes create configmaps; can_i yes get configmaps/kfloop-trigger-state  # the retrain trigger's state
can_i yes update configmaps/kfloop-trigger-state
# KFP v2's driver and launcher in every step pod: the calls backend/src/v2 makes (Role kfloop-pipeline-runner)
can_i yes create workflowtaskresults.argoproj.io; can_i yes patch workflowtaskresults.argoproj.io
can_i yes get workflows.argoproj.io; can_i yes get secrets/mlpipeline-minio-artifact
can_i yes get configmaps/kfp-launcher
# nothing beyond them: no pod creation or exec, no other Secret or ConfigMap, no RBAC, no cluster-wide reach
can_i no create pods; can_i no create pods/exec; can_i no delete pods; can_i no update pytorchjobs.kubeflow.org
can_i no get secrets; can_i no get secrets/kfloop-mlflow; can_i no get configmaps; can_i no watch configmaps
can_i no list secrets; can_i no create secrets; can_i no watch events; can_i no delete leases.coordination.k8s.io
can_i no create services; can_i no create persistentvolumeclaims; can_i no patch workflows.argoproj.io
can_i no delete configmaps; can_i no patch configmaps
can_i no create rolebindings.rbac.authorization.k8s.io; can_i no create roles.rbac.authorization.k8s.io
can_i no create pytorchjobs.kubeflow.org default; can_i no list pods kube-system; can_i no get secrets kube-system
(( failures == 0 )) || { echo "kind-e2e: ${failures} RBAC check(s) failed" >&2; exit 1; }

files_pod() {  # files_pod NAMESPACE: pod kfloop-files of the image, restricted, with kfloop-shared at /shared
  kubectl -n "$1" delete pod kfloop-files --ignore-not-found --wait=true
  kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata: {name: kfloop-files, namespace: ${1}}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000,
                    seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: files
      image: ${IMAGE}
      imagePullPolicy: Never
      command: [sleep, infinity]
      env: [{name: HOME, value: /tmp}]
      securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
      volumeMounts: [{name: shared, mountPath: /shared}, {name: tmp, mountPath: /tmp}]
  volumes:
    - {name: shared, persistentVolumeClaim: {claimName: kfloop-shared}}
    - {name: tmp, emptyDir: {}}
EOF
  kubectl -n "$1" wait --for=condition=Ready pod/kfloop-files --timeout=180s
}

log "inputs on the shared volume"
files_pod "$NAMESPACE"
kubectl -n "$NAMESPACE" exec -i kfloop-files -- python - "/shared/${JOB}" <<'EOF'
import json, shutil, sys
from pathlib import Path

import data
from data.generate import write_demo
from training.config import TrainingConfig

root = Path(sys.argv[1])
shutil.rmtree(root, ignore_errors=True)
root.mkdir(parents=True)
shutil.copy(write_demo(root / "demo", rows=3000)["train.parquet"], root / "data.parquet")
shutil.copy(Path(data.__file__).with_name("schema.yaml"), root / "schema.yaml")
config = TrainingConfig(nnodes=2, nproc_per_node=2, epochs=2, device="cpu")
(root / "config.json").write_text(json.dumps(config.to_dict()))
print("inputs:", sorted(p.name for p in root.iterdir()))
EOF

log "PyTorchJob ${JOB}: kfloop render-job, created as ${SA}"
"$KFLOOP" render-job --nnodes 2 --nproc-per-node 2 \
  --set training.epochs=2 --set "cluster.namespace=${NAMESPACE}" --set "cluster.image=${IMAGE}" \
  --set cluster.image_pull_policy=Never --set cluster.cpu=1 --set cluster.memory=2Gi --set cluster.shm_size=256Mi \
  --set cluster.active_deadline_seconds="${TIMEOUT_SECONDS}" > "${ARTIFACTS}/${JOB}.yaml"
kubectl -n "$NAMESPACE" delete pytorchjob "$JOB" --ignore-not-found --wait=true
kubectl create --as="$SA" -f "${ARTIFACTS}/${JOB}.yaml"

deadline=$((SECONDS + TIMEOUT_SECONDS))
state=""
while (( SECONDS < deadline )); do
  state="$(kubectl -n "$NAMESPACE" get pytorchjob "$JOB" \
    -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type}{" "}{end}')"
  [[ "$state" == *Succeeded* || "$state" == *Failed* ]] && break
  sleep 5
done

log "result: ${state:-no condition}"
kubectl -n "$NAMESPACE" get pytorchjob,pods -l app.kubernetes.io/name=kfloop
kubectl -n "$NAMESPACE" logs "${JOB}-master-0" --tail=20 || true
if [[ "$state" != *Succeeded* ]]; then
  kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp | tail -20
  echo "kind-e2e: job ${JOB} did not succeed within ${TIMEOUT_SECONDS}s" >&2
  exit 1
fi
kubectl -n "$NAMESPACE" exec kfloop-files -- cat "/shared/${JOB}/model/model.json"
echo

if [[ "${SKIP_KFP:-0}" == 1 ]]; then
  echo "kind-e2e: ok (KFP stage skipped)"
  exit 0
fi

log "standalone Kubeflow Pipelines ${KFP_VERSION}"
kubectl apply -k "${KFP_MANIFESTS}/cluster-scoped-resources?ref=${KFP_VERSION}"
kubectl wait --for condition=established --timeout=120s crd/applications.app.k8s.io
kubectl apply -k "${KFP_MANIFESTS}/env/platform-agnostic?ref=${KFP_VERSION}"
kubectl -n kubeflow wait --for=condition=Available deployment --all --timeout="${TIMEOUT_SECONDS}s"

log "kfloop in kubeflow (standalone KFP runs steps there): RBAC, MLflow, shared volume with the demo data"
sed 's/namespace: kfloop/namespace: kubeflow/' deploy/rbac.yaml | kubectl apply -f -
kubectl apply -f - <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: kfloop-shared, namespace: kubeflow}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: kfloop-mlflow, namespace: kubeflow}
spec:
  selector: {matchLabels: {app: kfloop-mlflow}}
  template:
    metadata: {labels: {app: kfloop-mlflow}}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000}
      containers:
        - name: mlflow
          image: ${IMAGE}
          imagePullPolicy: Never
          # any Host header: the steps call it by its service name, which MLflow's default allow-list
          # (localhost and private IPs) refuses; this server lives only inside the throwaway cluster
          command: [mlflow, server, --host, 0.0.0.0, --port, "5000", --backend-store-uri, "sqlite:////data/mlflow.db",
                    --artifacts-destination, /data/artifacts, --serve-artifacts, --allowed-hosts, "*"]
          env: [{name: HOME, value: /tmp}]
          ports: [{containerPort: 5000}]
          readinessProbe: {httpGet: {path: /health, port: 5000}, periodSeconds: 5}
          volumeMounts: [{name: data, mountPath: /data}, {name: tmp, mountPath: /tmp}]
      volumes: [{name: data, emptyDir: {}}, {name: tmp, emptyDir: {}}]
---
apiVersion: v1
kind: Service
metadata: {name: kfloop-mlflow, namespace: kubeflow}
spec:
  selector: {app: kfloop-mlflow}
  ports: [{port: 5000, targetPort: 5000}]
---
apiVersion: v1
kind: Secret
metadata: {name: kfloop-mlflow, namespace: kubeflow}
stringData: {MLFLOW_TRACKING_URI: "http://kfloop-mlflow.kubeflow.svc.cluster.local:5000"}
EOF
kubectl -n kubeflow rollout status deployment/kfloop-mlflow --timeout=600s
files_pod kubeflow
kubectl -n kubeflow exec -i kfloop-files -- python - <<'EOF'
import shutil
from pathlib import Path

import data
from data.generate import write_demo

root = Path("/shared/kfp")
root.mkdir(parents=True, exist_ok=True)
shutil.copy(write_demo(root / "demo", rows=3000)["train.parquet"], root / "data.parquet")
shutil.copy(Path(data.__file__).with_name("schema.yaml"), root / "schema.yaml")
EOF
# kind has one node: the ReadWriteOnce claim is shared by this pod and every step pod on it

log "kfloop upload, then run training --wait, against KFP ${KFP_VERSION} through a port-forward"
kubectl -n kubeflow port-forward svc/ml-pipeline :8888 >"${ARTIFACTS}/port-forward.log" 2>&1 &
forward=$!
trap 'kill "$forward" 2>/dev/null || true; cleanup' EXIT
port=""
for _ in $(seq 60); do
  port="$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "${ARTIFACTS}/port-forward.log" | head -1)"
  [[ -n "$port" ]] && break
  sleep 1
done
[[ -n "$port" ]] || { echo "kind-e2e: no port-forward to svc/ml-pipeline" >&2; exit 1; }
kfp="http://127.0.0.1:${port}"
"$KFLOOP" upload --host "$kfp" --image "$IMAGE" --shared-volume-claim kfloop-shared --json \
  > "${ARTIFACTS}/kfp-upload.json"
# --wait: exits non-zero, printing the run's state, when the run does not succeed
"$KFLOOP" run training --host "$kfp" --wait --json \
  --set dataset_uri=/shared/kfp/data.parquet --set schema_uri=/shared/kfp/schema.yaml --set target=churned \
  --set training.epochs=2 | tee "${ARTIFACTS}/kfp-run.json"
echo "kind-e2e: ok"

"""The step pod tests/cluster/kfp_executor.py's :func:`step_pod` builds, against kubeflow/pipelines 2.17.0's own
cases, each under its upstream name:

- ``backend/src/v2/compiler/argocompiler/container_test.go``: ``TestContainerDriverTemplate_IncludesKFPPodNameEnv``
  (``commonEnvs``, which the executor template's main container gets too); ``Test_extendPodMetadata`` "Valid - add
  pod labels and annotations" (the labels; annotations are refused as not emulated).
- ``argocompiler/security_context_test.go``: the executor template's main container and pod
  (``applySecurityContextToExecutorTemplate``, ``defaultUserContainerSecurityContext``,
  ``applyPodSeccompProfileOnly``), with and without the admin's defaults.
- ``backend/src/v2/driver/driver_test.go``: the main container's resources of ``initPodSpecPatch``
  (``Test_initPodSpecPatch_acceleratorConfig``, ``Test_initPodSpecPatch_legacy_resources``,
  ``Test_initPodSpecPatch_resourceRequests``), quantities compared by value (upstream compares the JSON of
  ``resource.Quantity``, which prints them canonically: ``1.5G`` as ``1500M``).

Not ported: container_test.go's ``TestAddContainerExecutorTemplate`` and
``TestContainerDriverTemplate_IncludesPipelineJobCreateTimeArg`` (Argo templates and the driver's arguments: the
module builds the resulting pod, no templates, no driver); ``Test_extendPodMetadata`` "Valid - try overwrite
default pod labels and annotations" (it asserts the template's ``{{inputs.parameters...}}`` keys beside the
defaults, which Argo resolves later); security_context_test.go's system-container cases
(``TestDefaultContainerSecurityContext``, ``TestApplySecurityContextToContainer_*``,
``TestApplySecurityContextToTemplate_*``: driver and launcher containers, not built), its init-container and
sidecar assertions (the pod has neither), ``..._PartialSecurityContext``, ``..._ExistingContext`` and
``..._AdminDefaultsOverrideSDK`` (a security context set before: the IR the module reads carries none), and its
nil-argument cases (Go's nil); argo_test.go and spec_patch_test.go (whole-Workflow compilation and the admin's
Workflow spec patch, not modelled); driver_test.go's runtime-parameter resources
(``Test_initPodSpecPatch_resource_placeholders``: not resolved here).
"""
import pytest
from kfp.pipeline_spec import pipeline_spec_pb2
from kubernetes.utils import parse_quantity

from cluster.kfp_executor import step_pod, unemulated_fields

ContainerSpec = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec
Resources = ContainerSpec.ResourceSpec
Accelerator = Resources.AcceleratorConfig
USER_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "seccompProfile": {"type": "RuntimeDefault"}}
"""``defaultUserContainerSecurityContext``: no ``runAsNonRoot`` (user images may run as root)."""


def build(resources: Resources | None = None, platform: dict | None = None,
          security_defaults: dict | None = None, object_store: str = "") -> dict:
    """The step pod of driver_test.go's container (``python:3.11``, ``sh -ec python3 -m kfp...``)."""
    container = ContainerSpec(image="python:3.11", command=["sh", "-ec", "python3 -m kfp.components.executor_main"],
                              args=["--function_to_execute", "add"], resources=resources)
    return step_pod("run-1-add-abcde", container, [*container.command, *container.args], platform or {},
                    workflow="run-1", service_account="pipeline-runner", api_url="https://127.0.0.1:6443",
                    object_store=object_store, security_defaults=security_defaults)


def main(pod: dict) -> dict:
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "main"  # driver.go: "argo task user container is always called main"
    return container


def test_container_driver_template_includes_kfp_pod_name_env():
    """TestContainerDriverTemplate_IncludesKFPPodNameEnv: ``KFP_POD_NAME`` is ``metadata.name`` (downward API)."""
    (env,) = [e for e in main(build())["env"] if e["name"] == "KFP_POD_NAME"]
    assert env == {"name": "KFP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


def test_extend_pod_metadata_add_pod_labels_and_annotations():
    """Test_extendPodMetadata "Valid - add pod labels and annotations": the label reaches the pod; the annotation
    is a field the executor does not emulate (the run is refused naming it)."""
    metadata = {"annotations": {"run_id": "123456"}, "labels": {"kubeflow.com/kfp": "pipeline-node"}}
    platform = {"platforms": {"kubernetes": {"deploymentSpec": {"executors": {"exec-add": {
        "podMetadata": metadata}}}}}}
    assert build(platform={"podMetadata": metadata})["metadata"]["labels"]["kubeflow.com/kfp"] == "pipeline-node"
    assert unemulated_fields({}, platform) == [
        "platforms.kubernetes.deploymentSpec.executors.exec-add.podMetadata.annotations"]


SECURITY = [  # (upstream name, the admin's defaults, the main container's security context)
    ("TestApplySecurityContextToExecutorTemplate_WithContainerAndInitContainers", None, USER_CONTAINER),
    ("TestApplySecurityContextToExecutorTemplate_WithAdminDefaults", {"runAsUser": 1000, "runAsGroup": 100},
     {**USER_CONTAINER, "runAsUser": 1000, "runAsGroup": 100}),
    ("TestApplySecurityContextToExecutorTemplate_AdminDefaultsOnlyUser", {"runAsUser": 1000},
     {**USER_CONTAINER, "runAsUser": 1000}),
    ("TestApplySecurityContextToExecutorTemplate_AdminDefaultsOnlyGroup", {"runAsGroup": 100},
     {**USER_CONTAINER, "runAsGroup": 100}),
    ("TestApplySecurityContextToExecutorTemplate_AdminDefaultRunAsNonRoot", {"runAsNonRoot": True},
     {**USER_CONTAINER, "runAsNonRoot": True}),
    ("TestApplySecurityContextToExecutorTemplate_AdminDefaultRunAsNonRootFalse", {"runAsNonRoot": False},
     {**USER_CONTAINER, "runAsNonRoot": False}),
    ("TestApplySecurityContextToExecutorTemplate_AllAdminDefaults",
     {"runAsUser": 1000, "runAsGroup": 100, "runAsNonRoot": True},
     {**USER_CONTAINER, "runAsUser": 1000, "runAsGroup": 100, "runAsNonRoot": True}),
]


@pytest.mark.parametrize("name, defaults, expected", SECURITY, ids=[c[0] for c in SECURITY])
def test_security_context(name, defaults, expected):
    """security_context_test.go: the user container drops every capability, forbids privilege escalation, uses
    the runtime's seccomp profile, and is ``runAsNonRoot`` only by the admin's default; the pod sets only the
    seccomp profile (TestApplyPodSeccompProfileOnly_NilContext)."""
    pod = build(security_defaults=defaults)
    assert main(pod)["securityContext"] == expected
    assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}


def gpu(kind: str) -> Resources:
    return Resources(accelerator=Accelerator(type=kind, count=1))


RESOURCES = [  # (upstream name, the container's resources, the main container's; None: no resources)
    *((f"Test_initPodSpecPatch_acceleratorConfig/Valid - {name}", gpu(kind), {"limits": {kind: "1"}})
      for name, kind in (("nvidia.com/gpu", "nvidia.com/gpu"), ("amd.com/gpu", "amd.com/gpu"),
                         ("cloud-tpus.google.com/v3", "cloud-tpus.google.com/v3"),
                         ("cloud-tpus.google.com/v2", "cloud-tpus.google.com/v2"),
                         ("custom string", "custom.example.com/accelerator-v1"))),
    ("Test_initPodSpecPatch_legacy_resources",
     Resources(cpu_request=200, cpu_limit=400, resource_memory_request="100Mi", resource_memory_limit="500Mi",
               accelerator=Accelerator(type="nvidia.com/gpu", count=1)),
     {"limits": {"cpu": "400", "memory": "500Mi", "nvidia.com/gpu": "1"},
      "requests": {"cpu": "200", "memory": "100Mi"}}),
    ("Test_initPodSpecPatch_resourceRequests/Valid - with requests",
     Resources(cpu_limit=2.0, memory_limit=1.5, cpu_request=1.0, memory_request=0.65),
     {"limits": {"cpu": "2", "memory": "1500M"}, "requests": {"cpu": "1", "memory": "650M"}}),
    ("Test_initPodSpecPatch_resourceRequests/Valid - zero requests",
     Resources(cpu_limit=2.0, memory_limit=1.5, cpu_request=0, memory_request=0),
     {"limits": {"cpu": "2", "memory": "1500M"}}),
]


@pytest.mark.parametrize("name, resources, expected", RESOURCES, ids=[c[0] for c in RESOURCES])
def test_resources(name, resources, expected):
    """driver.go ``initPodSpecPatch``: quantities, cores and GB, and an accelerator's count of its type."""
    built = main(build(resources))["resources"]
    assert {kind: {k: parse_quantity(v) for k, v in values.items()} for kind, values in built.items()} == \
        {kind: {k: parse_quantity(v) for k, v in values.items()} for kind, values in expected.items()}


def test_an_object_store_step_mounts_the_compiled_templates_empty_dirs():
    """argocompiler/container.go 2.17.0 ``Container`` (lines 469-564): the executor template's seven emptyDirs, each
    mounted in the main container at its path; the launcher and scratch folders a non-root user can write."""
    pod = build(object_store="http://127.0.0.1:9000")
    empty = {v["name"] for v in pod["spec"]["volumes"] if v.get("emptyDir") == {}}
    mounts = {m["name"]: m["mountPath"] for m in main(pod)["volumeMounts"] if m["name"] in empty}
    assert mounts == {"kfp-launcher": "/kfp-launcher", "gcs-scratch": "/gcs", "s3-scratch": "/s3",
                      "minio-scratch": "/minio", "dot-local-scratch": "/.local", "dot-cache-scratch": "/.cache",
                      "dot-config-scratch": "/.config", "var-run-argo": "/var/run/argo"}

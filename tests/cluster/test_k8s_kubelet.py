"""The test cluster's kubelet: ``$(VAR)`` expansion as the kubelet does it, a pod's ``fsGroup`` applied to its volumes
as the kubelet's volume ownership code does, and the volume and env forms it does not emulate refused by name
(CreateContainerConfigError), never dropped."""
from __future__ import annotations

import os
import stat

import pytest
from cluster.docker_kubelet import EXEC_MASK, RW_MASK, set_volume_ownership
from cluster.k8s_operator import expand, field_value
from cluster.kubernetes_cluster import PYTHON, pytorchjob
from polling import wait_for

_ENV = {"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""}

# kubernetes third_party/forked/golang/expansion/expand_test.go, doExpansionTest's cases: input, output
EXPAND_VECTORS = [
    ("$(VAR_A)", "A"), ("$(VAR_A)-$(VAR_A)", "A-A"), ("$(VAR_A)-1", "A-1"), ("___$(VAR_B)___", "___B___"),
    ("___$(VAR_C)", "___C"), ("$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"), ("$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
    ("$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"), ("f000-$$VAR_A", "f000-$VAR_A"), ("foo\\$(VAR_C)bar", "foo\\Cbar"),
    ("foo\\\\$(VAR_C)bar", "foo\\\\Cbar"), ("foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"),
    ("$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"), ("$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"), ("$(VAR_REF)", "$(VAR_A)"),
    ("%%$(VAR_REF)--$(VAR_REF)%%", "%%$(VAR_A)--$(VAR_A)%%"), ("foo$(VAR_EMPTY)bar", "foobar"),
    ("foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"), ("f00__(VAR_A)__", "f00__(VAR_A)__"), ("$?_boo_$!", "$?_boo_$!"),
    ("$VAR_A", "$VAR_A"), ("$(VAR_DNE)", "$(VAR_DNE)"), ("$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
    ("$$$$$$(VAR_A)", "$$$(VAR_A)"), ("$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"), ("$$$$$$$(VAR_A)", "$$$A"),
    ("$VAR_A)", "$VAR_A)"), ("${VAR_A}", "${VAR_A}"), ("$(VAR_B)_______$(A", "B_______$(A"),
    ("$(VAR_C)_______$(", "C_______$("), ("$(VAR_A)foobarzab$", "Afoobarzab$"), ("foo-\\$(VAR_A", "foo-\\$(VAR_A"),
    ("--$($($($($--", "--$($($($($--"), ("$($($($($--foo$(", "$($($($($--foo$("), ("foo0--$($($($(", "foo0--$($($($("),
    ("$(foo$$var)", "$(foo$$var)"), ("\n", "\n"), ("$£FOO", "$£FOO"), ("prefix-$€-suffix", "prefix-$€-suffix"),
    ("$中文", "$中文"),
]


@pytest.mark.parametrize("text, want", EXPAND_VECTORS)
def test_expansion_follows_the_kubelets_own_cases(text, want):
    assert expand(text, _ENV) == want


def test_an_env_field_ref_reads_spec_and_status_and_the_metadata_as_the_downward_api_volume_does():
    """kubelet_pods.go ``podFieldSelectorRuntimeValue``: its own ``spec``/``status`` fields, the rest through
    ``fieldpath.ExtractFieldPathAsString``, which refuses what it does not read."""
    pod = {"metadata": {"name": "p", "labels": {"app": "a"}}, "spec": {"serviceAccountName": "kfloop"},
           "status": {"podIP": "127.0.0.1"}}
    assert [field_value(pod, path) for path in ("metadata.name", "metadata.labels['app']", "metadata.labels",
                                                "spec.serviceAccountName", "status.podIP", "spec.nodeName")] == [
        "p", "a", 'app="a"', "kfloop", "127.0.0.1", ""]
    with pytest.raises(ValueError, match=r"^unsupported fieldPath: metadata\.generateName$"):
        field_value(pod, "metadata.generateName")


def _provisioned(tmp_path):
    """A volume as a provisioner leaves it: a root-owned folder 0755 holding a file 0644 and a link to it."""
    root = tmp_path / "volume"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "data").write_text("x")
    (root / "link").symlink_to(root / "sub" / "data")
    for path, mode in ((root, 0o755), (root / "sub", 0o755), (root / "sub" / "data", 0o644)):
        os.chown(path, 0, 0)
        path.chmod(mode)
    return root


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group to another needs root, as the kubelet has")
def test_fsgroup_gives_the_volume_to_the_group_with_setgid_folders(tmp_path):
    root = _provisioned(tmp_path)
    set_volume_ownership(root, 2000)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) | (p.stat().st_mode & stat.S_ISGID)
             for p in (root, root / "sub", root / "sub" / "data")}
    assert modes == {"volume": 0o2775, "sub": 0o2775, "data": 0o664}
    assert {p.lstat().st_gid for p in (root, root / "sub", root / "sub" / "data", root / "link")} == {2000}
    assert {p.stat().st_uid for p in (root, root / "sub")} == {0}  # the owner stays


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group to another needs root, as the kubelet has")
def test_a_read_only_volume_gets_read_bits_and_on_root_mismatch_skips_a_volume_already_given(tmp_path):
    root = _provisioned(tmp_path)
    set_volume_ownership(root, 2000, read_only=True)
    assert stat.S_IMODE((root / "sub" / "data").stat().st_mode) == 0o644
    (root / "sub" / "later").write_text("y")
    os.chown(root / "sub" / "later", 0, 0)
    set_volume_ownership(root, 2000, read_only=True, policy="OnRootMismatch")
    assert (root / "sub" / "later").stat().st_gid == 0  # the root matched: nothing walked
    set_volume_ownership(root, 2000, read_only=True)
    assert (root / "sub" / "later").stat().st_gid == 2000


# kubernetes pkg/volume/volume_linux_test.go (commit 030880a5dc54), TestSkipPermissionChange's cases: policy, the
# root's group is fsGroup, the root has rw+x for the group, the root has setgid; whether the walk is skipped
SKIP_PERMISSION_VECTORS = [
    (None, False, False, False, False), ("Always", False, False, False, False), ("Always", True, False, False, False),
    (None, True, False, False, False), ("OnRootMismatch", False, False, False, False),
    ("OnRootMismatch", True, False, False, False), ("OnRootMismatch", True, True, False, False),
    ("OnRootMismatch", True, True, True, True),
]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group to another needs root, as the kubelet has")
@pytest.mark.parametrize("policy, gid_match, permission_match, sgid_match, skipped", SKIP_PERMISSION_VECTORS)
def test_on_root_mismatch_skips_the_walk_only_as_the_kubelets_cases_say(
        tmp_path, policy, gid_match, permission_match, sgid_match, skipped):
    root = tmp_path / "volume"
    root.mkdir(mode=0o700)
    gid = root.stat().st_gid
    mask = RW_MASK | (EXEC_MASK if permission_match else 0) | (stat.S_ISGID if sgid_match else 0)
    root.chmod(stat.S_IMODE(root.stat().st_mode) | mask)
    inside = root / "file"
    inside.write_text("x")
    inside.chmod(0o600)
    set_volume_ownership(root, gid if gid_match else gid + 3000, **({"policy": policy} if policy else {}))
    assert (stat.S_IMODE(inside.stat().st_mode) == 0o600) == skipped


def _directory_permission(path) -> bool:
    """volume_linux_test.go ``verifyDirectoryPermission`` (read-write): rw+x for the group and setgid."""
    mode = path.lstat().st_mode
    wanted = RW_MASK | EXEC_MASK
    return stat.S_IMODE(mode) & wanted == wanted and bool(mode & stat.S_ISGID)


# volume_linux_test.go TestSetVolumeOwnershipMode's cases: policy, the root's mode set up, the rogue folder's mode;
# whether the rogue folder ends with the kubelet's permissions
OWNERSHIP_MODE_VECTORS = [
    ("Always", "valid", "no setgid", True),
    ("OnRootMismatch", "valid", RW_MASK, False),
    ("OnRootMismatch", 0o770, RW_MASK, True),
]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group to another needs root, as the kubelet has")
@pytest.mark.parametrize("policy, root_mode, rogue_mode, fixed", OWNERSHIP_MODE_VECTORS)
def test_set_volume_ownership_mode_follows_the_kubelets_cases(tmp_path, policy, root_mode, rogue_mode, fixed):
    root = tmp_path / "volume"
    root.mkdir(mode=0o700)
    mode = stat.S_IMODE(root.stat().st_mode)
    root.chmod(mode | RW_MASK | stat.S_ISGID | EXEC_MASK if root_mode == "valid" else root_mode)
    rogue = root / "roguedir"
    rogue.mkdir()
    rogue.chmod(mode & ~stat.S_ISGID if rogue_mode == "no setgid" else rogue_mode)
    set_volume_ownership(root, root.stat().st_gid, policy=policy)
    assert _directory_permission(rogue) == fixed


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group to another needs root, as the kubelet has")
@pytest.mark.parametrize("fs_group, link", [(None, False), (3000, False), (3000, True)])
def test_set_volume_ownership_owner_follows_the_kubelets_cases(tmp_path, fs_group, link):
    """volume_linux_test.go TestSetVolumeOwnershipOwner: fsGroup nil changes nothing; 3000 gives a file and a symlink
    (lchown) the group, the owner kept."""
    (tmp_path / "file.txt").touch(mode=0o755)
    checked = tmp_path / "file.txt"
    if link:
        checked = tmp_path / "file_link.txt"
        checked.symlink_to(tmp_path / "file.txt")
    set_volume_ownership(tmp_path, fs_group)
    assert (checked.lstat().st_uid, checked.lstat().st_gid) == (os.geteuid(), os.getgid() if fs_group is None
                                                                else fs_group)


def _waiting_message(cluster, pod: str) -> str:
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())

    def waiting():
        statuses = core.read_namespaced_pod(pod, "default").status.container_statuses or []
        state = statuses[0].state.waiting if statuses else None
        return state if state and state.reason == "CreateContainerConfigError" else None

    return wait_for(f"{pod} to be refused by the kubelet", waiting).message


@pytest.mark.parametrize("change, message", [
    (lambda pod: pod.update(volumes=[{"name": "token", "secret": {"secretName": "s"}}]) or pod["containers"][0].update(
        volumeMounts=[{"name": "token", "mountPath": "/token"}]),
     "spec.volumes[0] ('token'): secret is not emulated by the test cluster's kubelet (only persistentVolumeClaim, "
     "emptyDir, projected)"),
    (lambda pod: pod["containers"][0].update(envFrom=[{"configMapRef": {"name": "c"}}]),
     "spec.containers[pytorch].envFrom is not emulated by the test cluster's kubelet: list the variables under env"),
    (lambda pod: pod["containers"][0]["env"].append(
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}),
     "spec.containers[pytorch].env[1].valueFrom.configMapKeyRef (X) is not emulated by the test cluster's kubelet "
     "(only fieldRef and secretKeyRef)"),
    (lambda pod: pod["containers"][0].update(volumeMounts=[{"name": "nowhere", "mountPath": "/x"}]),
     'spec.containers[pytorch].volumeMounts[0].name: Not found: "nowhere"'),
], ids=["secret-volume", "envFrom", "configMapKeyRef", "missing-volume"])
def test_what_the_kubelet_does_not_emulate_is_refused_by_name(cluster, change, message):
    from kubernetes import client

    body = pytorchjob("unemulated", ["true"], workers=0)
    change(body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"])
    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", body)
    assert _waiting_message(cluster, "unemulated-master-0") == message


def test_env_values_and_the_command_are_expanded_with_the_containers_env(cluster):
    from kubernetes import client

    out = cluster.shared / "expanded"
    body = pytorchjob("expanding", [PYTHON, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text("
                                    "sys.argv[2] + ' ' + __import__('os').environ['GREETING'])", str(out),
                                    "$(OWN)-$$(OWN)"], workers=0)
    body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "GREETING", "value": "hello $(OWN) $(UNDEFINED)"})
    client.CustomObjectsApi(cluster.api()).create_namespaced_custom_object(
        "kubeflow.org", "v1", "default", "pytorchjobs", body)
    wait_for("the pod to write its arguments", out.is_file)
    wait_for("the whole line", lambda: out.read_text().endswith(")"))
    assert out.read_text() == "kept-$(OWN) hello kept $(UNDEFINED)"


@pytest.mark.parametrize("cluster", [{"capacity": {"cpu": 2.0}}], indirect=True)
def test_a_pod_the_node_has_no_room_for_waits_unschedulable_until_room_frees(cluster):
    """A node of 2 CPUs and two jobs of 1.5: the second one's pod is Unschedulable (FailedScheduling) while the
    first one's runs, and is bound once that has ended."""
    from kubernetes import client

    release = cluster.shared / "release"
    custom, core = client.CustomObjectsApi(cluster.api()), client.CoreV1Api(cluster.api())

    def create(name: str, command: list[str]) -> None:
        body = pytorchjob(name, command, workers=0)
        body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "1500m"}}
        custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", body)

    def phase(pod: str) -> str:
        return core.read_namespaced_pod(pod, "default").status.phase

    create("first", [PYTHON, "-c", f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"])
    wait_for("the first pod to run", lambda: phase("first-master-0") == "Running")
    create("second", ["true"])
    (event,) = wait_for("the second pod's FailedScheduling event", lambda: [
        e for e in core.list_namespaced_event("default").items
        if e.reason == "FailedScheduling" and e.involved_object.name == "second-master-0"])
    assert event.message.startswith("0/1 nodes are available: 1 Insufficient cpu.")
    second = core.read_namespaced_pod("second-master-0", "default")
    assert second.status.phase == "Pending" and second.status.conditions[0].reason == "Unschedulable"
    release.write_text("")
    wait_for("the second pod to run once the first ended", lambda: phase("second-master-0") == "Succeeded")
    assert phase("first-master-0") == "Succeeded"

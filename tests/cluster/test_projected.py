"""The test cluster's kubelet writes a ``projected`` volume (``cluster.k8s_operator.projected_folder``) as the
kubelet's ``collectData`` does, checked with the kubelet's own cases: kubernetes
``pkg/volume/projected/projected_test.go`` at master 059ce4e8a1d958959595b970acaf846259348518 (as mirrored in
sanposhiho/kubernetes; the same cases stand in the newest copy the library holds, which also has
TestCollectDataWithClusterTrustBundle). Each case is named as upstream names it.

Where the test cluster differs, the vectors say so: its only ConfigMap is ``kube-root-ca.crt`` (key ``ca.crt``), so
TestCollectDataWithConfigMap runs against it with upstream's keys ``foo`` and ``bar`` both read from ``ca.crt``
(``zab`` stays missing); its tokens do not expire, so the token upstream's fake TokenRequest writes
(``namespace:name:expiration:[audiences]``) is checked without its expiration. Left out: "no default mode" (the API
server defaults ``defaultMode``, so a stored pod never lacks it), TestCanSupport, TestPlugin, TestInvalidPathProjected,
TestPluginReboot, TestPluginOptional and TestPluginOptionalKeys (the plugin's mount machinery over a Secret)."""
from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest
from cluster.k8s_operator import projected_folder
from cluster.k8s_server import K8sServer

NAMESPACE = "test_projected_namespace"
CA = "<the cluster's CA>"
"""Stands for ``K8sServer.ca_pem`` in the expected files."""


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """A test API server whose TokenRequests answer as upstream's fake client does (its ``create serviceaccounts``
    reactor: ``https://api`` when no audience is asked), less the expiration."""
    with K8sServer(tmp_path_factory.mktemp("k8s")) as server:
        for audience in ("", "https://example.com"):
            server.token_audiences[audience] = (
                lambda namespace, name, audience=audience: f"{namespace}:{name}:[{audience or 'https://api'}]")
        yield server


def _files(api, folder_root, sources, *, default_mode=0o644, metadata=None, spec=None):
    """``{path: (content, mode, owner)}`` of the projected volume the kubelet writes for a pod of ``metadata`` and
    ``spec`` (a container added), the CA's text as :data:`CA`."""
    pod = {"metadata": {"name": "podName", "namespace": NAMESPACE, **(metadata or {})},
           "spec": {"containers": [{"name": "c"}], **(spec or {})}}
    volume = {"name": "vol", "projected": {"sources": sources, "defaultMode": default_mode}}
    folder = projected_folder(SimpleNamespace(api=api, namespace=NAMESPACE, dir=folder_root), pod, volume)
    return {str(path.relative_to(folder)): (path.read_text().replace(api.ca_pem.decode(), CA),
                                            stat.S_IMODE(path.stat().st_mode), path.stat().st_uid)
            for path in folder.rglob("*") if path.is_file()}


ME = os.geteuid()
FS_USER = 1000 if ME == 0 else ME
"""Who a token given to ``runAsUser`` 1000 belongs to: 1000 under a root kubelet; a non-root one keeps its own."""

# TestCollectDataWithConfigMap: name, items, optional, files (None: the mount fails)
CONFIG_MAP_CASES = [
    ("no overrides", None, False, {"ca.crt": (CA, 0o644)}),
    ("basic 1", [{"key": "foo", "path": "path/to/foo.txt"}], False, {"path/to/foo.txt": (CA, 0o644)}),
    ("subdirs", [{"key": "foo", "path": "path/to/1/2/3/foo.txt"}], False, {"path/to/1/2/3/foo.txt": (CA, 0o644)}),
    ("subdirs 2", [{"key": "foo", "path": "path/to/1/2/3/foo.txt"}], False,
     {"path/to/1/2/3/foo.txt": (CA, 0o644)}),
    ("subdirs 3", [{"key": "foo", "path": "path/to/1/2/3/foo.txt"},
                   {"key": "bar", "path": "another/path/to/the/esteemed/bar.bin"}], False,
     {"path/to/1/2/3/foo.txt": (CA, 0o644), "another/path/to/the/esteemed/bar.bin": (CA, 0o644)}),
    ("non existent key", [{"key": "zab", "path": "path/to/foo.txt"}], False, None),
    ("mapping with Mode", [{"key": "foo", "path": "foo.txt", "mode": 0o400},
                           {"key": "bar", "path": "bar.bin", "mode": 0o400}], False,
     {"foo.txt": (CA, 0o400), "bar.bin": (CA, 0o400)}),
    ("mapping with defaultMode", [{"key": "foo", "path": "foo.txt"}, {"key": "bar", "path": "bar.bin"}], False,
     {"foo.txt": (CA, 0o644), "bar.bin": (CA, 0o644)}),
    ("optional non existent key", [{"key": "zab", "path": "path/to/foo.txt"}], True, {}),
]


@pytest.mark.parametrize("name, items, optional, want", CONFIG_MAP_CASES, ids=[c[0] for c in CONFIG_MAP_CASES])
def test_collect_data_with_the_root_ca_config_map(api, tmp_path, name, items, optional, want):
    keys = {"foo": "ca.crt", "bar": "ca.crt"}
    source = {"name": "kube-root-ca.crt", "optional": optional}
    if items:
        source["items"] = [{**item, "key": keys.get(item["key"], item["key"])} for item in items]
    if want is None:
        with pytest.raises(ValueError, match="^configmap references non-existent config key: zab$"):
            _files(api, tmp_path, [{"configMap": source}])
    else:
        assert _files(api, tmp_path, [{"configMap": source}]) == {
            path: (content, mode, ME) for path, (content, mode) in want.items()}


_ANNOTATED = {"annotations": {"a1": "value1", "a2": "value2"}}
# TestCollectDataWithDownwardAPI: name, path, fieldPath, pod metadata, content (None: the mount fails)
DOWNWARD_API_CASES = [
    ("annotation", "annotation", "metadata.annotations['a1']", _ANNOTATED, "value1"),
    ("annotation-error", "annotation", "metadata.annotations['']", _ANNOTATED, None),
    ("labels", "labels", "metadata.labels", {"labels": {"key1": "value1", "key2": "value2"}},
     'key1="value1"\nkey2="value2"'),
    ("annotations", "annotations", "metadata.annotations", _ANNOTATED, 'a1="value1"\na2="value2"'),
    ("name", "name_file_name", "metadata.name", {}, "podName"),
    ("namespace", "namespace_file_name", "metadata.namespace", {}, NAMESPACE),
]


@pytest.mark.parametrize("name, path, field_path, metadata, content", DOWNWARD_API_CASES,
                         ids=[c[0] for c in DOWNWARD_API_CASES])
def test_collect_data_with_downward_api(api, tmp_path, name, path, field_path, metadata, content):
    sources = [{"downwardAPI": {"items": [{"path": path, "fieldRef": {"fieldPath": field_path}}]}}]
    if content is None:
        with pytest.raises(ValueError, match=r"^invalid key subscript in metadata\.annotations\[''\]: name part "
                                             "must be non-empty"):
            _files(api, tmp_path, sources, metadata=metadata)
    else:
        assert _files(api, tmp_path, sources, metadata=metadata) == {path: (content, 0o644, ME)}


# TestCollectDataWithServiceAccountToken: name, audience, expirationSeconds, path, fsUser, fsGroup, files
_TOKEN = f"{NAMESPACE}:foo:[https://api]"
SERVICE_ACCOUNT_TOKEN_CASES = [
    ("good service account", "https://example.com", 60, "token", None, None,
     {"token": (f"{NAMESPACE}:foo:[https://example.com]", 0o644, ME)}),
    ("good service account other path", "https://example.com", 60, "other-token", None, None,
     {"other-token": (f"{NAMESPACE}:foo:[https://example.com]", 0o644, ME)}),
    ("good service account defaults audience", None, 60, "token", None, None, {"token": (_TOKEN, 0o644, ME)}),
    ("good service account defaults expiration", None, None, "token", None, None, {"token": (_TOKEN, 0o644, ME)}),
    ("fsUser != nil", None, None, "token", 1000, None, {"token": (_TOKEN, 0o600, FS_USER)}),
    ("fsGroup != nil", None, None, "token", None, 1000, {"token": (_TOKEN, 0o600, ME)}),
    ("fsUser != nil && fsGroup != nil", None, None, "token", 1000, 1000, {"token": (_TOKEN, 0o600, FS_USER)}),
]


@pytest.mark.parametrize("name, audience, expiration, path, fs_user, fs_group, want", SERVICE_ACCOUNT_TOKEN_CASES,
                         ids=[c[0] for c in SERVICE_ACCOUNT_TOKEN_CASES])
def test_collect_data_with_service_account_token(api, tmp_path, name, audience, expiration, path, fs_user, fs_group,
                                                 want):
    token = {"path": path, "audience": audience, "expirationSeconds": expiration}
    context = {"runAsUser": fs_user, "fsGroup": fs_group}
    spec = {"serviceAccountName": "foo", "securityContext": {k: v for k, v in context.items() if v is not None}}
    assert _files(api, tmp_path, [{"serviceAccountToken": {k: v for k, v in token.items() if v is not None}}],
                  spec=spec) == want


def test_a_volume_stored_without_default_mode_gets_the_api_servers_0644(api, tmp_path):
    pod = {"metadata": {"name": "p", "namespace": NAMESPACE}, "spec": {"containers": [{"name": "c"}]}}
    volume = {"name": "v", "projected": {"sources": [{"downwardAPI": {"items": [
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}, "mode": 0o440}]}}]}}
    folder = projected_folder(SimpleNamespace(api=api, namespace=NAMESPACE, dir=tmp_path), pod, volume)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {"name": 0o644, "uid": 0o440}


def test_a_second_setup_writes_read_only_files_again(api, tmp_path):
    source = {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca", "mode": 0o400}]}}
    _files(api, tmp_path, [source])
    assert _files(api, tmp_path, [source]) == {"ca": (CA, 0o400, ME)}


def test_every_sources_errors_fail_the_mount_together(api, tmp_path):
    sources = [{"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "zab", "path": "x"}]}},
               {"downwardAPI": {"items": [{"path": "node", "fieldRef": {"fieldPath": "spec.nodeName"}}]}}]
    with pytest.raises(ValueError) as refused:
        _files(api, tmp_path, sources)
    assert str(refused.value) == ("[configmap references non-existent config key: zab, unsupported fieldPath: "
                                  "spec.nodeName]")


_KEY_CASES = [c[0] for c in CONFIG_MAP_CASES]
"""TestCollectDataWithConfigMap's cases, which TestCollectDataWithSecret names alike."""
REFUSED = [
    *((f"TestCollectDataWithSecret/{case}", {"secret": {"name": case}}) for case in _KEY_CASES),
    *((f"TestCollectDataWithConfigMap/{case}", {"configMap": {"name": case}}) for case in _KEY_CASES),
    ("TestCollectDataWithClusterTrustBundle/single ClusterTrustBundle by name",
     {"clusterTrustBundle": {"name": "foo", "path": "bundle.pem"}}),
    ("TestCollectDataWithClusterTrustBundle/single ClusterTrustBundle by signer name",
     {"clusterTrustBundle": {"signerName": "foo.example/bar", "labelSelector": {"matchLabels": {"key": "non-value"}},
                             "path": "bundle.pem"}}),
    ("TestCollectDataWithClusterTrustBundle/single ClusterTrustBundle by name, non-default mode",
     {"clusterTrustBundle": {"name": "foo", "path": "bundle.pem"}}),
]


@pytest.mark.parametrize("case, source", REFUSED, ids=[c[0] for c in REFUSED])
def test_sources_not_emulated_are_refused_by_name(api, tmp_path, case, source):
    (kind,) = source
    with pytest.raises(ValueError) as refused:
        _files(api, tmp_path, [source])
    assert str(refused.value) == (f"spec.volumes[vol].projected source ['{kind}'] is not emulated by the test "
                                  "cluster's kubelet (only serviceAccountToken, the kube-root-ca.crt ConfigMap and "
                                  "downwardAPI)")


def test_a_resource_field_ref_item_is_refused_by_name(api, tmp_path):
    item = {"path": "cpu_limit", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}}
    with pytest.raises(ValueError) as refused:
        _files(api, tmp_path, [{"downwardAPI": {"items": [item]}}])
    assert str(refused.value) == ("spec.volumes[vol].projected downwardAPI item 'cpu_limit': only a fieldRef is "
                                  "emulated by the test cluster's kubelet")

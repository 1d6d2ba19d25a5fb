"""The Kubernetes test cluster's Docker kubelet (``K8sServer(runtime=DockerRuntime())``): each pod container a
container of its image on the Docker daemon ``DOCKER_HOST`` names, as the kubelet's Docker runtime made it.

Taken from the kubelet (kubernetes ``pkg/kubelet/kuberuntime/kuberuntime_container.go``, ``security_context.go``,
``pkg/kubelet/dockershim/helpers.go`` and ``naming.go`` of 1.23, the last with dockershim):

- ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD (an image's CMD never follows a given command),
  both with ``$(VAR)`` of the container's env expanded; ``env`` with ``secretKeyRef`` and ``fieldRef`` resolved
  (``cluster.k8s_operator.container_env``); ``workingDir``.
- ``securityContext``, the container's over the pod's: ``runAsUser``/``runAsGroup`` as the container's user,
  ``readOnlyRootFilesystem``, ``capabilities`` add/drop, ``allowPrivilegeEscalation: false`` as
  ``no-new-privileges``; ``runAsNonRoot`` verified against the image's user (``verifyRunAsNonRoot``: a non-numeric
  or zero user is a CreateContainerConfigError).
- volumes: a ``persistentVolumeClaim`` is the claim's host folder (``K8sServer.volumes``) as its provisioner left it
  (owner and mode untouched: a root-owned volume is not writable by a non-root user), bound at every pod that mounts
  it (``subPath``, ``readOnly``); an ``emptyDir`` a folder of the pod made ``0777`` (``pkg/volume/emptydir/
  empty_dir.go`` ``defaultPerm``), or a tmpfs of ``sizeLimit`` when its ``medium`` is ``Memory``; a memory
  ``emptyDir`` at ``/dev/shm`` sizes the container's shm; a ``projected`` volume is a read-only folder of its files
  (``k8s_operator.projected_folder``). The pod's ``securityContext.fsGroup`` is applied to all three kinds (a
  projected one read-only) as the kubelet's volume ownership code does (:func:`set_volume_ownership`) and joins the
  container's supplementary groups with ``supplementalGroups`` (``pkg/kubelet/kuberuntime/security_context.go``
  ``determineEffectiveSecurityContext``); the claims stand for volumes whose driver supports fsGroup (block volumes;
  a CSI driver with ``fsGroupPolicy: File``).
- ``resources.limits`` cpu and memory as the container's CPU quota and memory limit (OOMKilled from the daemon).
- container names ``k8s_<container>_<pod>_<namespace>_<uid>_<attempt>`` and the ``io.kubernetes.*`` labels,
  ``containerID`` ``docker://<id>``; a container stays after it ends, so its exit code, user and image can be read
  back from the daemon; ``pods/log`` is the container's log as the daemon keeps it.

Differences from a cluster, as in the process kubelet: every pod shares the host network (the test servers listen
on loopback), so pod names resolve to 127.0.0.1 through each container's ``/etc/hosts`` (the job's hosts file), and
the cluster DNS's ``nslookup`` is the job's ``bin/nslookup`` answering from it, bound at ``/usr/local/bin/nslookup``
(the operator's init container asks it for the master); the hostname stays the host's; no image is pulled: one the
daemon lacks is ImagePullBackOff.
"""
from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
from docker.types import Mount

from cluster.k8s_operator import (STOP_GRACE_SECONDS, Container, container_env, container_volumes, expand,
                                  projected_folder, quantity)

if TYPE_CHECKING:
    from cluster.k8s_operator import _JobController

POD_LABEL, CONTAINER_LABEL = "io.kubernetes.pod.name", "io.kubernetes.container.name"
"""dockershim's labels on every container of a pod (``pkg/kubelet/types/labels.go``)."""
RW_MASK, RO_MASK, EXEC_MASK = 0o660, 0o440, 0o110
"""``rwMask``, ``roMask``, ``execMask`` of kubernetes ``pkg/volume/volume_linux.go``."""


def set_volume_ownership(root: Path, fs_group: int | None, *, read_only: bool = False,
                         policy: str = "Always") -> None:
    """The kubelet's ``SetVolumeOwnership`` (kubernetes ``pkg/volume/volume_linux.go``: ``ChangePermissions``,
    ``changeFilePermission``, ``skipPermissionChange``): every file and folder under ``root`` gets group
    ``fs_group`` (``lchown``, owner kept) and its mode or'ed with ``rw`` for the group (``r`` when ``read_only``),
    folders also ``x`` and setgid, so what the pod creates there belongs to ``fs_group`` too; symlinks are not
    chmodded. With ``policy`` ``OnRootMismatch`` nothing changes when ``root`` already has that group, those bits and
    setgid (``requiresPermissionChange``). Like upstream, a file that cannot be changed (here: one removed while
    walked, as another pod's writer renames its temp files) is skipped, not an error. No ``fs_group``: nothing
    changes. Upstream's own cases are ported in tests/cluster/test_k8s_kubelet.py."""
    if fs_group is None:
        return
    mask = RO_MASK if read_only else RW_MASK
    if policy == "OnRootMismatch":
        info = root.stat()
        wanted = mask | EXEC_MASK
        if info.st_gid == fs_group and stat.S_ISDIR(info.st_mode) and info.st_mode & wanted == wanted \
                and info.st_mode & stat.S_ISGID:
            return
    for folder, dirs, files in os.walk(root):
        for path in [Path(folder)] + [Path(folder) / name for name in dirs + files]:
            try:
                os.lchown(path, -1, fs_group)
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    continue
                extra = mask | (stat.S_ISGID | EXEC_MASK if stat.S_ISDIR(info.st_mode) else 0)
                path.chmod(stat.S_IMODE(info.st_mode) | extra)
            except FileNotFoundError:
                continue


@dataclass
class _DockerContainer:
    """A started container and the thread that copies its log (the daemon's) into the pod's log file."""

    container: Any
    copier: threading.Thread

    @property
    def id(self) -> str:
        return f"docker://{self.container.id}"

    @property
    def pid(self) -> int | None:
        try:
            self.container.reload()
        except docker.errors.NotFound:  # removed since
            return None
        return self.container.attrs["State"]["Pid"] or None

    def wait(self) -> int:
        code = self.container.wait()["StatusCode"]
        self.copier.join()
        return code

    def running(self) -> bool:
        return self.copier.is_alive()

    def oom_killed(self) -> bool:
        self.container.reload()
        return bool(self.container.attrs["State"]["OOMKilled"])

    def kill(self) -> None:
        try:
            self.container.kill()
        except docker.errors.APIError:  # it ended meanwhile
            pass

    def stop(self) -> None:
        """``docker stop``: SIGTERM, SIGKILL after STOP_GRACE_SECONDS."""
        try:
            self.container.stop(timeout=int(STOP_GRACE_SECONDS))
        except docker.errors.APIError:  # ended, or removed, meanwhile
            pass
        self.copier.join()


@dataclass(kw_only=True)
class DockerRuntime:
    """Runs each pod container as a container of its image (see the module docstring)."""

    client: Any = field(default_factory=docker.from_env)
    started: list[Any] = field(default_factory=list)
    """Every container it started, in order (kept after they end; :meth:`remove_all` removes them)."""

    def remove_all(self) -> None:
        """Remove every container it started (the test cluster's teardown)."""
        for container in self.started:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass

    def has_image(self, image: str) -> bool:
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound:
            return False
        return True

    def start(self, job: _JobController, pod: dict, container: dict, log: Path, attempt: int) -> Container:
        meta = pod["metadata"]
        context = {**pod["spec"].get("securityContext", {}), **container.get("securityContext", {})}
        user = self._user(container["image"], context)
        mounts, shm_size = self._mounts(job, pod, container)
        limits = (container.get("resources") or {}).get("limits", {})
        capabilities = context.get("capabilities") or {}
        environment = container_env(job.api, job.namespace, pod, container)
        command, args = ([expand(a, environment) for a in part] if part else part
                         for part in (container.get("command"), container.get("args")))
        hosts = [name for line in job.hosts.read_text().splitlines()[1:] for name in line.split()[1:]]
        pod_context = pod["spec"].get("securityContext", {})
        groups = [str(g) for g in ([pod_context["fsGroup"]] if "fsGroup" in pod_context else [])
                  + pod_context.get("supplementalGroups", [])]
        created = self.client.containers.run(
            container["image"], detach=True, network_mode="host",
            name=f"k8s_{container['name']}_{meta['name']}_{job.namespace}_{meta['uid']}_{attempt}",
            entrypoint=command[:1] if command else None,
            command=(command[1:] + (args or [])) if command else args,
            environment=environment,
            working_dir=container.get("workingDir") or None, user=user,
            read_only=bool(context.get("readOnlyRootFilesystem")),
            cap_drop=capabilities.get("drop") or None, cap_add=capabilities.get("add") or None,
            security_opt=["no-new-privileges"] if context.get("allowPrivilegeEscalation") is False else None,
            group_add=groups or None,
            mounts=mounts, shm_size=shm_size, extra_hosts={name: "127.0.0.1" for name in hosts},
            nano_cpus=int(quantity(limits["cpu"]) * 1e9) if "cpu" in limits else None,
            mem_limit=int(quantity(limits["memory"])) if "memory" in limits else None,
            labels={POD_LABEL: meta["name"], "io.kubernetes.pod.namespace": job.namespace,
                    "io.kubernetes.pod.uid": meta["uid"], CONTAINER_LABEL: container["name"]})
        self.started.append(created)
        copier = threading.Thread(target=_copy_log, args=(created, log), daemon=True)
        copier.start()
        return _DockerContainer(created, copier)

    def _user(self, image: str, context: dict) -> str | None:
        """The container's ``user:group`` (None: the image's), after ``verifyRunAsNonRoot``.

        Raises:
            ValueError: ``runAsNonRoot`` and the user is root or not numeric.
        """
        uid, gid = context.get("runAsUser"), context.get("runAsGroup")
        if context.get("runAsNonRoot"):
            if uid is None:
                image_user = (self.client.images.get(image).attrs["Config"].get("User") or "0").split(":")[0]
                if not image_user.isdigit():
                    raise ValueError(f"container has runAsNonRoot and image has non-numeric user ({image_user}), "
                                     "cannot verify user is non-root")
                uid = int(image_user)
            if int(uid) == 0:
                raise ValueError("container's runAsUser breaks non-root policy")
        if context.get("runAsUser") is None:
            return None
        return f"{uid}:{gid}" if gid is not None else str(uid)

    def _mounts(self, job: _JobController, pod: dict, container: dict) -> tuple[list[Mount], str | None]:
        """The container's mounts, and its shm size (a memory emptyDir at ``/dev/shm``).

        Raises:
            ValueError: a claim with no host folder, or a volume kind the test cluster does not emulate.
        """
        mounts = [Mount("/usr/local/bin/nslookup", str(job.bin / "nslookup"), type="bind", read_only=True)]
        shm_size = None
        context = pod["spec"].get("securityContext", {})
        fs_group, policy = context.get("fsGroup"), context.get("fsGroupChangePolicy", "Always")
        for mount, volume in container_volumes(pod, container):
            target, read_only = mount["mountPath"], bool(mount.get("readOnly"))
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if claim not in job.api.volumes:
                    raise ValueError(f'persistentvolumeclaim "{claim}" not found')
                set_volume_ownership(job.api.volumes[claim], fs_group, policy=policy,
                                     read_only=bool(volume["persistentVolumeClaim"].get("readOnly")))
                source = job.api.volumes[claim] / mount.get("subPath", "")
                mounts.append(Mount(target, str(source), type="bind", read_only=read_only))
            elif "projected" in volume:
                folder = projected_folder(job, pod, volume)
                set_volume_ownership(folder, fs_group, read_only=True)  # projected.go SetUpAt: no change policy
                mounts.append(Mount(target, str(folder), type="bind", read_only=True))
            else:
                empty = volume["emptyDir"] or {}
                size = int(quantity(empty["sizeLimit"])) if "sizeLimit" in empty else None
                if empty.get("medium") == "Memory" and target == "/dev/shm":
                    shm_size = str(size or 64 * 2**20)
                elif empty.get("medium") == "Memory":
                    mounts.append(Mount(target, None, type="tmpfs", tmpfs_size=size, read_only=read_only))
                else:
                    folder = job.dir / pod["metadata"]["name"] / "emptydir" / mount["name"]
                    folder.mkdir(parents=True, exist_ok=True)
                    folder.chmod(0o777)  # empty_dir.go setupDir: defaultPerm, whatever the umask
                    set_volume_ownership(folder, fs_group)  # empty_dir.go SetUpAt: no change policy
                    mounts.append(Mount(target, str(folder / mount.get("subPath", "")), type="bind",
                                        read_only=read_only))
        return mounts, shm_size


def _copy_log(container: Any, log: Path) -> None:
    """Append the container's log, as the daemon streams it, to the pod's log file until the container ends."""
    with log.open("ab") as out:
        for chunk in container.logs(stream=True, follow=True):
            out.write(chunk)
            out.flush()


def pod_records(client: Any, pod_prefix: str, container_name: str = "pytorch") -> list[dict]:
    """What the daemon holds of the pods whose names start with ``pod_prefix`` (a job's pods), one record per pod
    name, for ``e2e-summary.json``: ``name``, ``container_id``, ``image``, ``user``, ``exit_code`` of its newest
    ``container_name`` container (``pytorch`` in a PyTorchJob, ``node`` in a TrainJob; None while it runs) and
    ``restarts``: its containers before that one, whether restarted in place or in a recreated pod."""
    mains: dict[str, list] = {}
    for container in client.containers.list(all=True, filters={"label": f"{CONTAINER_LABEL}={container_name}"}):
        if container.labels[POD_LABEL].startswith(pod_prefix):
            mains.setdefault(container.labels[POD_LABEL], []).append(container)
    records = []
    for name, containers in sorted(mains.items()):
        newest = sorted(containers, key=lambda c: c.attrs["Created"])[-1].attrs
        records.append({"name": name, "container_id": newest["Id"], "image": newest["Config"]["Image"],
                        "user": newest["Config"]["User"],
                        "exit_code": None if newest["State"]["Running"] else newest["State"]["ExitCode"],
                        "restarts": len(containers) - 1})
    return records

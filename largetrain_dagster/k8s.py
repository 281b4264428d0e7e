"""The Kubernetes profile: the same assets on a cluster.

* Training: ``K8sTorchrunLauncher`` (a drop-in for the ``launcher`` resource) runs ``torchrun`` on
  ``nnodes`` pods with ``gpus_per_node`` GPUs each (``nvidia.com/gpu`` limits). Node 0 is started
  through ``PipesK8sClient`` (its rank 0 reports metrics to Dagster over Pipes, via its pod log); the
  other nodes are plain pods. They meet through torchrun's c10d rendezvous at node 0's stable DNS name
  ``<pod>-0.<headless service>.<namespace>.svc``, on ``rdzv_port``, with the Dagster run id as
  rendezvous id. All pods and the service are deleted when the step ends, fails or is cancelled
  (pod deletion sends SIGTERM to torchrun, which stops its ranks, then SIGKILL after the grace period:
  terminationGracePeriodSeconds and torchrun's shutdown timeout are the training's
  checkpointing.preemption_grace_seconds, the time its ranks have for their preemption save).
  Every node's torchrun writes its ranks' error files under ``<config dir>/torchelastic/<step>-<run id>/``
  on the shared volume, which a failed step reads back (resources.training_failure).
* Data preparation: ``data_partitions_k8s`` (the main chains' raw_corpus + cleaned_text, partitioned
  by DATA_PARTITIONS) and ``landed_partitions_k8s`` (the landed chain), partitioned jobs with
  dagster-k8s's ``k8s_job_executor``: every step (one partition of raw_corpus or cleaned_text) runs
  in its own Kubernetes Job/pod with the CPU and memory below. A backfill over all partitions is
  one run per partition; every pod gets the same LARGETRAIN_DATA_PARTITIONS.
* Storage: with an object-store root (``LARGETRAIN_ROOT=s3://bucket/prefix``, any fsspec URL), every
  pod reads and writes the bucket and keeps its working copies and shard cache on an ``emptyDir``
  volume at ``cache_path`` (``LARGETRAIN_CACHE``, ``cache_size`` its size limit): no shared volume.
  Credentials come from the pod's service account (IRSA, GKE workload identity) or, when present,
  the Secret ``credentials_secret`` (keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), never from the
  manifest; AWS_ENDPOINT_URL and AWS_DEFAULT_REGION are passed on from the Dagster process. The
  training config travels as an object beside the version (the pods read it by URL). With a
  local-path root, a ReadWriteMany volume (``storage_claim``) mounted at ``mount_path`` on every pod
  is the storage root. The instance is the PostgreSQL profile (deploy/dagster.postgres.yaml).

``build_k8s_definitions()`` returns the definitions for a cluster's code location
(``largetrain_dagster.k8s:defs``): image and sizes from LARGETRAIN_IMAGE, LARGETRAIN_K8S_NAMESPACE,
LARGETRAIN_NNODES, LARGETRAIN_GPUS_PER_NODE, and LARGETRAIN_K8S_SERVICE_ACCOUNT (every pod's service
account, training and data-prep steps alike; unset: the namespace's default). No cluster is contacted until a run starts;
``render()`` returns every object that a training would create, for review and for the tests.
"""

import math
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from dagster import AssetSelection, Definitions, define_asset_job

from largetrain_core.fs import is_url
from largetrain_core.launch import ENTRY_MODULE, module_entry, rank_env, torchrun_command
from largetrain_dagster.partitions import DATA_PARTITIONS
from largetrain_dagster.resources import TorchrunLauncher, training_failure
from largetrain_dagster.runner import reported_metadata

K8S_NAME = re.compile(r"[^a-z0-9-]")


def _dns(name: str, limit: int = 52) -> str:
    return K8S_NAME.sub("-", name.lower()).strip("-")[:limit].rstrip("-")


class K8sTorchrunLauncher(TorchrunLauncher):
    """Multi-node torchrun on Kubernetes (see the module docstring). ``nproc_per_node`` ranks per pod."""

    image: str = "largetrain:latest"
    namespace: str = "largetrain"
    nnodes: int = 2
    nproc_per_node: int = 8
    gpus_per_node: int = 8
    cpu_per_node: str = "64"
    memory_per_node: str = "512Gi"
    shm_size: str = "64Gi"
    rdzv_port: int = 29400
    storage_claim: str = "largetrain-storage"
    mount_path: str = "/data"
    storage_root: str | None = None
    cache_path: str = "/cache"
    cache_size: str = "500Gi"
    # of the cache volume, the share the streamed token shards may hold (the rest: checkpoints, working copies)
    shard_cache_fraction: float = 0.5
    credentials_secret: str = "largetrain-object-store"
    service_account: str | None = None
    pod_wait_timeout_seconds: float = 7 * 24 * 3600

    @property
    def shard_cache_bytes(self) -> int:
        """The shard cache's bound on every training pod: ``shard_cache_fraction`` of ``cache_size``."""
        from largetrain_core.cache import parse_bytes

        return int(parse_bytes(self.cache_size) * self.shard_cache_fraction)

    @property
    def object_store(self) -> bool:
        """Whether the storage root is an object-store URL (pods then share no volume)."""
        return self.storage_root is not None and is_url(self.storage_root)

    def names(self, run_id: str, step: str) -> tuple[str, str]:
        """(pod name prefix, headless service name) for one training step of one run."""
        base = _dns(f"lt-{step}-{run_id[:8]}", 40)
        return base, f"{base}-rdzv"

    def log_dir(self, config_path: str, run_id: str, step: str) -> str:
        """torchrun's --log-dir of one training step (every node's ranks' error files): beside the config on
        the shared volume, or on the pod's cache volume with an object-store root (read from the pod log then)."""
        base = PurePosixPath(self.cache_path) if self.object_store else PurePosixPath(config_path).parent
        return str(base / "torchelastic" / _dns(f"{step}-{run_id}"))

    def torchrun_command(
        self, config_path: str, rdzv_host: str, run_id: str, log_dir: str | None = None, module: str = ENTRY_MODULE
    ) -> list[str]:
        """A pod's torchrun command (largetrain_core.launch.torchrun_command): the image's ``python``, c10d
        rendezvous at ``rdzv_host:rdzv_port`` with the run id, no restarts (a failed pod fails the step, whose
        RetryPolicy decides)."""
        return torchrun_command(
            module_entry(module, config_path),
            self.nproc_per_node,
            rendezvous="c10d",
            nnodes=self.nnodes,
            host=rdzv_host,
            port=self.rdzv_port,
            rdzv_id=run_id,
            log_dir=log_dir,
            max_restarts=0,
            python="python",
        )

    def grace(self, grace_seconds: float | None) -> int:
        """The pods' terminationGracePeriodSeconds (whole seconds, rounded up): ``grace_seconds`` (a training's
        checkpointing.preemption_grace_seconds), else ``kill_grace_seconds`` + 20."""
        return math.ceil(grace_seconds) if grace_seconds is not None else int(self.kill_grace_seconds) + 20

    def pod_manifest(
        self,
        config_path: str,
        run_id: str,
        step: str,
        node: int,
        module: str = ENTRY_MODULE,
        grace_seconds: float | None = None,
    ) -> dict[str, Any]:
        """The pod of node ``node`` (0 .. nnodes-1), running ``module``, as a Kubernetes manifest dict (camelCase);
        ``grace_seconds``: its terminationGracePeriodSeconds and torchrun's shutdown timeout (:meth:`grace`)."""
        prefix, service = self.names(run_id, step)
        rdzv_host = f"{prefix}-0.{service}.{self.namespace}.svc.cluster.local"
        limits = {"cpu": self.cpu_per_node, "memory": self.memory_per_node}
        if self.gpus_per_node:
            limits["nvidia.com/gpu"] = str(self.gpus_per_node)
        spec: dict[str, Any] = {
            "hostname": f"{prefix}-{node}",
            "subdomain": service,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": self.grace(grace_seconds),
            "containers": [
                {
                    "name": "torchrun",
                    "image": self.image,
                    "command": self.torchrun_command(
                        config_path, rdzv_host, run_id, self.log_dir(config_path, run_id, step), module
                    ),
                    "env": [
                        *storage_env(
                            self.storage_root if self.object_store else self.mount_path,
                            self.cache_path,
                            self.credentials_secret,
                            self.shard_cache_bytes,
                        ),
                        *(
                            {"name": k, "value": v}
                            for k, v in rank_env(
                                max(1, int(float(self.cpu_per_node)) // self.nproc_per_node),
                                self.grace(grace_seconds),
                            ).items()
                        ),
                        {
                            "name": "WANDB_API_KEY",
                            "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key", "optional": True}},
                        },
                    ],
                    "ports": [{"containerPort": self.rdzv_port, "name": "rdzv"}],
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "volumeMounts": [
                        {"name": "storage", "mountPath": self.cache_path if self.object_store else self.mount_path},
                        {"name": "shm", "mountPath": "/dev/shm"},
                    ],
                }
            ],
            "volumes": [
                {"name": "storage", "emptyDir": {"sizeLimit": self.cache_size}}
                if self.object_store
                else {"name": "storage", "persistentVolumeClaim": {"claimName": self.storage_claim}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": self.shm_size}},
            ],
        }
        if self.gpus_per_node:
            spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        if self.service_account:
            spec["serviceAccountName"] = self.service_account
        meta = {
            "name": f"{prefix}-{node}",
            "namespace": self.namespace,
            "labels": {
                "app.kubernetes.io/name": "largetrain",
                "largetrain/training": prefix,
                "largetrain/node-rank": str(node),
            },
        }
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    def service_manifest(self, run_id: str, step: str) -> dict[str, Any]:
        """The headless service that gives node 0 its rendezvous DNS name."""
        prefix, service = self.names(run_id, step)
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": service,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "largetrain"},
            },
            "spec": {
                "clusterIP": "None",
                "selector": {"largetrain/training": prefix},
                "ports": [{"name": "rdzv", "port": self.rdzv_port, "targetPort": self.rdzv_port}],
                "publishNotReadyAddresses": True,
            },
        }

    def render(
        self, config_path: str, run_id: str, step: str, module: str = ENTRY_MODULE, grace_seconds: float | None = None
    ) -> dict[str, Any]:
        """Every object a training creates: ``{"service": V1Service, "pods": [V1Pod per node]}``, built with
        the kubernetes client models (unknown or misspelled fields raise); ``grace_seconds`` as in :meth:`pod_manifest`."""
        import kubernetes
        from dagster_k8s.models import k8s_model_from_dict, k8s_snake_case_dict
        from dagster_k8s.pipes import build_pod_body

        pods = []
        for node in range(self.nnodes):
            m = self.pod_manifest(config_path, run_id, step, node, module, grace_seconds)
            pods.append(
                build_pod_body(
                    pod_name=m["metadata"]["name"],
                    image=None,
                    command=None,
                    env_vars={},
                    base_pod_meta=m["metadata"],
                    base_pod_spec=m["spec"],
                )
            )
        svc = self.service_manifest(run_id, step)

        service = k8s_model_from_dict(
            kubernetes.client.V1Service,
            {
                "api_version": "v1",
                "kind": "Service",
                "metadata": k8s_snake_case_dict(kubernetes.client.V1ObjectMeta, svc["metadata"]),
                "spec": k8s_snake_case_dict(kubernetes.client.V1ServiceSpec, svc["spec"]),
            },
        )
        return {"service": service, "pods": pods}

    def pod_config_location(self, config_path: str) -> str:
        """Where the pods read the training config: uploaded beside its version under the object-store root
        (its URL), or the same file on the shared volume (its path there)."""
        if self.object_store:
            from largetrain_core.fs import filesystem
            from largetrain_core.storage import stored_location

            url = stored_location(Path(config_path))  # the config's working copy lies in the root's local mirror
            fs, path = filesystem(url)
            fs.put_file(str(config_path), path)
            return url
        return str(
            PurePosixPath(self.mount_path)
            / PurePosixPath(config_path).relative_to(os.environ.get("LARGETRAIN_ROOT", "/data"))
        )

    def run(
        self, context, config_path, log_path, module: str = ENTRY_MODULE, grace_seconds: float | None = None
    ) -> dict:
        """Create the service and the pods of nodes 1..N-1, run node 0 through PipesK8sClient, and delete
        everything afterwards. The config path must lie on the shared volume (the storage root).

        Raises resources.training_failure (the ranks' recorded errors, retried only when none is
        deterministic) when node 0's pod fails."""
        from dagster_k8s import PipesK8sClient
        from dagster_k8s.client import DagsterKubernetesClient

        cfg = self.pod_config_location(config_path)
        step = context.op.name if hasattr(context, "op") else "train"
        objects = self.render(cfg, context.run_id, step, module, grace_seconds)
        api = DagsterKubernetesClient.production_client().core_api
        api.create_namespaced_service(self.namespace, objects["service"])
        metadata: dict = {}
        try:
            for pod in objects["pods"][1:]:
                api.create_namespaced_pod(self.namespace, pod)
            node0 = self.pod_manifest(cfg, context.run_id, step, 0, module, grace_seconds)
            try:
                done = PipesK8sClient().run(
                    context=context,
                    namespace=self.namespace,
                    base_pod_meta=node0["metadata"],
                    base_pod_spec=node0["spec"],
                    pod_wait_timeout=self.pod_wait_timeout_seconds,
                )
            except Exception as e:
                here = (
                    Path(config_path).parent
                    / "torchelastic"
                    / PurePosixPath(self.log_dir(cfg, context.run_id, step)).name
                )
                raise training_failure(None, here, Path(log_path)) from e
            metadata = reported_metadata(done.get_results())
        finally:
            for pod in objects["pods"]:
                try:
                    api.delete_namespaced_pod(
                        pod.metadata.name, self.namespace, grace_period_seconds=self.grace(grace_seconds)
                    )
                except Exception as e:  # already gone
                    context.log.info(f"pod {pod.metadata.name}: {e.__class__.__name__}")
            api.delete_namespaced_service(objects["service"].metadata.name, self.namespace)
        return metadata


def data_prep_step_k8s_config(cpu: str = "4", memory: str = "16Gi") -> dict[str, Any]:
    """The per-step pod settings of ``landed_partitions_k8s``: one partition's worker (see
    docs/guides/running-at-scale.md for the memory per worker)."""
    return {
        "container_config": {
            "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
        }
    }


def storage_env(
    root: str, cache_path: str, credentials_secret: str, shard_cache_bytes: int | None = None
) -> list[dict[str, Any]]:
    """A pod's storage variables: LARGETRAIN_ROOT; with an object-store root also LARGETRAIN_CACHE,
    LARGETRAIN_SHARD_CACHE_BYTES (the training pods' streamed shards: ``shard_cache_bytes``), the
    endpoint and region this process uses (not secret), and the credentials as optional references to
    the Secret ``credentials_secret`` (absent: the service account's role is used)."""
    env: list[dict[str, Any]] = [{"name": "LARGETRAIN_ROOT", "value": root}]
    if not is_url(root):
        return env
    env.append({"name": "LARGETRAIN_CACHE", "value": cache_path})
    if shard_cache_bytes:
        env.append({"name": "LARGETRAIN_SHARD_CACHE_BYTES", "value": str(shard_cache_bytes)})
    env += [
        {"name": k, "value": os.environ[k]}
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION")
        if os.environ.get(k)
    ]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": credentials_secret, "key": k, "optional": True}}}
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    return env


def data_prep_executor_config(
    root: str,
    namespace: str,
    storage_claim: str,
    cache_path: str = "/cache",
    cache_size: str = "200Gi",
    credentials_secret: str = "largetrain-object-store",
    service_account: str | None = None,
) -> dict[str, Any]:
    """Config of dagster-k8s's k8s_job_executor for the data-preparation job: one Kubernetes Job per step,
    at most 64 at a time. With an object-store ``root`` each pod gets an ``emptyDir`` of ``cache_size`` at
    ``cache_path`` for its working copies (no shared volume) and the storage variables of
    :func:`storage_env`; with a local-path root, the ReadWriteMany claim ``storage_claim`` mounted at
    ``root`` is the storage root. ``service_account``: the step pods' service account (the one whose
    role reads the bucket, as the training pods'); None: the namespace's default."""
    partitions = f"LARGETRAIN_DATA_PARTITIONS={len(DATA_PARTITIONS.get_partition_keys())}"
    base = {"job_namespace": namespace, "image_pull_policy": "IfNotPresent", "max_concurrent": 64}
    if service_account:
        base["service_account_name"] = service_account
    if is_url(root):
        step = data_prep_step_k8s_config()
        step["container_config"]["env"] = storage_env(root, cache_path, credentials_secret)
        return {
            **base,
            "step_k8s_config": step,
            "env_vars": [partitions],
            "volume_mounts": [{"name": "cache", "mount_path": cache_path}],
            "volumes": [{"name": "cache", "empty_dir": {"size_limit": cache_size}}],
        }
    return {
        **base,
        "step_k8s_config": data_prep_step_k8s_config(),
        "volume_mounts": [{"name": "storage", "mount_path": root}],
        "volumes": [{"name": "storage", "persistent_volume_claim": {"claim_name": storage_claim}}],
        "env_vars": [f"LARGETRAIN_ROOT={root}", partitions],
    }


def build_k8s_definitions(root: str = "/data", image: str | None = None) -> Definitions:
    from dagster_k8s import k8s_job_executor

    from largetrain_dagster.definitions import build_definitions
    from largetrain_dagster.partitions import PARTITION_STEPS
    from largetrain_dagster.landing import landed_batches

    image = image or os.environ.get("LARGETRAIN_IMAGE", "largetrain:latest")
    base = build_definitions(root=root, wandb_mode=os.environ.get("LARGETRAIN_WANDB_MODE", "online"))
    launcher = K8sTorchrunLauncher(
        image=image,
        namespace=os.environ.get("LARGETRAIN_K8S_NAMESPACE", "largetrain"),
        nnodes=int(os.environ.get("LARGETRAIN_NNODES", "2")),
        gpus_per_node=int(os.environ.get("LARGETRAIN_GPUS_PER_NODE", "8")),
        nproc_per_node=int(os.environ.get("LARGETRAIN_GPUS_PER_NODE", "8")),
        mount_path="/data" if is_url(root) else root,
        storage_root=root,
        service_account=os.environ.get("LARGETRAIN_K8S_SERVICE_ACCOUNT") or None,
    )
    executor = k8s_job_executor.configured(
        data_prep_executor_config(
            root,
            launcher.namespace,
            launcher.storage_claim,
            launcher.cache_path,
            credentials_secret=launcher.credentials_secret,
            service_account=launcher.service_account,
        )
    )
    landed_job = define_asset_job(
        "landed_partitions_k8s",
        partitions_def=landed_batches,
        executor_def=executor,
        selection=AssetSelection.assets(["landed", "raw_corpus"], ["landed", "cleaned_text"]),
        description="One landed partition: raw_corpus then cleaned_text, each step in its own pod.",
    )
    data_job = define_asset_job(
        "data_partitions_k8s",
        partitions_def=DATA_PARTITIONS,
        executor_def=executor,
        selection=PARTITION_STEPS,
        description="One data partition of both corpora: raw_corpus then cleaned_text, each step in its own pod.",
    )
    return Definitions(
        assets=base.assets,
        jobs=[*base.jobs, data_job, landed_job],
        sensors=base.sensors,
        schedules=base.schedules,
        resources={**base.resources, "launcher": launcher},
    )


defs = build_k8s_definitions(root=os.environ.get("LARGETRAIN_ROOT", "/data"))

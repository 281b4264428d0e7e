"""The Kubernetes profile, rendered and validated offline (no cluster exists here).

Training pods: built with dagster-k8s's PipesK8sClient pod builder and the kubernetes client models
(unknown fields raise), GPU limits, one torchrun per node with a shared c10d rendezvous at node 0's
DNS name, which the headless service provides. Data-preparation steps: the Kubernetes Job that
dagster-k8s's k8s_job_executor creates for one partition step, from the job's executor config.
"""

import yaml

from helpers.lineage import PARTITION_KEYS


def test_training_pods_render_with_gpus_and_one_rendezvous(monkeypatch):
    import kubernetes

    from largetrain_dagster.k8s import K8sTorchrunLauncher

    launcher = K8sTorchrunLauncher(image="registry.example/largetrain:1", nnodes=4, nproc_per_node=8, gpus_per_node=8)
    run_id = "0f9e8d7c-6b5a-4321-8765-0123456789ab"
    objs = launcher.render("/data/base_checkpoint/abc/train_config.json", run_id, "base_checkpoint")
    pods, svc = objs["pods"], objs["service"]
    assert len(pods) == 4
    api = kubernetes.client.ApiClient()
    endpoints = set()
    for node, pod in enumerate(pods):
        assert isinstance(pod, kubernetes.client.V1Pod)
        manifest = api.sanitize_for_serialization(pod)
        # Round trip through YAML and the client's deserializer: what `kubectl apply` would read.
        again = api._ApiClient__deserialize(yaml.safe_load(yaml.safe_dump(manifest)), "V1Pod")
        assert again == pod
        (c,) = pod.spec.containers
        assert c.resources.limits["nvidia.com/gpu"] == "8" and c.resources.requests["nvidia.com/gpu"] == "8"
        assert c.command[:3] == ["python", "-m", "torch.distributed.run"]
        opts = dict(zip(c.command, c.command[1:]))
        assert opts["--nnodes"] == "4" and opts["--nproc_per_node"] == "8" and opts["--rdzv_id"] == run_id
        assert opts["--max_restarts"] == "0"
        assert c.command[-3:] == ["-m", "largetrain_core.training", "/data/base_checkpoint/abc/train_config.json"]
        endpoints.add(opts["--rdzv_endpoint"])
        assert pod.spec.hostname == f"{pod.metadata.name}" and pod.spec.subdomain == svc.metadata.name
        assert pod.spec.restart_policy == "Never"
        assert {v.name for v in pod.spec.volumes} == {"storage", "shm"}
        assert pod.metadata.labels["largetrain/node-rank"] == str(node)
        assert all(svc.spec.selector[k] == pod.metadata.labels[k] for k in svc.spec.selector)
        env = {e.name: e for e in c.env}
        assert env["WANDB_API_KEY"].value is None and env["WANDB_API_KEY"].value_from.secret_key_ref.name == "wandb"
    (endpoint,) = endpoints  # every node meets at the same place: node 0, through the headless service
    assert endpoint == f"{pods[0].spec.hostname}.{svc.metadata.name}.largetrain.svc.cluster.local:29400"
    assert svc.spec.cluster_ip == "None" and svc.spec.ports[0].port == 29400
    assert len(pods[0].metadata.name) <= 63 and all(p.metadata.name.islower() for p in pods)


def test_data_prep_partition_steps_run_as_separate_k8s_jobs():
    import kubernetes
    from dagster_k8s.job import (
        DagsterK8sJobConfig,
        UserDefinedDagsterK8sConfig,
        construct_dagster_k8s_job,
        get_k8s_job_name,
    )

    from largetrain_dagster.k8s import build_k8s_definitions, data_prep_executor_config

    defs = build_k8s_definitions(root="/data", image="registry.example/largetrain:1")
    job = defs.resolve_job_def("landed_partitions_k8s")
    assert job.executor_def.name == "k8s"
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {
        "landed/raw_corpus",
        "landed/cleaned_text",
    }
    assert job.partitions_def is not None and job.partitions_def.name == "landed_batches"
    data_job = defs.resolve_job_def("data_partitions_k8s")
    assert data_job.executor_def.name == "k8s"
    assert {k.to_user_string() for k in data_job.asset_layer.executable_asset_keys} == {
        f"{r}/{n}" for r in ("pretrain", "domain") for n in ("raw_corpus", "cleaned_text")
    }
    assert data_job.partitions_def.get_partition_keys() == PARTITION_KEYS
    assert type(defs.resources["launcher"]).__name__ == "K8sTorchrunLauncher"

    # The executor config is valid for dagster-k8s's k8s_job_executor ...
    from dagster._config import process_config
    from dagster_k8s import k8s_job_executor

    executor_cfg = data_prep_executor_config("/data", "largetrain", "largetrain-storage")
    checked = process_config(k8s_job_executor.config_schema.config_type, executor_cfg)
    assert checked.success, checked.errors
    # ... and the Job it creates for the step of one partition runs `dagster api execute_step` in its own pod.
    jc = DagsterK8sJobConfig(
        job_image="registry.example/largetrain:1",
        dagster_home="/opt/dagster/home",
        volume_mounts=executor_cfg["volume_mounts"],
        volumes=executor_cfg["volumes"],
        env_vars=executor_cfg["env_vars"],
    )
    name = get_k8s_job_name("run1234", "landed__cleaned_text")
    k8s_job = construct_dagster_k8s_job(
        jc,
        ["dagster", "api", "execute_step", "{}"],
        name,
        UserDefinedDagsterK8sConfig.from_dict(executor_cfg["step_k8s_config"]),
        pod_name=f"{name}-pod",
        component="step_worker",
    )
    assert isinstance(k8s_job, kubernetes.client.V1Job)
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(k8s_job)
    assert (
        kubernetes.client.ApiClient()._ApiClient__deserialize(yaml.safe_load(yaml.safe_dump(manifest)), "V1Job")
        == k8s_job
    )
    (c,) = k8s_job.spec.template.spec.containers
    assert c.resources.limits == {"cpu": "4", "memory": "16Gi"} and c.args[:3] == ["dagster", "api", "execute_step"]
    assert c.image == "registry.example/largetrain:1"
    assert any(e.name == "LARGETRAIN_ROOT" and e.value == "/data" for e in c.env)
    assert any(e.name == "LARGETRAIN_DATA_PARTITIONS" and e.value == str(len(PARTITION_KEYS)) for e in c.env)
    assert any(
        v.persistent_volume_claim and v.persistent_volume_claim.claim_name == "largetrain-storage"
        for v in k8s_job.spec.template.spec.volumes
    )


def test_with_an_object_store_root_pods_share_no_volume_and_read_the_bucket(monkeypatch):
    """LARGETRAIN_ROOT=s3://...: training pods and data-prep step Jobs get the root URL, an emptyDir cache at
    /cache (LARGETRAIN_CACHE) instead of the ReadWriteMany claim, the endpoint passed on, and the credentials
    only as optional references to a Secret: no secret value in any manifest."""
    import json

    import kubernetes
    from dagster._config import process_config
    from dagster_k8s import k8s_job_executor
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

    from largetrain_dagster.k8s import K8sTorchrunLauncher, data_prep_executor_config

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio.storage.svc:9000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak-this-secret")
    root = "s3://team-bucket/largetrain"
    launcher = K8sTorchrunLauncher(
        image="registry.example/largetrain:1",
        nnodes=2,
        nproc_per_node=8,
        gpus_per_node=8,
        storage_root=root,
        cache_size="800Gi",
    )
    cfg = f"{root}/base_checkpoint/abc/train_config.json"
    objs = launcher.render(cfg, "0f9e8d7c-6b5a-4321-8765-0123456789ab", "base_checkpoint")
    api = kubernetes.client.ApiClient()
    for pod in objs["pods"]:
        manifest = api.sanitize_for_serialization(pod)
        assert "do-not-leak-this-secret" not in json.dumps(manifest)
        (c,) = pod.spec.containers
        assert c.command[-1] == cfg  # the pods read the config from the bucket
        assert dict(zip(c.command, c.command[1:]))["--log-dir"].startswith("/cache/torchelastic/")
        env = {e.name: e for e in c.env}
        assert env["LARGETRAIN_ROOT"].value == root and env["LARGETRAIN_CACHE"].value == "/cache"
        assert env["AWS_ENDPOINT_URL"].value == "http://minio.storage.svc:9000"
        ref = env["AWS_SECRET_ACCESS_KEY"].value_from.secret_key_ref
        assert env["AWS_SECRET_ACCESS_KEY"].value is None and ref.name == "largetrain-object-store" and ref.optional
        volumes = {v.name: v for v in pod.spec.volumes}
        assert all(v.persistent_volume_claim is None for v in volumes.values())
        assert volumes["storage"].empty_dir.size_limit == "800Gi"
        assert {m.mount_path for m in c.volume_mounts} == {"/cache", "/dev/shm"}

    executor_cfg = data_prep_executor_config(root, "largetrain", "largetrain-storage")
    checked = process_config(k8s_job_executor.config_schema.config_type, executor_cfg)
    assert checked.success, checked.errors
    jc = DagsterK8sJobConfig(
        job_image="registry.example/largetrain:1",
        dagster_home="/opt/dagster/home",
        volume_mounts=executor_cfg["volume_mounts"],
        volumes=executor_cfg["volumes"],
        env_vars=executor_cfg["env_vars"],
    )
    job = construct_dagster_k8s_job(
        jc,
        ["dagster", "api", "execute_step", "{}"],
        "dagster-step-1",
        UserDefinedDagsterK8sConfig.from_dict(executor_cfg["step_k8s_config"]),
        pod_name="dagster-step-1-pod",
        component="step_worker",
    )
    assert "do-not-leak-this-secret" not in json.dumps(api.sanitize_for_serialization(job))
    spec = job.spec.template.spec
    (c,) = spec.containers
    env = {e.name: e for e in c.env}
    assert env["LARGETRAIN_ROOT"].value == root and env["LARGETRAIN_CACHE"].value == "/cache"
    assert env["AWS_ACCESS_KEY_ID"].value_from.secret_key_ref.name == "largetrain-object-store"
    assert [v.empty_dir.size_limit for v in spec.volumes if v.name == "cache"] == ["200Gi"]
    assert not any(v.persistent_volume_claim for v in spec.volumes)


def _step_job(executor_cfg: dict, image: str = "registry.example/largetrain:1"):
    """The Kubernetes Job that k8s_job_executor, configured with ``executor_cfg``, creates for one step."""
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

    jc = DagsterK8sJobConfig(
        job_image=image,
        dagster_home="/opt/dagster/home",
        volume_mounts=executor_cfg["volume_mounts"],
        volumes=executor_cfg["volumes"],
        env_vars=executor_cfg["env_vars"],
        service_account_name=executor_cfg.get("service_account_name"),
    )
    return construct_dagster_k8s_job(
        jc,
        ["dagster", "api", "execute_step", "{}"],
        "dagster-step-1",
        UserDefinedDagsterK8sConfig.from_dict(executor_cfg["step_k8s_config"]),
        pod_name="dagster-step-1-pod",
        component="step_worker",
    )


def test_code_locations_data_prep_step_pods_follow_the_storage_root(monkeypatch):
    """The executor that the code location's own data-prep jobs (data_partitions_k8s, landed_partitions_k8s) carry,
    as Dagster resolves it: with LARGETRAIN_ROOT=s3://... every step pod has an emptyDir working cache at the
    training pods' cache_path (LARGETRAIN_CACHE), the root URL, the endpoint and the credentials Secret's optional
    references, the service account of LARGETRAIN_K8S_SERVICE_ACCOUNT, and no volume claim; with a local-path root,
    the ReadWriteMany claim mounted at the root and no cache variable."""
    import json

    import kubernetes
    from dagster._config import process_config
    from dagster_k8s import k8s_job_executor

    from largetrain_dagster.k8s import build_k8s_definitions

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio.storage.svc:9000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak-this-secret")
    monkeypatch.setenv("LARGETRAIN_K8S_SERVICE_ACCOUNT", "largetrain-bucket-reader")
    api = kubernetes.client.ApiClient()
    root = "s3://team-bucket/largetrain"
    defs = build_k8s_definitions(root=root, image="registry.example/largetrain:1")
    launcher = defs.resources["launcher"]
    assert launcher.object_store and launcher.service_account == "largetrain-bucket-reader"
    for name in ("data_partitions_k8s", "landed_partitions_k8s"):
        mapped = defs.resolve_job_def(name).executor_def.apply_config_mapping({})
        assert mapped.success, mapped.errors
        cfg = mapped.value["config"]
        checked = process_config(k8s_job_executor.config_schema.config_type, cfg)
        assert checked.success, checked.errors
        job = _step_job(cfg)
        manifest = api.sanitize_for_serialization(job)
        assert "do-not-leak-this-secret" not in json.dumps(manifest)
        assert api._ApiClient__deserialize(yaml.safe_load(yaml.safe_dump(manifest)), "V1Job") == job
        spec = job.spec.template.spec
        assert spec.service_account_name == "largetrain-bucket-reader"
        assert not any(v.persistent_volume_claim for v in spec.volumes)
        (cache,) = [v for v in spec.volumes if v.empty_dir is not None]
        (c,) = spec.containers
        assert [m.mount_path for m in c.volume_mounts if m.name == cache.name] == [launcher.cache_path]
        env = {e.name: e for e in c.env}
        assert env["LARGETRAIN_ROOT"].value == root and env["LARGETRAIN_CACHE"].value == launcher.cache_path
        assert env["AWS_ENDPOINT_URL"].value == "http://minio.storage.svc:9000"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            ref = env[key].value_from.secret_key_ref
            assert env[key].value is None and ref.name == launcher.credentials_secret and ref.optional
        assert env["LARGETRAIN_DATA_PARTITIONS"].value == str(len(PARTITION_KEYS))

    monkeypatch.delenv("LARGETRAIN_K8S_SERVICE_ACCOUNT")
    defs = build_k8s_definitions(root="/data", image="registry.example/largetrain:1")
    cfg = defs.resolve_job_def("data_partitions_k8s").executor_def.apply_config_mapping({}).value["config"]
    spec = _step_job(cfg).spec.template.spec
    assert spec.service_account_name is None
    assert [v.persistent_volume_claim.claim_name for v in spec.volumes if v.persistent_volume_claim] == [
        "largetrain-storage"
    ]
    (c,) = spec.containers
    assert [m.mount_path for m in c.volume_mounts if m.name == "storage"] == ["/data"]
    env = {e.name: e.value for e in c.env}
    assert env["LARGETRAIN_ROOT"] == "/data" and "LARGETRAIN_CACHE" not in env and "AWS_SECRET_ACCESS_KEY" not in env


def test_training_pods_get_the_preemption_grace_period_of_the_training():
    """checkpointing.preemption_grace_seconds, rounded up, is every training pod's terminationGracePeriodSeconds
    and torchrun's shutdown timeout (TORCH_ELASTIC_SHUTDOWN_TIMEOUT), so the ranks' preemption save has that
    long before the kubelet or the agent SIGKILLs them; without a training's (an ablation) the launcher's own."""
    from largetrain_core.training.config import TrainConfig
    from largetrain_dagster.k8s import K8sTorchrunLauncher

    cfg = TrainConfig.from_dict(
        {"output_dir": "o", "train_shards": "s", "checkpointing": {"preemption_grace_seconds": 89.5}}
    )
    launcher = K8sTorchrunLauncher(nnodes=2, kill_grace_seconds=10)
    run_id = "0f9e8d7c-6b5a-4321-8765-0123456789ab"
    pods = launcher.render(
        "/data/b/train_config.json", run_id, "base_checkpoint", grace_seconds=cfg.checkpointing.preemption_grace_seconds
    )["pods"]
    for pod in pods:
        assert pod.spec.termination_grace_period_seconds == 90
        assert {e.name: e.value for e in pod.spec.containers[0].env}["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "90"
    assert TrainConfig.from_dict({"output_dir": "o", "train_shards": "s"}).checkpointing.preemption_grace_seconds == 60
    (pod, _) = launcher.render("/data/b/ablation.json", run_id, "optimization_report")["pods"]
    assert pod.spec.termination_grace_period_seconds == 30

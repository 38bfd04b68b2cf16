"""An example `ray up` cluster config sized from a plan (ray_cluster.yaml in a ray run directory;
cluster/ray-cluster.example.yaml is one for 2 x 8 x A100-80GB).

One node type with the plan's GPUs per node; the head is one of the plan's nodes (it trains
too) and min_workers = max_workers = nodes - 1 worker nodes, so the whole plan is up before the
job starts. The provider is AWS, with the instance type that has the plan's GPUs per node where
one exists (INSTANCES), else a placeholder to fill in. The ftlaunch code is shipped with every
job (py_modules), so the nodes only need the Python dependencies.
"""

from __future__ import annotations

FILE = "ray_cluster.yaml"

# (GPU, GPUs per node) -> AWS instance type (AWS EC2 accelerated computing instances, 2025)
INSTANCES = {
    ("A100-40GB", 8): "p4d.24xlarge",
    ("A100-80GB", 8): "p4de.24xlarge",
    ("H100-80GB", 8): "p5.48xlarge",
    ("H200", 8): "p5e.48xlarge",
    ("B200", 8): "p6-b200.48xlarge",
    ("V100-16GB", 1): "p3.2xlarge",
    ("V100-16GB", 4): "p3.8xlarge",
    ("V100-16GB", 8): "p3.16xlarge",
    ("V100-32GB", 8): "p3dn.24xlarge",
    ("A10G", 1): "g5.xlarge",
    ("A10G", 4): "g5.12xlarge",
    ("A10G", 8): "g5.48xlarge",
    ("L4", 1): "g6.xlarge",
    ("L4", 4): "g6.12xlarge",
    ("L4", 8): "g6.48xlarge",
    ("L40S", 1): "g6e.xlarge",
    ("L40S", 4): "g6e.12xlarge",
    ("L40S", 8): "g6e.48xlarge",
    ("T4", 1): "g4dn.xlarge",
    ("T4", 4): "g4dn.12xlarge",
    ("T4", 8): "g4dn.metal",
}
DEPENDENCIES = "torch deepspeed transformers accelerate peft datasets 'ray[default,train]>=2.30'"


def cluster_yaml(name: str, gpu: str, nodes: int, gpus_per_node: int) -> str:
    """The `ray up` YAML for `nodes` x `gpus_per_node` x `gpu` (text; a comment says how to use it)."""
    instance = INSTANCES.get((gpu, gpus_per_node), f"SET-ME-an-instance-with-{gpus_per_node}x{gpu}")
    workers = nodes - 1
    node = f"""    node_config:
      InstanceType: {instance}
      BlockDeviceMappings:
        - DeviceName: /dev/sda1
          Ebs: {{VolumeSize: 500}}
    resources: {{GPU: {gpus_per_node}}}"""
    return f"""# Written by ftlaunch for {name}: {nodes} node(s) x {gpus_per_node} x {gpu}.
#   ray up ray_cluster.yaml                 # edit provider / region / instance first
#   ray dashboard ray_cluster.yaml          # forwards the dashboard to http://127.0.0.1:8265
#   ftlaunch ... --backend ray --address http://127.0.0.1:8265 --ray-storage /mnt/shared/runs
# Checkpoints need storage every node sees: mount it (EFS, NFS, Lustre) at /mnt/shared on every
# node (e.g. in initialization_commands) and submit with --ray-storage under it.
cluster_name: {name}
max_workers: {workers}
upscaling_speed: 1.0
idle_timeout_minutes: 10
provider:
  type: aws
  region: us-east-1
  cache_stopped_nodes: false
auth:
  ssh_user: ubuntu
available_node_types:
  gpu.head:
{node}
    min_workers: 0
    max_workers: 0
  gpu.worker:
{node}
    min_workers: {workers}
    max_workers: {workers}
head_node_type: gpu.head
file_mounts: {{}}
initialization_commands: []
setup_commands:
  - pip install -q {DEPENDENCIES}
head_start_ray_commands:
  - ray stop
  - ulimit -n 65536; ray start --head --port=6379 --dashboard-host=0.0.0.0 --autoscaling-config=~/ray_bootstrap_config.yaml
worker_start_ray_commands:
  - ray stop
  - ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379
"""

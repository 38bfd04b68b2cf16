"""The analytic memory model: per-GPU breakdown, host RAM and NVMe for one configuration."""

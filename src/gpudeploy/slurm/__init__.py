"""Slurm as a deploy target: one batch job per deployment, each engine and the router a job step.

The inventory says ``slurm:`` (target.py reads it); its hosts are node SLOTS of the allocation
(inventory.py); the ordinary planner computes every engine's argv, ports, flags and memory with a
placeholder for each slot's node, which the batch script (script.py) fills in once the job runs.
job.py submits, gates, reports and cancels through the login node over SSH; queue.py parses what
squeue, sacct and sbatch print. Nothing here is reached by the SSH + systemd path.
"""

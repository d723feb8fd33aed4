"""Nodes and how to reach them: launchers (local, netns, srun, ssh), Slurm's node list, and the
emulated cluster (network namespaces on one host) that rehearses a supernode on a laptop-sized box."""

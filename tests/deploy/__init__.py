"""Deployment recipes (deploy/) checked offline: the Kubernetes manifests against their published schemas."""

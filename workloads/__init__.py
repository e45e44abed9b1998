"""What runs inside the EKS cluster: device plugins, the KubeRay operator and the RayCluster.

raycluster and charts are pure functions of the stack configuration; image pins the
DLC image to a digest; stack applies them through one Kubernetes provider.
"""

"""The AWS half of the raytrain-eks Pulumi program: network, EKS, node groups, storage."""

"""Submit fine-tuning runs to a Ray cluster as Ray jobs, and follow them.

    python -m trainer submit [training flags] [--address URL | --stack STACK | --namespace NS --service SVC]
    python -m trainer status|logs|stop RUN [same connection flags]
    python -m trainer nccl-bench [--stack STACK | connection flags]

The job's submission id is the run name, and the run's storage folder is named after it too,
so resubmitting a run name resumes from that run's last complete checkpoint. The head is
reached at `--address`, or through a `kubectl port-forward` this command opens and closes
itself (nothing of Ray is ever exposed outside the cluster). With token authentication on,
the token comes from RAY_AUTH_TOKEN or from the RayCluster's auth Secret, read with kubectl.

One module per concern: `target` (the stack's outputs and kubeconfig), `connection`
(port-forward, token, the job client), `job` (staging, runtime env, submission), `follow`
(logs and the exit status), `cli` (the commands).
"""

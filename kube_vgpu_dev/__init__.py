"""The development harness: a real Kubernetes control plane on loopback and our stack on it.

Used by the end-to-end tests (tests/e2e, through the re-exports of tests/e2e/controlplane.py) and by the
developer cluster (``python -m kube_vgpu_dev up``, ``hack/local-cluster.sh``). Not shipped: the wheel and the
image carry only the services. One module per concern:

* ``pki``: the cluster's CA and certificates (built on webhook.certs), ``kubeconfig``: kubeconfig files;
* ``processes``: child processes in their own group, ports, readiness polling;
* ``binaries``: the cached builds of etcd, kube-apiserver, kube-scheduler, kubectl, KWOK, Prometheus;
* ``components``: the command lines and the scheduler configuration (pure);
* ``objects``: API clients, kubectl and the Node/Pod helpers; ``controlplane``: ``ControlPlane`` itself;
* ``stack``: the extender process, the shipped scheduler profile and GPU nodes; ``cli``: the developer cluster.
"""

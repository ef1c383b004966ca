"""State from the apiserver: reflectors on Nodes and active Pods feeding the service."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kubernetes import client

from scheduler_extender.gcpause import paused_gc
from scheduler_extender.kube import ACTIVE_PODS, Reflector
from scheduler_extender.service import ExtenderService
from scheduler_extender.slim import LIST_PAGE, slim_node, slim_pod

log = logging.getLogger(__name__)


class KubeSource:
    def __init__(self, api: client.CoreV1Api, service: ExtenderService, *, watch_timeout_s: int = 300) -> None:
        self.service = service
        self._pods_listed = False  # the first pod list seeds learning; relists do not
        self.seeded = threading.Event()  # the first list's pods have seeded learning (or failed to)
        self._synced = {"nodes": threading.Event(), "pods": threading.Event()}
        self.nodes = Reflector(
            name="nodes",
            list_call=api.list_node,
            replace=service.replace_nodes,
            handle=service.node_event,
            on_synced=self._synced["nodes"].set,
            watch_timeout_s=watch_timeout_s,
            page_size=LIST_PAGE,
            slim=slim_node,
        )
        # Nodes first: pods seen before their node are kept as orphans and applied when it arrives.
        self.pods = Reflector(
            name="pods",
            list_call=api.list_pod_for_all_namespaces,
            replace=self._replace_pods,
            handle=service.pod_event,
            field_selector=ACTIVE_PODS,
            on_synced=self._on_pods_synced,
            watch_timeout_s=watch_timeout_s,
            page_size=LIST_PAGE,
            slim=slim_pod,
        )
        self._threads: list[threading.Thread] = []

    def _replace_pods(self, pods: list[dict[str, Any]]) -> None:
        first = not self._pods_listed
        started = time.monotonic()
        # The state first, so the extender is ready once it is rebuilt. The first list then seeds the learned
        # workload in the background (parsing and observing 40k pods was a third of a restart); a relist never
        # seeds: it would count pods twice. Until the seeding is in, placement scores as a learning policy's cold
        # start does.
        # When the list was read: a pod /filter rejected since stays pending though the list does not hold it.
        self.service.replace_pods(pods, seed_learning=False, listed_at=self.pods.list_started)
        with self.service.lock:  # what the next pass over the nodes would work out, frozen with the state (gcpause)
            self.service.state.classify()
        # The end of a (re)list, with what applying it cost: benchmarks/restart.py times a relist up to this line.
        log.info(
            "pods listed", extra={"pods": len(pods), "apply_s": round(time.monotonic() - started, 3), "first": first}
        )
        self._pods_listed = True
        if first:
            threading.Thread(target=self._seed, args=(pods,), name="learning-seed", daemon=True).start()

    def _seed(self, pods: list[dict[str, Any]]) -> None:
        try:
            with paused_gc():  # parses every listed pod: scheduler_extender.gcpause
                self.service.seed_learning_from(pods)
        except Exception as exc:  # learning catches up through /filter anyway
            log.warning("cannot seed learning from the listed pods", extra={"error": repr(exc)})
        finally:
            self.seeded.set()

    def _on_pods_synced(self) -> None:
        self._synced["pods"].set()
        if self._synced["nodes"].is_set():
            self.service.ready.set()

    def start(self) -> None:
        t_nodes = threading.Thread(target=self.nodes.run, name="reflector-nodes", daemon=True)
        t_nodes.start()
        self._synced["nodes"].wait(timeout=30)
        t_pods = threading.Thread(target=self.pods.run, name="reflector-pods", daemon=True)
        t_pods.start()
        self._threads = [t_nodes, t_pods]

    def stop(self) -> None:
        self.nodes.stop()
        self.pods.stop()

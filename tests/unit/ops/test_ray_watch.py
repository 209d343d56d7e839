"""What the driver of `pagedserve up --ray` logs about its actors, from Ray's actor table."""

from __future__ import annotations

from pagedserve.ops.deploy.ray_watch import PENDING_WARN_S, ActorRow, ActorWatch

NODE_DEATH_S = 4.0  # how long the cluster takes to declare a node dead

A, B = "a" * 56, "b" * 56  # node ids


def names(events) -> list[tuple[str, dict]]:
    return [(e.name, e.fields) for e in events]


def test_a_new_actor_is_logged_started_once() -> None:
    watch = ActorWatch(node_death_s=NODE_DEATH_S, names=["worker-0"])
    row = ActorRow("ALIVE", 0, 101, A)

    first = names(watch.observe("worker-0", row, {A}, 0.0))
    again = names(watch.observe("worker-0", row, {A}, 0.5))

    assert first == [("child_started", {"child": "worker-0", "pid": 101, "node": A[:8]})]
    assert again == []


def test_a_restart_on_a_node_that_stays_alive_is_a_process_death_once_the_node_outlives_the_check() -> None:
    watch = ActorWatch(node_death_s=NODE_DEATH_S, names=["worker-0"])
    list(watch.observe("worker-0", ActorRow("ALIVE", 0, 101, A), {A, B}, 0.0))

    restarting = names(watch.observe("worker-0", ActorRow("RESTARTING", 1, 101, A), {A, B}, 0.5))
    alive = names(watch.observe("worker-0", ActorRow("ALIVE", 1, 202, A), {A, B}, 1.0))
    settled = names(watch.observe("worker-0", ActorRow("ALIVE", 1, 202, A), {A, B}, 0.5 + NODE_DEATH_S))
    later = names(watch.observe("worker-0", ActorRow("ALIVE", 1, 202, A), {A, B}, 9.0 + NODE_DEATH_S))

    assert restarting == []  # the node may yet be declared dead
    assert alive == [("child_started", {"child": "worker-0", "pid": 202, "node": A[:8]})]
    assert settled == [
        ("child_exited", {"child": "worker-0", "cause": "process died", "restart_number": 1, "node": A[:8]})
    ]
    assert later == []


def test_a_restart_seen_before_its_node_is_declared_dead_is_a_lost_node() -> None:
    # Ray restarts the actor elsewhere as soon as its process is gone; the node is declared dead
    # only after its health checks fail.
    watch = ActorWatch(node_death_s=NODE_DEATH_S, names=["worker-1"])
    list(watch.observe("worker-1", ActorRow("ALIVE", 0, 101, B), {A, B}, 0.0))

    moved = names(watch.observe("worker-1", ActorRow("ALIVE", 1, 303, A), {A, B}, 1.0))
    declared = names(watch.observe("worker-1", ActorRow("ALIVE", 1, 303, A), {A}, 2.5))

    assert moved == [("child_started", {"child": "worker-1", "pid": 303, "node": A[:8]})]
    assert declared == [
        ("child_exited", {"child": "worker-1", "cause": "node lost", "restart_number": 1, "node": B[:8]})
    ]


def test_a_restart_after_its_node_died_is_a_lost_node_and_names_the_new_one() -> None:
    watch = ActorWatch(node_death_s=NODE_DEATH_S, names=["worker-1"])
    list(watch.observe("worker-1", ActorRow("ALIVE", 0, 101, B), {A, B}, 0.0))

    events = names(watch.observe("worker-1", ActorRow("ALIVE", 1, 303, A), {A}, 3.0))

    assert events == [
        ("child_exited", {"child": "worker-1", "cause": "node lost", "restart_number": 1, "node": B[:8]}),
        ("child_started", {"child": "worker-1", "pid": 303, "node": A[:8]}),
    ]


def test_restarts_missed_between_polls_are_each_counted() -> None:
    watch = ActorWatch(node_death_s=NODE_DEATH_S, names=["scheduler"])
    list(watch.observe("scheduler", ActorRow("ALIVE", 0, 101, A), {A}, 0.0))

    list(watch.observe("scheduler", ActorRow("ALIVE", 2, 404, A), {A}, 1.0))
    events = names(watch.observe("scheduler", ActorRow("ALIVE", 2, 404, A), {A}, 1.0 + NODE_DEATH_S))

    assert [f["restart_number"] for n, f in events if n == "child_exited"] == [1, 2]


def test_a_dead_actor_is_given_up_once_and_listed_dead() -> None:
    watch = ActorWatch(node_death_s=NODE_DEATH_S, names=["scheduler", "worker-0"])
    list(watch.observe("scheduler", ActorRow("ALIVE", 0, 101, A), {A}, 0.0))

    first = names(watch.observe("scheduler", ActorRow("DEAD", 5, 0, A), {A}, 1.0))
    again = names(watch.observe("scheduler", ActorRow("DEAD", 5, 0, A), {A}, 1.5))

    assert [n for n, _ in first] == ["child_exited"] * 5 + ["child_given_up"]
    assert again == [] and watch.dead() == ["scheduler"]


def test_an_actor_waiting_for_resources_is_reported_once() -> None:
    watch = ActorWatch(node_death_s=NODE_DEATH_S, names=["worker-0"])
    pending = ActorRow("PENDING_CREATION", 0, 0, "")

    early = names(watch.observe("worker-0", pending, {A}, 0.0))
    late = names(watch.observe("worker-0", pending, {A}, PENDING_WARN_S))
    later = names(watch.observe("worker-0", pending, {A}, PENDING_WARN_S + 5))

    assert early == [] and later == []
    assert late == [
        ("child_pending", {"child": "worker-0", "state": "PENDING_CREATION", "waited_s": PENDING_WARN_S})
    ]

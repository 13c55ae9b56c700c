"""DISC_TF_COMPILE_MODE parsing and the background compile queue, in-process."""

from __future__ import annotations

import threading
import types

import pytest

from disc_tf.background import CompileQueue, cluster_key
from disc_tf.enable import compile_mode


@pytest.mark.fallback
def test_compile_mode_defaults_to_async(monkeypatch):
    monkeypatch.delenv("DISC_TF_COMPILE_MODE", raising=False)
    assert compile_mode() == "async"
    monkeypatch.setenv("DISC_TF_COMPILE_MODE", "SYNC")
    assert compile_mode() == "sync"
    monkeypatch.setenv("DISC_TF_COMPILE_MODE", "later")
    assert compile_mode() == "async"  # unknown values warn and keep the default


def test_cluster_key_depends_on_ops_and_target():
    assert cluster_key(b"ops", "cpu") == cluster_key(b"ops", "cpu")
    assert cluster_key(b"ops", "cpu") != cluster_key(b"ops", "cuda")
    assert cluster_key(b"ops", "cpu") != cluster_key(b"other", "cpu")


def test_queue_compiles_each_key_once_and_reports_failures(monkeypatch):
    calls: list[str] = []
    published: list[tuple[str, object, object]] = []
    gate = threading.Event()

    def fake_compile(spec, target, levels):
        assert levels == ("x86-64-v3",)  # what submit was given
        gate.wait(10)
        calls.append(spec.name)
        raise RuntimeError(f"cannot compile {spec.name}")

    monkeypatch.setattr("disc_tf.pipeline.compile_cluster", fake_compile)
    queue = CompileQueue()
    publish = lambda key, art, err: published.append((key, art, err))  # noqa: E731
    a, b = types.SimpleNamespace(name="a"), types.SimpleNamespace(name="b")
    queue.submit("k1", a, "cpu", publish, ("x86-64-v3",))
    queue.submit("k1", a, "cpu", publish, ("x86-64-v3",))  # same key: not compiled again
    queue.submit("k2", b, "cpu", publish, ("x86-64-v3",))
    assert not queue.wait(0.2)  # still blocked in the first compile
    gate.set()
    assert queue.wait(30)
    assert calls == ["a", "b"]
    assert [(k, a) for k, a, _ in published] == [("k1", None), ("k2", None)]
    assert all("cannot compile" in e for _, _, e in published)
    queue.close()


def test_queue_builds_the_hottest_waiting_cluster_first(monkeypatch):
    """While one cluster compiles, the waiting cluster whose fallback ran most is next;
    equals go in the order they came."""
    order: list[str] = []
    started, gate = threading.Event(), threading.Event()

    def fake_compile(spec, target, levels):
        if spec.name == "first":
            started.set()
            gate.wait(10)
        order.append(spec.name)
        raise RuntimeError("not compiled (test)")

    monkeypatch.setattr("disc_tf.pipeline.compile_cluster", fake_compile)
    calls = {"k2": 1, "k3": 5, "k4": 5}
    queue = CompileQueue(priority=lambda key: calls.get(key, 0))
    publish = lambda key, art, err: None  # noqa: E731
    queue.submit("k1", types.SimpleNamespace(name="first"), "cpu", publish)
    assert started.wait(10)  # the others wait while it compiles
    for key, name in (("k2", "warm"), ("k3", "hot"), ("k4", "hot_later"), ("k5", "cold")):
        queue.submit(key, types.SimpleNamespace(name=name), "cpu", publish)
    gate.set()
    assert queue.wait(30)
    assert order == ["first", "hot", "hot_later", "warm", "cold"]
    queue.close()


def test_a_compile_failing_after_close_is_dropped_quietly(monkeypatch, caplog):
    """At interpreter exit close() drops the queue while a compile runs; that compile
    then fails (the exit took its thread pool or temporary directory). It is neither
    published nor warned about: the process is going, and a warning that a cluster
    "was left as TF ops" would be false news. A failure before close still is both."""
    published: list[str] = []
    started, gate = threading.Event(), threading.Event()

    def fake_compile(spec, target, levels):
        started.set()
        gate.wait(10)
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr("disc_tf.pipeline.compile_cluster", fake_compile)
    queue = CompileQueue()
    queue.submit("k1", types.SimpleNamespace(name="late"), "cpu",
                 lambda key, art, err: published.append(key))
    assert started.wait(10)
    closer = threading.Thread(target=queue.close)
    with caplog.at_level("INFO", logger="disc_tf"):
        closer.start()
        while not queue._closed:
            threading.Event().wait(0.01)
        gate.set()
        closer.join(30)
    assert not closer.is_alive() and published == []
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.records
    assert any("process exited first" in r.getMessage() for r in caplog.records)

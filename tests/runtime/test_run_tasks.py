"""How RunTasks (cc/ral/run_tasks.h) shares a launch's tasks between the caller and the
pool: every task runs exactly once, whatever the pool does; tasks are taken in order
by whichever thread is free; a helper that starts late leaves its tasks to the
caller, and one that starts after the call returned runs nothing. And which CPU each
of the pool's workers is pinned to (cc/ral/worker_cpus.h)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from disc_tf.runtime import compiler

REPO = pathlib.Path(__file__).resolve().parents[2]

#: Modes (argv[1]):
#:  inline T    a pool that runs each job inside Schedule (the helpers start first and
#:              take everything): prints the order the tasks ran in, with who ran each
#:  late T      a pool that keeps its jobs and runs them after RunTasks returned: same
#:  spin T N R  a real SpinPool of N - 1 workers, R launches of T tasks each: prints
#:              "ok" when every task of every launch ran exactly once
#:  cpus A C W  WorkerCpus(allowed A, comma-separated; current C; W workers): the CPUs,
#:              comma-separated, or "none"
#:  pin N P     a SpinPool of N - 1 workers, pinned if P is 1: prints each worker's
#:              Cpus_allowed_list, one per line
_PROGRAM = r"""
#include <dirent.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>
#include "cc/ral/run_tasks.h"
#include "cc/ral/spin_pool.h"
#include "cc/ral/worker_cpus.h"

// Each disc_tf_worker thread's Cpus_allowed_list, one line each.
void PrintWorkerCpus() {
  DIR* dir = opendir("/proc/self/task");
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(task + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name != "disc_tf_worker") continue;
    std::ifstream status(task + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        std::istringstream words(line.substr(18));
        std::string list;
        words >> list;
        std::printf("%s\n", list.c_str());
      }
    }
  }
  closedir(dir);
}

thread_local const char* who = "caller";

struct InlinePool {  // a helper runs as soon as it is scheduled
  int threads;
  int NumThreads() const { return threads; }
  void Schedule(std::function<void()> job) const { who = "helper"; job(); who = "caller"; }
};

struct LatePool {  // helpers run only after the call returned
  int threads;
  mutable std::vector<std::function<void()>> jobs;
  int NumThreads() const { return threads; }
  void Schedule(std::function<void()> job) const { jobs.push_back(std::move(job)); }
};

struct Spin {
  disc_tf::SpinPool* pool;
  int threads;
  int NumThreads() const { return threads; }
  void Schedule(std::function<void()> job) const { pool->Schedule(std::move(job)); }
};

int main(int argc, char** argv) {
  const std::string mode = argv[1];
  if (mode == "cpus") {
    std::vector<int> allowed;
    std::istringstream list(argv[2]);
    for (std::string cpu; std::getline(list, cpu, ',');) allowed.push_back(std::stoi(cpu));
    const std::vector<int> cpus =
        disc_tf::WorkerCpus(allowed, std::atoi(argv[3]), std::atoi(argv[4]));
    std::string out;
    for (int cpu : cpus) out += (out.empty() ? "" : ",") + std::to_string(cpu);
    std::printf("%s\n", cpus.empty() ? "none" : out.c_str());
    return 0;
  }
  if (mode == "pin") {
    disc_tf::SpinPool pool(200, std::atoi(argv[3]) == 1);
    pool.Reserve(std::atoi(argv[2]) - 1);
    PrintWorkerCpus();
    return 0;
  }
  const long long tasks = std::atoll(argv[2]);
  std::mutex mu;
  std::string order;
  auto record = [&](int64_t t) {
    std::lock_guard<std::mutex> lock(mu);
    order += std::string(who) + ":" + std::to_string(t) + " ";
  };
  if (mode == "inline") {
    InlinePool pool{2};
    disc_tf::RunTasks(&pool, tasks, record);
    std::printf("%s\n", order.c_str());
  } else if (mode == "late") {
    LatePool pool{2};
    disc_tf::RunTasks(&pool, tasks, record);
    const std::string before = order;
    for (auto& job : pool.jobs) job();  // the helper's job, after the call
    std::printf("%s|%s\n", before.c_str(), order == before ? "helper ran nothing" : "helper ran");
  } else {
    const int threads = std::atoi(argv[3]), launches = std::atoi(argv[4]);
    disc_tf::SpinPool pool(200);
    pool.Reserve(threads - 1);
    Spin spin{&pool, threads};
    for (int l = 0; l < launches; ++l) {
      std::vector<std::atomic<int>> runs(tasks);
      for (auto& r : runs) r.store(0);
      disc_tf::RunTasks(&spin, tasks, [&](int64_t t) { runs[t].fetch_add(1); });
      for (long long t = 0; t < tasks; ++t) {
        if (runs[t].load() != 1) {
          std::printf("launch %d task %lld ran %d times\n", l, t, runs[t].load());
          return 1;
        }
      }
    }
    std::printf("ok\n");
  }
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> pathlib.Path:
    """The test program, built against the RAL's headers."""
    d = tmp_path_factory.mktemp("run_tasks")
    (d / "run_tasks.cc").write_text(_PROGRAM)
    subprocess.run([compiler.resolve(compiler.cxx()), "-O1", "-std=c++17", "-pthread",
                    f"-I{REPO}", str(d / "run_tasks.cc"), "-o", str(d / "run_tasks")],
                   check=True)
    return d / "run_tasks"


def _run(program: pathlib.Path, *args: object, cpus: set[int] | None = None) -> str:
    """The program's output; with ``cpus``, run on those CPUs only."""
    return subprocess.run([str(program), *map(str, args)], check=True, capture_output=True,
                          text=True, timeout=120,
                          preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus)
                          ).stdout.strip()


def test_a_helper_that_starts_first_takes_the_tasks_in_order(program):
    # The helper runs before the caller takes any task: it takes them all, in order.
    assert _run(program, "inline", 8).split() == [f"helper:{t}" for t in range(8)]


def test_a_late_helper_leaves_the_tasks_to_the_caller_and_runs_nothing_after(program):
    before, verdict = _run(program, "late", 7).split("|")
    assert before.split() == [f"caller:{t}" for t in range(7)]
    assert verdict == "helper ran nothing"


@pytest.mark.parametrize("tasks", [2, 3, 5, 16, 97])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_every_task_runs_once_on_a_real_pool(program, tasks, threads):
    assert _run(program, "spin", tasks, threads, 300) == "ok"


@pytest.mark.parametrize(("allowed", "current", "workers", "expected"), [
    ("0,1", 0, 1, "1"),
    ("0,1", 1, 1, "0"),  # the caller's CPU is the last any worker takes
    ("0,1,2,3", 1, 3, "2,3,0"),
    ("0,1,2,3", 2, 2, "3,0"),
    ("2,5,7", 5, 2, "7,2"),  # a cpuset: only its CPUs
    ("2,5,7", 4, 1, "5"),  # a current CPU outside the set counts as the set's first
    ("0,1,2,3", -1, 3, "1,2,3"),  # unknown (sched_getcpu failed): the same
    ("0,1", 0, 2, "none"),  # two workers and a caller on two CPUs: left to the scheduler
    ("3", 3, 1, "none"),
    ("0,1,2", 0, 0, "none"),
])
def test_worker_cpus_follow_the_callers_and_never_share_one(program, allowed, current, workers,
                                                           expected):
    """Each worker gets a CPU of its own after the caller's, wrapping round; none is
    pinned when the CPUs are too few for the workers and the caller."""
    assert _run(program, "cpus", allowed, current, workers) == expected


_CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(_CPUS) < 2, reason="pinning a worker needs two CPUs")
def test_a_pinned_pool_gives_its_worker_one_cpu_and_an_unpinned_one_all(program):
    two = set(_CPUS[:2])
    pinned = _run(program, "pin", 2, 1, cpus=two).split()
    assert len(pinned) == 1 and pinned[0].isdigit() and int(pinned[0]) in two
    unpinned = _run(program, "pin", 2, 0, cpus=two).split()
    assert unpinned == [f"{min(two)}-{max(two)}" if max(two) == min(two) + 1
                        else f"{min(two)},{max(two)}"]
    # Two workers and the caller on two CPUs: none is pinned.
    assert _run(program, "pin", 3, 1, cpus=two).split() == unpinned * 2

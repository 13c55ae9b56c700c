"""How RunTasks (cc/ral/run_tasks.h) shares a launch's tasks between the caller and the
pool: every task runs exactly once, whatever the pool does; tasks are taken in order
by whichever thread is free; a helper that starts late leaves its tasks to the
caller, and one that starts after the call returned runs nothing."""

from __future__ import annotations

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
_PROGRAM = r"""
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>
#include "cc/ral/run_tasks.h"
#include "cc/ral/spin_pool.h"

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


def _run(program: pathlib.Path, *args: object) -> str:
    return subprocess.run([str(program), *map(str, args)], check=True, capture_output=True,
                          text=True, timeout=120).stdout.strip()


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

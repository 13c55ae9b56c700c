// subprocess_compiler.cc -- runs `python -m disc_tf compile-graph`.
#include "cc/kernels/subprocess_compiler.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cc/kernels/pending_artifacts.h"
#include "tensorflow/core/platform/logging.h"

extern char** environ;

namespace disc_tf {
namespace {

using Clock = std::chrono::steady_clock;

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(fallback);
}

double TimeoutSeconds() {
  double t = 0;
  if (absl::SimpleAtod(Env("DISC_TF_SUBPROCESS_TIMEOUT", "600"), &t) && t > 0) return t;
  return 600;
}

absl::Status WriteFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status ReadFile(const std::string& path, std::string* data) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::InternalError(absl::StrCat("cannot read ", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  *data = ss.str();
  return absl::OkStatus();
}

// One running `compile-graph` process: its stdout, read line by line with a
// deadline, and its temporary directory. Killed and cleaned up on destruction.
class Child {
 public:
  ~Child() {
    if (fd_ >= 0) close(fd_);
    if (pid_ > 0) {
      kill(-pid_, SIGKILL);  // its own process group: g++ goes too
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  absl::Status Start(const std::string& graph_bytes,
                     const std::vector<std::string>& protected_names, bool async) {
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(TimeoutSeconds()));
    std::string tmpl = Env("TMPDIR", "/tmp") + "/disc_tf_graph_XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
    }
    dir_ = tmpl;
    const std::string graph = dir_ + "/graph.pb";
    const std::string names = dir_ + "/protected.txt";
    if (absl::Status s = WriteFile(graph, graph_bytes); !s.ok()) return s;
    std::string joined;
    for (const std::string& n : protected_names) absl::StrAppend(&joined, n, "\n");
    if (absl::Status s = WriteFile(names, joined); !s.ok()) return s;

    const std::string python = Env("DISC_TF_PYTHON", "python3");
    std::vector<std::string> args = {python,   "-m",        "disc_tf", "compile-graph",
                                     "--graph", graph,      "--protected", names,
                                     "--out-dir", dir_,     "--mode", async ? "async" : "sync"};
    const char* target = std::getenv("DISC_TF_TARGET");
    if (target != nullptr && *target != '\0') {
      args.push_back("--target");
      args.push_back(target);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The child must not run this pass on its own graphs.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "TF_DISC_ENABLE=", 15) != 0) env_strings.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    pid_t pid = 0;
    int rc = posix_spawnp(&pid, python.c_str(), &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      return absl::UnavailableError(
          absl::StrCat("cannot run ", python, " (DISC_TF_PYTHON): ", std::strerror(rc)));
    }
    pid_ = pid;
    fd_ = fds[0];
    return absl::OkStatus();
  }

  // The next line of the child's stdout; false at end of file or deadline.
  bool NextLine(std::string* line, std::string* why) {
    while (true) {
      size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        *line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return true;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      if (left.count() <= 0) {
        *why = absl::StrCat("no answer within DISC_TF_SUBPROCESS_TIMEOUT=", TimeoutSeconds(), "s");
        return false;
      }
      pollfd p{fd_, POLLIN, 0};
      int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (n < 0 && errno != EINTR) {
        *why = absl::StrCat("poll: ", std::strerror(errno));
        return false;
      }
      if (n <= 0) continue;
      char chunk[4096];
      ssize_t got = read(fd_, chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        *why = ExitDescription();
        return false;
      }
      buffer_.append(chunk, static_cast<size_t>(got));
    }
  }

 private:
  std::string ExitDescription() {
    int status = 0;
    pid_t r;
    while ((r = waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
    }
    if (r != pid_) return "the compiler process ended";
    pid_ = 0;
    if (WIFEXITED(status)) return absl::StrCat("the compiler exited with status ", WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return absl::StrCat("the compiler was killed by signal ", WTERMSIG(status));
    return "the compiler process ended";
  }

  pid_t pid_ = 0;
  int fd_ = -1;
  std::string dir_;
  std::string buffer_;
  Clock::time_point deadline_;
};

// Reads ARTIFACT / FAILED lines until the child ends; fails what is left.
void PublishArtifacts(std::unique_ptr<Child> child, std::set<std::string> pending) {
  std::string line, why;
  while (!pending.empty() && child->NextLine(&line, &why)) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 4));
    if (parts.size() >= 5 && parts[0] == "ARTIFACT" && pending.count(parts[1]) != 0) {
      int64_t kernels = 0;
      std::string bytes;
      absl::Status s = ReadFile(parts[4], &bytes);
      if (s.ok() && absl::SimpleAtoi(parts[3], &kernels)) {
        s = PublishPending(parts[1], bytes, parts[2], kernels);  // logs its failure
      } else if (s.ok()) {
        FailPending(parts[1], absl::StrCat("malformed line: ", line));
      } else {
        FailPending(parts[1], std::string(s.message()));
      }
      pending.erase(parts[1]);
    } else if (parts.size() >= 2 && parts[0] == "FAILED" && pending.count(parts[1]) != 0) {
      FailPending(parts[1], parts.size() > 2 ? line.substr(8 + parts[1].size()) : "");
      pending.erase(parts[1]);
    }
  }
  if (why.empty()) why = "the compiler stopped";
  for (const std::string& key : pending) FailPending(key, why);
}

}  // namespace

absl::Status CompileInSubprocess(const std::string& graph_bytes,
                                 const std::vector<std::string>& protected_names,
                                 bool async, std::string* result) {
  result->clear();
  auto child = std::make_unique<Child>();
  if (absl::Status s = child->Start(graph_bytes, protected_names, async); !s.ok()) return s;
  std::set<std::string> pending;
  std::string line, why;
  while (child->NextLine(&line, &why)) {
    if (line.rfind("PENDING ", 0) == 0) {
      pending.insert(line.substr(8));
    } else if (line == "NONE") {
      return absl::OkStatus();
    } else if (line.rfind("GRAPH ", 0) == 0) {
      if (absl::Status s = ReadFile(line.substr(6), result); !s.ok()) {
        result->clear();
        return s;
      }
      if (async && !pending.empty()) {
        std::thread(PublishArtifacts, std::move(child), std::move(pending)).detach();
      }
      return absl::OkStatus();
    }
  }
  return absl::UnavailableError(absl::StrCat("disc_tf compile-graph: ", why));
}

}  // namespace disc_tf

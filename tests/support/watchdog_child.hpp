// Runs a piece of a test in a forked child with an alarm, so that a test of
// something that used to hang fails instead: the child is killed by SIGALRM
// after `seconds`, and the parent reports how the child ended.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace optex::test {

struct ChildOutcome {
  bool exited = false;  // returned normally (else killed by `signal`)
  int status = -1;      // its exit status when it exited
  int signal = 0;
  std::string output;  // what `body` returned
};

// Forks; the child runs `body` under alarm(seconds) and sends back its text.
inline ChildOutcome run_in_watched_child(const std::function<std::string()>& body,
                                         unsigned seconds) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {false, -1, 0, std::string("pipe: ") + std::strerror(errno)};
  const pid_t pid = fork();
  if (pid < 0) return {false, -1, 0, std::string("fork: ") + std::strerror(errno)};
  if (pid == 0) {
    close(pipe_fds[0]);
    alarm(seconds);
    const std::string text = body();
    const ssize_t written = write(pipe_fds[1], text.data(), text.size());
    _exit(written == static_cast<ssize_t>(text.size()) ? 0 : 3);
  }
  close(pipe_fds[1]);
  ChildOutcome outcome;
  char buffer[4096];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
    outcome.output.append(buffer, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  outcome.exited = WIFEXITED(status);
  outcome.status = outcome.exited ? WEXITSTATUS(status) : -1;
  outcome.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return outcome;
}

}  // namespace optex::test

// A fixed set of worker threads that run one parallel loop at a time.
//
// minimize() evaluates the N points of an iteration on it. Threads are
// created once; each loop index runs exactly once, on some worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace optex {

namespace detail {
// How a ThreadPool starts its worker number `index`: std::thread by default.
// Tests pass one that fails at a chosen index, as the OS does when it runs
// out of threads or address space.
using ThreadStarter = std::function<std::thread(int index, std::function<void()> work)>;
}  // namespace detail

class ThreadPool {
 public:
  // Starts `threads` workers, in [1, kMaxParallelism] (options.hpp), else
  // std::invalid_argument. If a thread cannot be started, the ones already
  // running are stopped and joined, and std::system_error (the OS's error
  // code) names the count asked, the index that failed and the OS's reason.
  explicit ThreadPool(int threads);
  ThreadPool(int threads, const detail::ThreadStarter& start);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  // Runs body(i) for i in [0, n) and waits for all. If any throw, rethrows
  // the exception of the lowest index once every index has finished.
  void parallel_for(int n, const std::function<void(int)>& body);

 private:
  void work();
  // Tells every started worker to leave and joins it.
  void stop_and_join();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int)>* body_ = nullptr;
  int count_ = 0;
  int next_ = 0;
  int finished_ = 0;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;
};

}  // namespace optex

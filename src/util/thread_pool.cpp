#include "optex/util/thread_pool.hpp"

#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "optex/engine/options.hpp"

namespace optex {

ThreadPool::ThreadPool(int threads)
    : ThreadPool(threads,
                 [](int, std::function<void()> work) { return std::thread(std::move(work)); }) {}

ThreadPool::ThreadPool(int threads, const detail::ThreadStarter& start) {
  if (threads < 1 || threads > kMaxParallelism) {
    throw std::invalid_argument("threads: must be in [1, " + std::to_string(kMaxParallelism) +
                                "], got " + std::to_string(threads));
  }
  workers_.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) {
    // The workers already started wait on this object's condition variables:
    // they must be stopped and joined before the exception leaves, or the
    // members' destructors would wait for them forever.
    const auto what = [&] {
      return "ThreadPool: starting thread " + std::to_string(i) + " of " + std::to_string(threads) +
             " (indices from 0) failed";
    };
    try {
      workers_.push_back(start(i, [this] { work(); }));
    } catch (const std::system_error& e) {
      stop_and_join();
      throw std::system_error(e.code(), what());
    } catch (const std::exception& e) {
      stop_and_join();
      throw std::runtime_error(what() + ": " + e.what());
    }
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void ThreadPool::parallel_for(int n, const std::function<void(int)>& body) {
  if (n <= 0) return;
  std::unique_lock lock(mutex_);
  body_ = &body;
  count_ = n;
  next_ = 0;
  finished_ = 0;
  errors_.assign(static_cast<std::size_t>(n), nullptr);
  ++generation_;
  start_.notify_all();
  done_.wait(lock, [&] { return finished_ == count_; });
  body_ = nullptr;
  for (auto& e : errors_) {
    if (e) std::rethrow_exception(e);
  }
}

void ThreadPool::work() {
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    start_.wait(lock, [&] { return stopping_ || (generation_ != seen && next_ < count_); });
    if (stopping_) return;
    // Take indices until the loop is exhausted, then wait for the next one.
    while (next_ < count_) {
      const int i = next_++;
      const auto* body = body_;
      lock.unlock();
      std::exception_ptr error;
      try {
        (*body)(i);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      errors_[static_cast<std::size_t>(i)] = error;
      if (++finished_ == count_) done_.notify_all();
    }
    seen = generation_;
  }
}

}  // namespace optex

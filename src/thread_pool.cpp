#include "optex/thread_pool.hpp"

#include <stdexcept>
#include <string>

namespace optex {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1)
    throw std::invalid_argument("threads: must be >= 1, got " + std::to_string(threads));
  workers_.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (auto& t : workers_) t.join();
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

// A persistent pool of helper threads that join a call's work when they wake, and that the caller never waits
// for unless they took some: on a shared or busy machine a helper the scheduler has not run yet costs nothing
// (a fork-join region would wait for it at its barrier, a timeslice or more).
//
// run(helpers, job): the caller and up to `helpers` helpers each call job(); job hands out its work itself
// (atomics) and returns when none is left; run returns when the caller's job() has returned and every helper
// that entered has left. Helpers spin for a short while after a job (the next layer's call comes within
// microseconds in a forward pass), then sleep on a condition variable. One job at a time: a second caller
// (another thread) or a nested call runs its job alone. After fork() the child starts a fresh pool.
#pragma once

#include <immintrin.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace ab_pool {

// Wait until ready(): spin a little, then yield the core between checks (on a busy machine the thread we wait
// for may need the very core we would spin on).
template <class Ready>
inline void wait_until(Ready ready) {
  for (int i = 0; i < 256; ++i) {
    if (ready()) return;
    _mm_pause();
  }
  while (!ready()) std::this_thread::yield();
}

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // leaked on purpose: helpers never outlive it
    if (pool->pid_ != getpid()) pool = new Pool();  // a forked child: the parent's helpers do not exist here
    return *pool;
  }

  // Returns the number of helpers that ran the job (0 when it ran alone).
  int64_t run(int64_t helpers, const std::function<void()>& job) {
    if (helpers <= 0 || in_helper() || !busy_.try_lock()) {
      job();
      return 0;
    }
    std::lock_guard<std::mutex> hold(busy_, std::adopt_lock);
    grow(helpers);
    job_ = &job;
    entered_.store(0);
    wanted_.store(helpers);
    open_.store(true);
    epoch_.fetch_add(1);
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> lock(mutex_); }
      wake_.notify_all();
    }
    job();
    open_.store(false);
    wait_until([&] { return active_.load() == 0; });
    const int64_t ran = entered_.load();
    return ran < helpers ? ran : helpers;
  }

 private:
  Pool() : pid_(getpid()) {}

  static bool& in_helper() {
    static thread_local bool flag = false;
    return flag;
  }

  void grow(int64_t helpers) {
    while (int64_t(started_) < helpers) {
      std::thread([this] { loop(); }).detach();
      ++started_;
    }
  }

  void loop() {
    in_helper() = true;
    uint64_t seen = epoch_.load();
    for (;;) {
      uint64_t now = epoch_.load();
      if (now == seen) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
        while ((now = epoch_.load()) == seen) {
          for (int i = 0; i < 64 && epoch_.load(std::memory_order_relaxed) == seen; ++i) _mm_pause();
          if (std::chrono::steady_clock::now() > until) break;
          std::this_thread::yield();  // spinning, but never in the way of a runnable thread
        }
        if (now == seen) {
          std::unique_lock<std::mutex> lock(mutex_);
          sleepers_.fetch_add(1);
          wake_.wait(lock, [&] { return epoch_.load() != seen; });
          sleepers_.fetch_sub(1);
          continue;
        }
      }
      seen = now;
      active_.fetch_add(1);
      if (open_.load() && epoch_.load() == now && entered_.fetch_add(1) < wanted_.load()) (*job_)();
      active_.fetch_sub(1);
    }
  }

  const pid_t pid_;
  std::mutex busy_, mutex_;
  std::condition_variable wake_;
  int64_t started_ = 0;
  const std::function<void()>* job_ = nullptr;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int64_t> active_{0}, entered_{0}, wanted_{0}, sleepers_{0};
  std::atomic<bool> open_{false};
};

}  // namespace ab_pool

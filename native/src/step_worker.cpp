// The GIL-free hand-off of decode steps (step_worker.h).
#include "step_worker.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace cairn {

StepWorker::StepWorker() {
  fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(std::string("StepWorker: eventfd failed: ") + std::strerror(errno));
}

StepWorker::~StepWorker() { close(fd_); }

void StepWorker::post_job(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (job_ || running_) throw std::logic_error("StepWorker: a step is already posted (calls are one at a time)");
    job_ = std::move(job);
  }
  cv_.notify_one();
}

void StepWorker::post_python() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++python_;
  }
  cv_.notify_one();
}

bool StepWorker::serve(double idle_s) {
  const auto idle = std::chrono::duration<double>(idle_s);
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (!cv_.wait_for(lk, idle, [&] { return job_ || python_ > 0; })) return false;
    if (job_) {  // a step first: a Python call posted meanwhile is a later one (the callers serialise)
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      running_ = true;
      lk.unlock();
      job();  // never throws: the binding's job keeps its exception for `collect`
      job = nullptr;
      lk.lock();
      running_ = false;
      done_cv_.notify_all();
      const uint64_t one = 1;
      // An eventfd write only fails when its counter would overflow, which one job at a time cannot.
      while (write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
      }
      continue;
    }
    --python_;
    return true;
  }
}

bool StepWorker::take_done() {
  uint64_t n = 0;
  while (read(fd_, &n, sizeof n) < 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN) return false;  // not signalled (yet)
    throw std::runtime_error(std::string("StepWorker: eventfd read failed: ") + std::strerror(errno));
  }
  std::lock_guard<std::mutex> lk(mu_);  // orders the job's writes before the caller's reads
  return !job_ && !running_;
}

bool StepWorker::idle() {
  std::lock_guard<std::mutex> lk(mu_);
  return !job_ && !running_ && python_ == 0;
}

void StepWorker::wait_done() {
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return !job_ && !running_; });
}

}  // namespace cairn

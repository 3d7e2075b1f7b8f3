// A GIL-free hand-off of decode steps to the kernel thread (actors/engine/call_thread.py).
//
// Design notes
//  * The kernel thread is a Python thread that waits for work inside `serve` with the GIL released.
//    A decode step posted from the Trio thread (`post_job`) runs there at once, without the GIL:
//    its inputs were copied and its output allocated before it was posted, and it reports
//    completion on an eventfd the Trio thread awaits (trio.lowlevel.wait_readable). So a step never
//    waits for the event loop to let go of the GIL, neither to start nor to report back.
//  * Any other call (prefill, snapshot, ...) is Python's: `post_python` makes `serve` return, the
//    thread runs it with the GIL and comes back. One thread runs everything, so OpenMP keeps one
//    pool of workers (a second calling thread would get a second pool, spinning beside the first).
//  * One job at a time: the callers serialise (KernelRunner's lock).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>

namespace cairn {

class StepWorker {
 public:
  StepWorker();   // throws std::runtime_error when no eventfd can be made
  ~StepWorker();  // the caller makes sure no job is posted or running (the binding waits for it)
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  int fd() const { return fd_; }
  // Trio thread: run `job` in the thread serving (no GIL there); the eventfd becomes readable after it.
  void post_job(std::function<void()> job);
  // Trio thread: a Python call waits in the caller's queue: `serve` returns true once for it.
  void post_python();
  // Kernel thread, GIL released: run posted jobs until a Python call is posted (true) or idle_s pass
  // with nothing to do (false).
  bool serve(double idle_s);
  // Trio thread, once the eventfd was readable: consume the signal; whether the job has finished.
  bool take_done();
  // Nothing posted and nothing running.
  bool idle();
  // Block until the posted job (if any) finished (the binding's destructor, GIL released).
  void wait_done();

 private:
  int fd_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;       // the serving thread waits for work on it
  std::condition_variable done_cv_;  // wait_done waits on it
  std::function<void()> job_;        // posted, not yet taken
  bool running_ = false;             // taken, running
  int python_ = 0;                   // Python calls posted, not yet returned for
};

}  // namespace cairn

#include "work_pool.h"

#include <ATen/Parallel.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMP_PAUSE() _mm_pause()
#else
#define LLMP_PAUSE() ((void)0)
#endif

namespace llmp_native {
namespace {

constexpr int kSpinRounds = 1 << 14;  // a helper's busy wait for the next call (~100 µs) before it sleeps

class Pool {
public:
    explicit Pool(int helpers) {
        for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { serve(); });
    }

    ~Pool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_.store(true, std::memory_order_seq_cst);
            state_.fetch_add(uint64_t{1} << 32, std::memory_order_seq_cst);
        }
        wake_.notify_all();
        for (auto& thread : threads_) thread.join();
    }

    int helpers() const { return static_cast<int>(threads_.size()); }

    void run(int64_t chunks, const std::function<void(int64_t)>& fn) {
        job_.store(&fn, std::memory_order_relaxed);
        total_.store(chunks, std::memory_order_relaxed);
        done_.store(0, std::memory_order_relaxed);
        const uint64_t generation = (state_.load(std::memory_order_relaxed) >> 32) + 1;
        // a new generation, chunk 0 next; seq_cst with the sleepers' count (a helper going to sleep counts itself,
        // then reads the state: one of the two sees the other's write)
        state_.store(generation << 32, std::memory_order_seq_cst);
        if (sleepers_.load(std::memory_order_seq_cst) > 0) {
            std::lock_guard<std::mutex> lock(mutex_);
            wake_.notify_all();
        }
        const int64_t mine = work(generation, fn, chunks);
        // only chunks a helper claimed are waited for; unclaimed ones were all taken by the loop above
        while (done_.load(std::memory_order_acquire) + mine < chunks) LLMP_PAUSE();
        done_.store(0, std::memory_order_relaxed);
    }

private:
    // claims chunks of this generation until none is left; the number this thread ran
    int64_t work(uint64_t generation, const std::function<void(int64_t)>& fn, int64_t chunks) {
        int64_t ran = 0;
        uint64_t state = state_.load(std::memory_order_acquire);
        while ((state >> 32) == generation) {
            const int64_t index = static_cast<int64_t>(state & 0xffffffffu);
            if (index >= chunks) break;
            if (!state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) continue;
            fn(index);
            ++ran;
            state = state_.load(std::memory_order_acquire);
        }
        return ran;
    }

    void serve() {
        uint64_t seen = state_.load(std::memory_order_acquire) >> 32;
        for (;;) {
            uint64_t generation = state_.load(std::memory_order_acquire) >> 32;
            for (int spin = 0; generation == seen && spin < kSpinRounds; ++spin) {
                LLMP_PAUSE();
                generation = state_.load(std::memory_order_acquire) >> 32;
            }
            if (generation == seen) {
                std::unique_lock<std::mutex> lock(mutex_);
                sleepers_.fetch_add(1, std::memory_order_seq_cst);
                // stopping too: a helper that starts after its pool is already being destroyed saw the last
                // generation as its first and would wait for one that never comes
                wake_.wait(lock, [&] {
                    return stopping_.load(std::memory_order_seq_cst) ||
                           (state_.load(std::memory_order_seq_cst) >> 32) != seen;
                });
                sleepers_.fetch_sub(1, std::memory_order_seq_cst);
                generation = state_.load(std::memory_order_acquire) >> 32;
            }
            if (stopping_.load(std::memory_order_seq_cst)) return;
            seen = generation;
            // the job of this generation: written before the generation was published; if the caller has moved
            // on meanwhile, the claim in work() fails on the generation and the stale pointer is never called
            const auto* fn = job_.load(std::memory_order_relaxed);
            const int64_t chunks = total_.load(std::memory_order_relaxed);
            const int64_t ran = work(generation, *fn, chunks);
            if (ran > 0) done_.fetch_add(ran, std::memory_order_acq_rel);
        }
    }

    std::vector<std::thread> threads_;
    std::atomic<uint64_t> state_{0};  // generation << 32 | next chunk
    std::atomic<const std::function<void(int64_t)>*> job_{nullptr};
    std::atomic<int64_t> total_{0}, done_{0};
    std::atomic<int> sleepers_{0};
    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<bool> stopping_{false};
};

std::mutex pool_mutex;  // one call at a time shares the pool; a concurrent caller runs its chunks alone
std::unique_ptr<Pool> pool;

void forget_pool_after_fork() { pool.release(); }  // the child has no helper threads: never join them

}  // namespace

void run_chunks(int64_t chunks, const std::function<void(int64_t)>& fn, int threads) {
    if (threads <= 0) threads = at::get_num_threads();
    const int helpers = static_cast<int>(std::min<int64_t>(threads, chunks)) - 1;
    std::unique_lock<std::mutex> lock(pool_mutex, std::try_to_lock);
    if (helpers <= 0 || !lock.owns_lock()) {
        for (int64_t i = 0; i < chunks; ++i) fn(i);
        return;
    }
    static const bool registered = [] { return pthread_atfork(nullptr, nullptr, forget_pool_after_fork) == 0; }();
    (void)registered;
    const int wanted = std::max(1, threads - 1);
    if (!pool || pool->helpers() != wanted) {
        pool.reset();
        pool = std::make_unique<Pool>(wanted);
    }
    pool->run(chunks, fn);
}

const char* work_sharing() { return "pool"; }

}  // namespace llmp_native

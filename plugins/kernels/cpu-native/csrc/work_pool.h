// Work sharing that degrades gracefully when the cores are shared (llmp_native::run_chunks).
//
// at::parallel_for hands each of torch's OpenMP threads a fixed share and ends with a barrier: when another
// process holds a core, the whole call waits for the descheduled thread's turn (a scheduler slice, milliseconds),
// and the other threads spin meanwhile. On 2 cores with one competing process a step then ran ~2.8x slower
// instead of ~2x. Here the calling thread and the pool's helpers claim chunks one at a time from a shared
// counter, and the caller waits only for chunks a helper has claimed: a helper that is not running when a call
// starts simply finds no work left. A chunk is computed whole by whichever thread claims it, so results never
// depend on who ran what (kernels split work by output rows or columns, never the inner dimension).
#pragma once

#include <cstdint>
#include <functional>

namespace llmp_native {

constexpr int64_t kChunksPerThread = 4;  // chunks a call is cut into per thread: a late thread leaves less undone

// fn(chunk) for every chunk in [0, chunks), on the calling thread and up to threads - 1 helpers (threads:
// torch's count, at::get_num_threads(), unless given); returns when every chunk is done. Exceptions are not
// allowed out of fn (kernels check their arguments before).
void run_chunks(int64_t chunks, const std::function<void(int64_t)>& fn, int threads = 0);

// "pool": what run_chunks runs on (the start-up line names it next to the ISA)
const char* work_sharing();

}  // namespace llmp_native
